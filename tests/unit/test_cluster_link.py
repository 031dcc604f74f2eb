"""How a link classifies a failed connection attempt, with real sockets on loopback:
a closed port refuses (the peer's process has ended), a listener that accepts and
drops the connection is a reset (a process being killed), neither is the other; and
and how a lane writes its messages, over a socket pair."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from types import SimpleNamespace

import aiormq

from brokerd.cluster.link import Lane, Link, is_refused, is_reset
from brokerd.cluster.messages import CLUSTER_EXCHANGE
from brokerd.wire.codec import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_METHOD,
    decode_publish,
    split_frames,
)
from tests.brokerd_process import free_port


def link_to(port: int) -> Link:
    return Link(
        f"127.0.0.1:{port}",
        user="cluster",
        secret="secret",
        vhost="/",
        identity=dict,
        on_up=lambda link: None,
        on_down=lambda link, reason: None,
    )


async def attempt(port: int) -> BaseException:
    link = link_to(port)
    link.connect_timeout = 2.0
    try:
        await link._connect()
    except Exception as exc:
        return exc
    raise AssertionError("connected to nothing")


async def test_a_port_nobody_listens_on_refuses() -> None:
    exc = await attempt(free_port())
    assert is_refused(exc) and not is_reset(exc), repr(exc)


async def test_a_listener_that_drops_connections_is_a_reset_not_a_refusal() -> None:
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()  # RST, as a process being killed does

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        exc = await attempt(port)
    finally:
        server.close()
        await server.wait_closed()
    assert is_reset(exc) and not is_refused(exc), repr(exc)


def test_wrapped_causes_count_and_other_errors_do_not() -> None:
    def wrapped(cause: BaseException) -> BaseException:
        try:
            try:
                raise cause
            except OSError as exc:
                raise aiormq.exceptions.AMQPConnectionError("wrapped") from exc
        except aiormq.exceptions.AMQPConnectionError as outer:
            return outer

    assert is_refused(wrapped(ConnectionRefusedError(111, "refused")))
    assert is_reset(wrapped(ConnectionResetError(104, "reset")))
    timeout = wrapped(TimeoutError("timed out"))
    assert not is_refused(timeout) and not is_reset(timeout)


# -- a lane's writes, over a real socket pair (``link.Lane``) -------------------------


class _Channel:
    """What a lane needs of aiormq's channel: its number and its connection's tune."""

    def __init__(self, number: int, frame_max: int) -> None:
        self.number = number
        self.connection = SimpleNamespace(connection_tune=SimpleNamespace(frame_max=frame_max))


async def _lane_over_socketpair(frame_max: int) -> tuple[Lane, socket.socket]:
    ours, theirs = socket.socketpair()
    _reader, writer = await asyncio.open_unix_connection(sock=ours)
    lane = Lane("data")
    lane.writer = writer
    lane.opened(_Channel(3, frame_max))  # type: ignore[arg-type]
    return lane, theirs


def _read_frames(sock: socket.socket, frame_max: int) -> list[tuple[int, int, bytes]]:
    sock.setblocking(False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := sock.recv(1 << 20):
            data += chunk
    frames, used = split_frames(data, 0, frame_max)
    assert used == len(data), "a frame was cut short"
    return frames


async def test_a_lane_writes_each_message_as_one_publish_in_order_at_once() -> None:
    """Posted messages are on the socket when ``write`` returns (no task, no loop
    turn), each a basic.publish on the lane's channel with its body cut to frame_max."""
    lane, peer = await _lane_over_socketpair(frame_max=4096)
    big = bytes(range(256)) * 40  # 10,240 bytes: three body frames
    assert lane.write("cluster.data", b"first")
    assert lane.write("cluster.status", big)
    frames = _read_frames(peer, 4096)
    methods = [decode_publish(p) for t, _, p in frames if t == FRAME_METHOD]
    assert methods == [
        (CLUSTER_EXCHANGE, "cluster.data", False, False),
        (CLUSTER_EXCHANGE, "cluster.status", False, False),
    ]
    assert {channel for _, channel, _ in frames} == {3}
    bodies: list[bytes] = []
    for kind, _, payload in frames:
        if kind == FRAME_HEADER:
            bodies.append(b"")
        elif kind == FRAME_BODY:
            assert len(payload) <= 4096 - 8
            bodies[-1] += payload
    assert bodies == [b"first", big]
    assert lane.sent == 5 + len(big)
    peer.close()


async def test_a_peer_that_does_not_read_shows_as_backlog_and_a_closed_lane_refuses() -> None:
    lane, peer = await _lane_over_socketpair(frame_max=131072)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    for _ in range(64):
        assert lane.write("cluster.data", b"x" * 65536)
    assert lane.backlog > 1_000_000  # what the kernel did not take waits in the transport
    assert lane.writer is not None
    lane.writer.close()
    assert not lane.write("cluster.data", b"late")
    lane.clear()
    assert lane.backlog == 0 and not lane.write("cluster.data", b"later")
    peer.close()


async def test_a_post_on_a_closing_lane_drops_the_link_and_later_posts_are_refused() -> None:
    """A lane whose transport is closing takes no message: the link goes down (its
    planes treat that as a lost session) instead of writing into a dead socket."""
    lane, peer = await _lane_over_socketpair(frame_max=4096)
    downs: list[str] = []
    link = link_to(1)
    link.on_down = lambda _link, reason: downs.append(reason)
    link.data = lane
    link.state = "up"
    assert link.post("cluster.data", b"one") and link.backlog == 0
    assert lane.writer is not None
    lane.writer.close()
    assert not link.post("cluster.data", b"two")
    assert not link.up and downs == ["data lane: its connection is closing"]
    assert not link.post("cluster.data", b"three")  # down: dropped
    peer.close()


def test_lanes_ask_for_a_heartbeat_of_twice_the_cluster_timeout() -> None:
    from brokerd.cluster.link import link_heartbeat

    assert [link_heartbeat(t) for t in (0.3, 1.0, 1.2, 3.0)] == [2, 2, 3, 6]

    def noop(*_: object) -> None:
        return None

    def make(heartbeat: int) -> Link:
        return Link(
            "10.0.0.1:5672",
            user="cluster",
            secret="s",
            vhost="/",
            identity=dict,
            on_up=noop,
            on_down=noop,
            heartbeat=heartbeat,
        )

    assert make(6).url.endswith("/%2F?heartbeat=6")
    assert "heartbeat" not in make(0).url  # aiormq's default then
