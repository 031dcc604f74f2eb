"""Flow control: which connections are paused, and why (seed 001 "Flow control").

When a server cannot move publishes on as fast as they arrive (a forward
link's backlog, the root's unsettled forwards from it, a replica's lag, its
own event loop falling behind), it stops reading from the connections that
feed the backlog: RabbitMQ's credit flow, seed 001's "stop reading on all
connections while flow control condition exists". A paused client simply
is not read, as a memory alarm does, but without ``connection.blocked``:
flow is transient and per connection, an alarm is neither. Reading resumes
when the cause clears.

Each *cause* names what fell behind (``link:<spid>``, ``replication``,
``event-loop``) and pauses only its *feeders*: the local connections that
published into it lately, and the data lanes of peers whose forwards did.
A publisher to queues that are keeping up is not paused for another's sake;
nor is one that fed the path less than its share (``Feeders.past_share``):
a hot queue's publishers are paused, a trickle to another queue on the same
link goes on, unless the path is so far behind that everyone must wait.
A peer's data lane is paused by pausing its inbound connection here: the
peer's link then backs up and pauses its own publishers in turn, which is
how backpressure crosses servers. Control lanes are never paused.

This module is plain state; the server applies ``pause(conn, paused)`` to
transports (``brokerd.server.amqp``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

log = logging.getLogger("brokerd.cluster.plane.flow")

#: a feeder: a local connection id, or a peer's spid (its inbound data lane)
Feeder = int | str


def feeder(publisher: int | str) -> Feeder:
    """A message's feeder: its local connection, or the peer it was forwarded from
    (``publisher`` is then ``spid/connection``)."""
    return publisher if isinstance(publisher, int) else publisher.partition("/")[0]


class Feeders:
    """Who fed one path lately, and how many bytes each (cleared every window)."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent: dict[Feeder, int] = {}

    def add(self, feeder: Feeder, size: int) -> None:
        sent = self.sent
        sent[feeder] = sent.get(feeder, 0) + size

    def clear(self) -> None:
        self.sent.clear()

    def __iter__(self) -> Iterator[Feeder]:
        return iter(self.sent)

    def past_share(self) -> list[Feeder]:
        """The feeders that sent at least an even share of the bytes: the ones a
        backlog is mostly made of (every feeder, when they sent alike)."""
        sent = self.sent
        if not sent:
            return []
        share = sum(sent.values()) / len(sent)
        return [feeder for feeder, size in sent.items() if size >= share]

    @staticmethod
    def merged(*parts: Feeders) -> Feeders:
        merged = Feeders()
        for part in parts:
            for feeder, size in part.sent.items():
                merged.add(feeder, size)
        return merged


class FlowControl:
    """The causes in force and the connections each one pauses."""

    def __init__(
        self,
        pause: Callable[[int, bool], None] | None = None,
        data_lane: Callable[[str], int | None] | None = None,
    ) -> None:
        #: pauses (True) or resumes (False) reading from one connection
        self.pause = pause
        #: a peer's inbound data-lane connection
        self.data_lane = data_lane or (lambda _spid: None)
        #: cause -> why, in words
        self.causes: dict[str, str] = {}
        #: cause -> the connections it pauses
        self.held: dict[str, set[int]] = {}
        #: connection -> the causes pausing it
        self.paused: dict[int, set[str]] = {}
        #: how many times each cause came on (for the metrics)
        self.episodes: dict[str, int] = {}
        #: how many times each open connection was paused (the dump shows it)
        self.pauses: dict[int, int] = {}

    def _conn(self, feeder: Feeder) -> int | None:
        return feeder if isinstance(feeder, int) else self.data_lane(feeder)

    def hold(self, cause: str, reason: str, feeders: Iterable[Feeder]) -> None:
        """Pause ``feeders`` for ``cause`` (again: feeders seen since are added)."""
        if cause not in self.causes:
            self.episodes[cause] = self.episodes.get(cause, 0) + 1
            log.info("flow on cause=%s: %s", cause, reason)
        self.causes[cause] = reason
        held = self.held.setdefault(cause, set())
        for feeder in feeders:
            conn = self._conn(feeder)
            if conn is None or conn in held:
                continue
            held.add(conn)
            causes = self.paused.setdefault(conn, set())
            causes.add(cause)
            if len(causes) == 1:
                self.pauses[conn] = self.pauses.get(conn, 0) + 1
                if self.pause is not None:
                    self.pause(conn, True)

    def release(self, cause: str) -> None:
        """The cause cleared: resume what it alone paused."""
        if self.causes.pop(cause, None) is None:
            return
        log.info("flow off cause=%s", cause)
        for conn in self.held.pop(cause, set()):
            causes = self.paused.get(conn)
            if causes is None:
                continue
            causes.discard(cause)
            if not causes:
                del self.paused[conn]
                if self.pause is not None:
                    self.pause(conn, False)

    def forget(self, conn: int) -> None:
        """A connection closed: nothing is paused for it any more."""
        self.pauses.pop(conn, None)
        for cause in self.paused.pop(conn, ()):
            self.held.get(cause, set()).discard(conn)

    def held_by(self, conn: int) -> set[str]:
        return self.paused.get(conn, set())

    @property
    def active(self) -> bool:
        return bool(self.causes)

    def describe(self) -> dict[str, Any]:
        """Each cause in force, why, and how many connections it pauses."""
        return {
            cause: {"reason": reason, "paused": len(self.held.get(cause, ()))}
            for cause, reason in sorted(self.causes.items())
        }
