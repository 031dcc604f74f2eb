"""A client connection handed to the sibling worker that holds its queues.

The machine decides *when* a connection may move (``brokerd/protocol/moving.py``:
its first consume or publish, while it is quiet); this module decides *where*
(``Mover``: the one sibling that owns every queue the method names) and carries
the socket there. Each worker of a host listens on ``DATA_DIR/host/worker-K.handoff``
(0600, in the host's 0700 directory). A hand-over is one connection to it:

1. the giver sends a 4-byte length and the JSON snapshot, with the client's
   socket attached (``SCM_RIGHTS``) to the first bytes;
2. the taker answers ``R`` once it can take the connection (its user and vhost
   exist here), ``N`` if not;
3. the giver answers ``G``: from then on it never touches the socket again, and
   the taker answers the waiting frames, then reads on.

Until ``G`` the client's socket is the giver's alone: if the taker refuses,
dies or is slow (``HANDOFF_TIMEOUT``), the giver answers the waiting frames
itself and the taker closes its copy of the socket unread. The giver stops
reading the socket while this happens and sends nothing on it; what it had
written is in the kernel's buffer first, so the client sees its answers in
order. TLS connections never move (their session is this process's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.cluster.config import UNIX_SCHEME
from brokerd.cluster.operations import address_of
from brokerd.model.exchange import Exchange
from brokerd.model.message import Message
from brokerd.protocol.moving import MoveError

if TYPE_CHECKING:
    from brokerd.protocol.connection import Connection
    from brokerd.server.amqp import AMQPProtocol

log = logging.getLogger("brokerd.server.handoff")

#: a hand-over that has not ended by then is called off (the giver keeps the client)
HANDOFF_TIMEOUT = 1.0
#: the largest snapshot taken (its frames waiting and the bytes read after them)
MAX_STATE = 4 * 1024 * 1024
#: how long the giver waits for what it wrote to reach the kernel before it moves
FLUSH_WAIT = 0.5
#: how long the taker waits for the giver's commit after it said it can take the
#: connection (the giver sends it at once; only a stalled giver is this slow)
COMMIT_WAIT = 30.0
_LENGTH = struct.Struct("!I")
#: a snapshot's suffix: a worker's hand-over socket beside its link socket
SUFFIX = ".handoff"


def handoff_path(link_socket: Path) -> Path:
    return link_socket.with_suffix(SUFFIX)


class Mover:
    """Where a quiet connection goes: the sibling worker owning every queue its first
    consume or publish names, if that is not this worker (``protocol.moving.Mover``)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def destination(self, conn: Connection, channel: int, method: Method) -> Path | None:
        vhost = conn.vhost
        if isinstance(method, commands.Basic.Consume):
            name = method.queue or conn.channels[channel].last_queue or ""
            queue = vhost.queues.get(name)
            targets: list[Any] = [queue] if queue is not None else []
        elif isinstance(method, commands.Basic.Publish):
            exchange = vhost.exchanges.get(method.exchange)
            if exchange is None or exchange.type_name == "headers":
                return None  # headers route on properties, not read yet
            probe = Message(method.exchange, method.routing_key, b"\x00\x00", b"")
            targets = list(exchange.muxer.route(probe))
            if any(isinstance(t, Exchange) for t in targets):
                return None  # exchange-to-exchange: not worth following for a move
        else:
            return None
        owners = set()
        for target in targets:
            owner = getattr(target, "owner_spid", None)
            owners.add(owner() if owner is not None else None)
        if len(owners) != 1:
            return None
        owner = owners.pop()
        if owner is None or owner == self.cluster.spid:
            return None
        address = address_of(self.cluster, owner)
        group = getattr(self.cluster, "hostgroup", None)
        if group is not None:  # a host of a cluster: its siblings by their sockets
            address = group.socket_of(address) or ""
        if not address or not address.startswith(UNIX_SCHEME):
            return None  # another host's server: it stays here
        return handoff_path(Path(address[len(UNIX_SCHEME) :]))


# -- the giver ----------------------------------------------------------------------------


