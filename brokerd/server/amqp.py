"""One asyncio Protocol per client connection: bytes to the machine and back.

Reading stops for any of several reasons at once (``_holds``): a login being
checked, a blocked publisher, flow control, and the per-turn read budget.
The budget keeps one loop turn short: libuv reads a busy socket up to 32
times per turn, so a few publishers could feed the loop megabytes in one
turn while statuses and every other connection wait; past ``READ_BUDGET``
bytes in a turn a connection is read again next turn."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.protocol import Connection, ConnectionState
from brokerd.protocol.handshake import LoginCheck
from brokerd.server.resources import CHECK_EVERY_BYTES
from brokerd.tls import TLSSettings, peer_certificate

if TYPE_CHECKING:
    from brokerd.model.broker import Broker
    from brokerd.protocol.hooks import ConnectionHooks
    from brokerd.protocol.moving import Mover
    from brokerd.server.login import LoginService
    from brokerd.server.resources import ResourceMonitor

log = logging.getLogger("brokerd.server")

#: transport buffer above which deliveries to that connection pause, and below
#: which they resume
WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_LOW_WATER = 1024 * 1024
#: bytes one connection may feed the machine per loop turn before it waits a turn
READ_BUDGET = 64 * 1024


class AMQPHost(Protocol):
    """What a client connection's Protocol needs of the server
    (``brokerd.server.app.Server``)."""

    @property
    def broker(self) -> Broker: ...

    @property
    def hooks(self) -> ConnectionHooks | None:
        """The cluster's connection hooks; None for a standalone server."""
        ...

    @property
    def connections(self) -> MutableMapping[int, AMQPProtocol]:
        """Open client connections by id: each registers itself and leaves."""
        ...

    @property
    def logins(self) -> LoginService: ...

    @property
    def mover(self) -> Mover | None:
        """Where a client connection moves at its first consume or publish (a worker
        of ``brokerd --workers``: its siblings); None: connections stay."""
        ...

    @property
    def resources(self) -> ResourceMonitor:
        """Counts the bytes read (``received``) and checks memory on a fast flood."""
        ...

    @property
    def blocked_reason(self) -> str | None: ...

    def server_properties(self) -> dict[str, Any]: ...

    @property
    def tls_settings(self) -> TLSSettings | None:
        """The TLS listener's settings (how a certificate names its user)."""
        ...


