"""One asyncio Protocol per client connection: bytes to the machine and back."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from brokerd.protocol import Connection, ConnectionState
from brokerd.protocol.handshake import LoginCheck
from brokerd.server.resources import CHECK_EVERY_BYTES

if TYPE_CHECKING:
    from brokerd.server.app import Server

#: transport buffer above which deliveries to that connection pause
log = logging.getLogger("brokerd.server")

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
        self._login_paused = False
        self._opened = False
        self._login_task: asyncio.Task[None] | None = None

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
            on_login=self._on_login,
        )
        self.server.connections[self.machine.id] = self

    def _on_login(self, check: LoginCheck) -> None:
        """The machine asks for a password check: run it off the loop, feed the answer back.

        A peer that has not logged in yet is not read meanwhile (as RabbitMQ, whose
        reader authenticates before reading on): what it pipelines waits in the
        socket, so it can never buffer more here than ``max_unauthenticated_bytes``."""
        if check.kind == "login" and self.transport is not None and not self._login_paused:
            self._login_paused = True
            self.transport.pause_reading()
        self._login_task = self.loop.create_task(self._login(check))

    async def _login(self, check: LoginCheck) -> None:
        machine = self.machine
        assert machine is not None
        try:
            user, reason = await self.server.logins.check(check)
        except Exception as exc:  # a broken hash in the config: refuse, keep serving
            user, reason = None, f"password check failed: {type(exc).__name__}: {exc}"
        self._login_task = None
        if self.transport is None:
            return
        machine.complete_login(check, user, reason)
        if self._login_paused:
            self._login_paused = False
            if not self._reading_paused and not self.transport.is_closing():
                self.transport.resume_reading()
        self._check_blocked(machine)
        self.flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        machine, transport = self.machine, self.transport
        if machine is None or transport is None or transport.is_closing():
            return
        buffers = machine.output_buffers()
        if len(buffers) == 1:
            transport.write(buffers[0])
        elif buffers:
            transport.writelines(buffers)  # a large body's views: sent, never joined
        if machine.closed:
            transport.close()

    def data_received(self, data: bytes) -> None:
        machine = self.machine
        assert machine is not None
        resources = self.server.resources
        resources.received += len(data)
        if resources.received >= CHECK_EVERY_BYTES:
            resources.check_memory()  # a fast flood: do not wait for the timer
        try:
            machine.receive_data(data)
        except Exception:  # the machine catches per frame; this is the last line
            log.exception("internal error conn=%d peer=%s (receive)", machine.id, machine.name)
            machine.internal_error()
        self._check_blocked(machine)
        if machine.closed:
            self.flush()

    def _check_blocked(self, machine: Connection) -> None:
        if not self._opened and machine.state is ConnectionState.OPEN:
            self._opened = True
            reason = self.server.blocked_reason
            if reason is not None and not machine.cluster_link:
                machine.set_blocked(reason)  # opened while publishers are blocked
        if machine.read_paused and not self._reading_paused and self.transport is not None:
            self._reading_paused = True  # blocked: a publisher waits, unread
            self.transport.pause_reading()

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
        if self._login_task is not None:
            self._login_task.cancel()
            self._login_task = None
        if self.machine is not None:
            self.machine.connection_lost()
            self.server.connections.pop(self.machine.id, None)
        self.transport = None