async def give(proto: AMQPProtocol, path: Path) -> bool:
    """Hand ``proto``'s socket to the worker listening at ``path``; True once it took
    it (the caller then lets the connection go without a word), False if the
    connection stays here."""
    machine, transport = proto.machine, proto.transport
    assert machine is not None and transport is not None
    loop = asyncio.get_running_loop()
    try:
        state = json.dumps(machine.snapshot()).encode()
    except MoveError as exc:
        log.info("conn=%d stays: %s", machine.id, exc)
        return False
    if len(state) > MAX_STATE:
        return False
    deadline = loop.time() + FLUSH_WAIT
    proto.flush()
    while transport.get_write_buffer_size() and loop.time() < deadline:
        await asyncio.sleep(0.002)  # its answers so far reach the kernel first
    raw = transport.get_extra_info("socket")
    if transport.get_write_buffer_size() or raw is None or transport.is_closing():
        return False
    fd = os.dup(raw.fileno())
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(HANDOFF_TIMEOUT):
            await loop.sock_connect(sock, str(path))
            message = _LENGTH.pack(len(state)) + state
            sent = await _send_with_fd(loop, sock, message, fd)
            await loop.sock_sendall(sock, message[sent:])
            answer = await loop.sock_recv(sock, 1)
    except (OSError, TimeoutError) as exc:
        log.info("conn=%d stays: hand-over to %s failed: %s", machine.id, path.name, exc)
        return False
    else:
        if answer != b"R":
            log.info("conn=%d stays: %s refused it (%r)", machine.id, path.name, answer)
            return False
        # the commit, outside the timeout: once G is written the sibling serves the
        # socket, so nothing may call the move off after it (one byte into a local
        # socket's empty buffer does not wait)
        try:
            await loop.sock_sendall(sock, b"G")
        except OSError as exc:
            log.info("conn=%d stays: %s went away (%s)", machine.id, path.name, exc)
            return False
        return True
    finally:
        os.close(fd)
        sock.close()


async def _send_with_fd(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, data: bytes, fd: int
) -> int:
    """Send the first bytes of ``data`` with ``fd`` attached; how many went."""
    while True:
        try:
            return socket.send_fds(sock, [data], [fd])
        except BlockingIOError:
            await _ready(loop, sock, write=True)


async def _ready(loop: asyncio.AbstractEventLoop, sock: socket.socket, write: bool = False) -> None:
    future = loop.create_future()
    fileno = sock.fileno()

    def ready() -> None:
        if not future.done():
            future.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fileno, ready)
    try:
        await future
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fileno)


# -- the taker ----------------------------------------------------------------------------


class HandoffListener:
    """This worker's hand-over socket: takes connections its siblings give it.

    ``adopt(state, sock)`` checks a snapshot and returns the function that starts
    serving it (after ``G``), or raises MoveError to refuse it."""

    def __init__(
        self,
        path: Path,
        adopt: Callable[[dict[str, Any], socket.socket], Callable[[], Awaitable[None]]],
    ) -> None:
        self.path = path
        self.adopt = adopt
        self._server: asyncio.AbstractServer | None = None
        self._listener: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._taking: set[asyncio.Task[None]] = set()
        self.taken = 0

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.path))
        finally:
            os.umask(old)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._task = asyncio.get_running_loop().create_task(self._accept())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._listener is not None:
            self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            conn, _ = await loop.sock_accept(self._listener)
            conn.setblocking(False)
            task = loop.create_task(self._take(conn))
            self._taking.add(task)
            task.add_done_callback(self._taking.discard)

    async def _take(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        client: socket.socket | None = None
        try:
            async with asyncio.timeout(HANDOFF_TIMEOUT):
                data, fds = await _recv_with_fds(loop, conn)
                if fds:
                    client = socket.socket(fileno=fds[0])
                    for extra in fds[1:]:
                        os.close(extra)
                while len(data) < _LENGTH.size:
                    data += await loop.sock_recv(conn, _LENGTH.size - len(data))
                (size,) = _LENGTH.unpack_from(data)
                if size > MAX_STATE or client is None:
                    raise MoveError("no socket, or a snapshot too large")
                body = bytearray(data[_LENGTH.size :])
                while len(body) < size:
                    chunk = await loop.sock_recv(conn, min(size - len(body), 1 << 20))
                    if not chunk:
                        raise MoveError("the giver went away")
                    body += chunk
                start = self.adopt(json.loads(body), client)
                await loop.sock_sendall(conn, b"R")
            # the giver answers at once; it may have called the move off meanwhile
            # (its own timeout): then it closes this connection, read as a refusal
            async with asyncio.timeout(COMMIT_WAIT):
                if await loop.sock_recv(conn, 1) != b"G":
                    raise MoveError("the giver kept the connection")
            owned, client = client, None  # the connection's now: its transport owns it
            try:
                await start()
            except Exception:
                log.exception("could not serve a connection handed over")
                owned.close()
                return
            self.taken += 1
        except (MoveError, OSError, TimeoutError, ValueError, KeyError) as exc:
            log.info("hand-over refused: %s", exc)
            with contextlib.suppress(OSError):
                await loop.sock_sendall(conn, b"N")
        finally:
            conn.close()
            if client is not None:
                client.close()


async def _recv_with_fds(
    loop: asyncio.AbstractEventLoop, sock: socket.socket
) -> tuple[bytes, list[int]]:
    """The first bytes of a hand-over and the descriptors that came with them."""
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 65536, 2)
        except BlockingIOError:
            await _ready(loop, sock)
            continue
        if not data:
            raise MoveError("the giver went away")
        return data, fds