class AMQPProtocol(asyncio.Protocol):
    """One client connection's socket around its machine. ``moved_in``: the snapshot
    of a connection a sibling worker handed over (``handoff.py``), restored here
    instead of a handshake."""

    def __init__(self, server: AMQPHost, moved_in: dict[str, Any] | None = None) -> None:
        self.server = server
        self._moved_in = moved_in
        self._moving: asyncio.Task[None] | None = None
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.machine: Connection | None = None
        self._flush_scheduled = False
        #: why reading is paused: "login", "blocked", "flow", "budget" (none: reading)
        self._holds: set[str] = set()
        #: bytes received this loop turn (the read budget)
        self._turn_bytes = 0
        self._opened = False
        self._login_task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.transport.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, str | bytes):  # a sibling worker's link, on a Unix socket
            peer = ("unix", 0)
        elif not peer:
            peer = ("?", 0)
        ssl_object = transport.get_extra_info("ssl_object")
        self.machine = Connection(
            self.server.broker,
            (str(peer[0]), int(peer[1])),
            on_output=self._schedule_flush,
            server_properties=self.server.server_properties(),
            hooks=self.server.hooks,
            on_login=self._on_login,
            tls=ssl_object is not None,
            peer_certificate=peer_certificate(ssl_object, self.server.tls_settings),
            mover=None if ssl_object is not None else self.server.mover,
        )
        self.server.connections[self.machine.id] = self
        if self._moved_in is not None:
            state, self._moved_in = self._moved_in, None
            pending = self.machine.restore(state)  # checked before the giver let go
            self.data_received(pending)  # before anything read from the socket here

    def _on_login(self, check: LoginCheck) -> None:
        """The machine asks for a password check: run it off the loop, feed the answer back.

        A peer that has not logged in yet is not read meanwhile (as RabbitMQ, whose
        reader authenticates before reading on): what it pipelines waits in the
        socket, so it can never buffer more here than ``max_unauthenticated_bytes``."""
        if check.kind == "login":
            self._hold("login")
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
        self._release("login")
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

    def _hold(self, why: str) -> None:
        if why in self._holds:
            return
        self._holds.add(why)
        transport = self.transport
        if len(self._holds) == 1 and transport is not None and not transport.is_closing():
            transport.pause_reading()

    def _release(self, why: str) -> None:
        if why not in self._holds:
            return
        self._holds.discard(why)
        if not self._holds and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    @property
    def flow_paused(self) -> bool:
        return "flow" in self._holds

    @property
    def holds(self) -> frozenset[str]:
        """Why reading is stopped now (empty: it is not): the state dump shows it."""
        return frozenset(self._holds)

    def _next_turn(self) -> None:
        self._turn_bytes = 0
        self._release("budget")

    def data_received(self, data: bytes) -> None:
        machine = self.machine
        assert machine is not None
        if not self._turn_bytes:
            self.loop.call_soon(self._next_turn)
        self._turn_bytes += len(data)
        if self._turn_bytes > READ_BUDGET:
            self._hold("budget")  # this turn has had its share: read again next turn
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
        elif machine.moving_to is not None and self._moving is None:
            self._hold("move")  # the socket may be another worker's in a moment
            self._moving = self.loop.create_task(self._move(machine.moving_to))

    async def _move(self, path: Any) -> None:
        """Hand the socket to the sibling at ``path``; answer here if it cannot be."""
        from brokerd.server.handoff import give

        machine = self.machine
        assert machine is not None
        try:
            moved = await give(self, path)
        except Exception:
            log.exception("hand-over failed conn=%d", machine.id)
            moved = False
        transport = self.transport
        if transport is None:
            return
        if moved:
            machine.left()
            self.server.connections.pop(machine.id, None)
            transport.abort()  # closes this worker's descriptor only: the sibling has its own
            return
        self._moving = None
        self._release("move")
        machine.stay()
        self._check_blocked(machine)
        self.flush()

    def _check_blocked(self, machine: Connection) -> None:
        if not self._opened and machine.state is ConnectionState.OPEN:
            self._opened = True
            reason = self.server.blocked_reason
            if reason is not None and not machine.cluster_link:
                machine.set_blocked(reason)  # opened while publishers are blocked
        if machine.read_paused:
            self._hold("blocked")  # blocked: a publisher waits, unread

    def set_blocked(self, reason: str | None) -> None:
        """Block (or unblock) this connection's publishing; reading resumes with it."""
        machine = self.machine
        if machine is None:
            return
        machine.set_blocked(reason)
        if reason is None:
            self._release("blocked")
        self.flush()

    def set_flow(self, paused: bool) -> None:
        """Flow control: stop (or resume) reading this connection. Unlike a block
        nothing is said to the client, as RabbitMQ's credit flow says nothing: it
        is transient, and the client just finds its writes slowed by TCP."""
        if paused:
            self._hold("flow")
        else:
            self._release("flow")

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
        if self._holds:
            # not reading it is our choice (flow control, a move): what it sends waits
            # in the socket, its heartbeats too, and its silence says nothing
            machine.last_received = now
        machine.tick(now)
        if machine.closed:
            self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._moving is not None and not self._moving.done():
            self._moving.cancel()
        if self._login_task is not None:
            self._login_task.cancel()
            self._login_task = None
        if self.machine is not None:
            self.machine.connection_lost()
            self.server.connections.pop(self.machine.id, None)
        self.transport = None
