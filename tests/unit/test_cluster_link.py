"""How a link classifies a failed connection attempt, with real sockets on loopback:
a closed port refuses (the peer's process has ended), a listener that accepts and
drops the connection is a reset (a process being killed), neither is the other; and
what a lane's sender drains after, without sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq

from brokerd.cluster.link import Lane, Link, is_refused, is_reset
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


# -- a lane's sender, without sockets (``link.Lane``) -------------------------------


class _Channel:
    """Records each publish and whether it asked to wait for the transport."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bool]] = []

    async def basic_publish(self, body: bytes, *, wait: bool = True, **kwargs: Any) -> None:
        self.published.append((kwargs["routing_key"], wait))
        await asyncio.sleep(0)


async def _send(lane: Lane, kinds: list[str]) -> list[tuple[str, bool]]:
    link = link_to(1)  # never connected: the sender is driven by hand
    channel = _Channel()
    lane.amqp = channel  # type: ignore[assignment]
    for kind in kinds:
        lane.outbox.append((kind, b"x"))
        lane.backlog += 1
    lane.ready.set()
    sender = asyncio.ensure_future(link._send_loop(lane))
    for _ in range(50):
        await asyncio.sleep(0)
    sender.cancel()
    assert lane.backlog == 0 and not lane.outbox
    return channel.published


async def test_the_control_lane_drains_once_per_burst() -> None:
    """A drained publish costs loop turns: statuses queued behind acks must not pay
    them per message, or a loaded server's statuses leave seconds late."""
    published = await _send(Lane("control", drain_each=False), ["a", "b", "c", "status"])
    assert published == [("a", False), ("b", False), ("c", False), ("status", True)]


async def test_the_data_lane_drains_after_every_message() -> None:
    """The data lane's backlog is what flow control reads: each message waits for
    the transport, so a slow peer shows in the outbox."""
    published = await _send(Lane("data"), ["f1", "f2"])
    assert published == [("f1", True), ("f2", True)]
