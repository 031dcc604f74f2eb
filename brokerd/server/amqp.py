"""One asyncio Protocol per client connection: bytes to the machine and back."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from brokerd.protocol import Connection, ConnectionState

if TYPE_CHECKING:
    from brokerd.server.app import Server

#: transport buffer above which deliveries to that connection pause
WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024


class AMQPProtocol(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.machine: Connection | None = None
        self._flush_scheduled = False
        self._reading_paused = False
        self._opened = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.transport.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.machine = Connection(
            self.server.broker,
            (str(peer[0]), int(peer[1])),
            on_output=self._schedule_flush,
            server_properties=self.server.server_properties(),
            hooks=self.server.hooks,
        )
        self.server.connections[self.machine.id] = self

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        machine, transport = self.machine, self.transport
        if machine is None or transport is None or transport.is_closing():
            return
        data = machine.data_to_send()
        if data:
            transport.write(data)
        if machine.closed:
            transport.close()

    def data_received(self, data: bytes) -> None:
        machine = self.machine
        assert machine is not None
        machine.receive_data(data)
        if not self._opened and machine.state is ConnectionState.OPEN:
            self._opened = True
            reason = self.server.blocked_reason
            if reason is not None and not isinstance(
                machine.client_properties.get("rookery_link"), dict
            ):
                machine.set_blocked(reason)  # opened while publishers are blocked
        if machine.read_paused and not self._reading_paused and self.transport is not None:
            self._reading_paused = True  # blocked: a publisher waits, unread
            self.transport.pause_reading()
        if machine.closed:
            self.flush()

    def set_blocked(self, reason: str | None) -> None:
        """Block (or unblock) this connection's publishing; reading resumes with it."""
        machine = self.machine
        if machine is None:
            return
        machine.set_blocked(reason)
        if reason is None and self._reading_paused and self.transport is not None:
            self._reading_paused = False
            if not self.transport.is_closing():
                self.transport.resume_reading()
        self.flush()

    def pause_writing(self) -> None:
        if self.machine is not None:
            self.machine.pause_writing()

    def resume_writing(self) -> None:
        if self.machine is not None:
            self.machine.resume_writing()

    def tick(self, now: float) -> None:
        machine = self.machine
        if machine is None:
            return
        machine.tick(now)
        if machine.closed:
            self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.machine is not None:
            self.machine.connection_lost()
            self.server.connections.pop(self.machine.id, None)
        self.transport = None
