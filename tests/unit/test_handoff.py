"""The hand-over socket between a host's workers (``brokerd/server/handoff.py``), with
real Unix sockets and a real TCP socket to pass: the taker serves a connection only
after the giver's commit, and closes its copy unread otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from pathlib import Path
from typing import Any

import pytest

from brokerd.protocol.moving import MoveError
from brokerd.server.handoff import HandoffListener


class Taker:
    """``adopt`` as the server's: refuses the user "nobody", else records the start."""

    def __init__(self) -> None:
        self.offered: list[dict[str, Any]] = []
        self.started: list[socket.socket] = []

    def adopt(self, state: dict[str, Any], sock: socket.socket) -> Any:
        if state["user"] == "nobody":
            raise MoveError("no such user here")
        self.offered.append(state)

        async def start() -> None:
            self.started.append(sock)

        return start


async def offer(
    path: Path, state: dict[str, Any], commit: bytes | None
) -> tuple[bytes, socket.socket]:
    """Hand a fresh TCP connection's socket to ``path``; returns the taker's answer and
    the client end (to see whether the taker kept its copy)."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    server.close()
    loop = asyncio.get_running_loop()
    giver = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    giver.setblocking(False)
    await loop.sock_connect(giver, str(path))
    body = json.dumps(state).encode()
    socket.send_fds(giver, [struct.pack("!I", len(body)) + body], [accepted.fileno()])
    accepted.close()  # the giver's own descriptor: the taker holds a copy (or closed it)
    answer = await asyncio.wait_for(loop.sock_recv(giver, 1), 5)
    if commit is not None:
        with contextlib.suppress(OSError):  # a taker that refused has hung up
            await loop.sock_sendall(giver, commit)
    giver.close()
    await asyncio.sleep(0.1)
    return answer, client


@pytest.fixture
async def taker(tmp_path: Path) -> Any:
    t = Taker()
    listener = HandoffListener(tmp_path / "worker-1.handoff", t.adopt)
    await listener.start()
    assert oct((tmp_path / "worker-1.handoff").stat().st_mode & 0o777) == "0o600"
    yield t, listener
    await listener.stop()


async def test_the_taker_serves_the_socket_only_after_the_commit(taker: Any) -> None:
    t, listener = taker
    answer, client = await offer(listener.path, {"user": "guest", "vhost": "/"}, b"G")
    assert answer == b"R" and len(t.started) == 1 and listener.taken == 1
    t.started[0].sendall(b"hello")  # the taker's copy is the connection now
    assert client.recv(5) == b"hello"
    client.close()
    t.started[0].close()


async def test_without_the_commit_the_taker_lets_its_copy_go_unread(taker: Any) -> None:
    t, listener = taker
    answer, client = await offer(listener.path, {"user": "guest", "vhost": "/"}, None)
    assert answer == b"R" and t.offered and not t.started and listener.taken == 0
    client.settimeout(2)
    assert client.recv(1) == b""  # every descriptor of the server end is closed
    client.close()


async def test_a_refused_snapshot_is_answered_n(taker: Any) -> None:
    t, listener = taker
    answer, client = await offer(listener.path, {"user": "nobody", "vhost": "/"}, b"G")
    assert answer == b"N" and not t.started
    client.close()


async def test_a_giver_that_sends_no_socket_is_refused(taker: Any) -> None:
    _t, listener = taker
    loop = asyncio.get_running_loop()
    giver = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    giver.setblocking(False)
    await loop.sock_connect(giver, str(listener.path))
    body = b'{"user": "guest", "vhost": "/"}'
    await loop.sock_sendall(giver, struct.pack("!I", len(body)) + body)
    assert await asyncio.wait_for(loop.sock_recv(giver, 1), 5) == b"N"
    giver.close()
