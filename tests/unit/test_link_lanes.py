"""A link lane's sender without sockets: what it drains after (``link.Lane``)."""

from __future__ import annotations

import asyncio
from typing import Any

from brokerd.cluster.link import Lane, Link


class _Channel:
    """Records each publish and whether it asked to wait for the transport."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bool]] = []

    async def basic_publish(self, body: bytes, *, wait: bool = True, **kwargs: Any) -> None:
        self.published.append((kwargs["routing_key"], wait))
        await asyncio.sleep(0)


def _link() -> Link:
    return Link(
        "127.0.0.1:1",
        user="u",
        secret="s",
        vhost="/",
        identity=dict,
        on_up=lambda link: None,
        on_down=lambda link, reason: None,
    )


async def _send(lane: Lane, kinds: list[str]) -> list[tuple[str, bool]]:
    link = _link()
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
