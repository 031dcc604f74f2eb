"""What the message plane needs of the links between servers: the link transport's
interface. A link today is a pair of AMQP connections over TCP or TLS
(``brokerd.cluster.link``); the workers of one host will use Unix sockets. The
plane only posts link messages to a peer and reads how much waits to leave."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Lane(Protocol):
    """One peer's link, as the plane posts to it."""

    #: bytes waiting to leave on its data lane (flow control reads it)
    @property
    def backlog(self) -> int: ...

    def post(self, kind: str, body: bytes, urgent: bool = False) -> bool:
        """Send one link message; ``urgent``: on the control lane. False: the link is
        down (what was posted is dropped)."""


class Links(Protocol):
    """This server's links, by peer."""

    @property
    def spid(self) -> str: ...

    def link_to(self, spid: str | None) -> Lane | None:
        """The peer's link while it is up, else None."""

    def is_active(self, spid: str) -> bool:
        """The peer's statuses arrive in time (a paused one keeps its link)."""


class Gate(Protocol):
    """Something a batch waits for before it leaves (a replication gate: deliveries
    must not reach a consumer's server before the replicas have their acquisition)."""

    @property
    def opened(self) -> bool: ...

    def on_open(self, callback: Callable[[], None]) -> None: ...
