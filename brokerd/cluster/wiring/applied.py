"""Root only: a wiring change is answered once every server following the root
has applied it.

Without this a client could bind a queue through one server, get its
bind-ok, publish through another server that has not yet applied the
binding, and lose the message: RabbitMQ answers a bind once every node has
the binding, and so must a cluster whose clients' connections land on any
server (``brokerd --workers``: the kernel picks the worker). The root numbers
a change, broadcasts it with ``ack`` set, and holds the answer until each
follower has said ``cluster.applied`` for that number (or a later one),
until a follower is lost, or for at most ``limit`` seconds: a slow server
delays a client by one heartbeat timeout at worst, never forever, and then
catches up from the stream like any follower.

A follower is a server the root sent its whole state to (a sync) since it
became root: only those apply the stream, so only those are waited for.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("brokerd.cluster")


@dataclass
class Awaiting:
    """One ordered change whose answer waits for the followers' acknowledgements."""

    seq: int
    waiting: set[str]
    since: float
    answer: Callable[[], object] = field(repr=False)


class Acknowledgements:
    """The followers of this root, and the changes waiting for them."""

    def __init__(self, clock: Callable[[], float], limit: Callable[[], float]) -> None:
        self.clock = clock
        #: the longest a change waits for its acknowledgements (seconds)
        self.limit = limit
        self.followers: set[str] = set()
        self.awaiting: dict[int, Awaiting] = {}

    def follow(self, spid: str) -> None:
        """``spid`` took this root's state: it applies the stream from now on."""
        self.followers.add(spid)

    @property
    def wanted(self) -> bool:
        """A change ordered now has someone to wait for."""
        return bool(self.followers)

    def expect(self, seq: int, answer: Callable[[], object]) -> None:
        """Answer change ``seq`` once every follower has applied it."""
        if not self.followers:
            answer()
            return
        self.awaiting[seq] = Awaiting(seq, set(self.followers), self.clock(), answer)

    def applied(self, spid: str, seq: int) -> None:
        """``spid`` applied the stream up to ``seq`` (entries apply in order)."""
        for waiting in [a for a in self.awaiting.values() if a.seq <= seq]:
            waiting.waiting.discard(spid)
        self._answer_done()

    def lost(self, spid: str) -> None:
        """``spid`` is gone or went inactive: nothing waits for it any more, and it
        syncs again (and follows again) when it returns."""
        self.followers.discard(spid)
        for waiting in self.awaiting.values():
            waiting.waiting.discard(spid)
        self._answer_done()

    def expire(self) -> None:
        """Answer the changes that waited ``limit`` seconds: the slow followers will
        apply them from the stream, a moment after the client heard."""
        now, limit = self.clock(), self.limit()
        for seq, waiting in sorted(self.awaiting.items()):
            if now - waiting.since >= limit:
                log.info(
                    "state seq=%d answered without acknowledgements from %s",
                    seq,
                    ",".join(sorted(waiting.waiting)),
                )
                del self.awaiting[seq]
                waiting.answer()

    def release(self) -> None:
        """This server is root no more: answer everything waiting (it was ordered),
        and forget the followers (they follow the next root)."""
        self.followers.clear()
        for seq in sorted(self.awaiting):
            self.awaiting.pop(seq).answer()

    def _answer_done(self) -> None:
        for seq in sorted(self.awaiting):
            if not self.awaiting[seq].waiting:
                self.awaiting.pop(seq).answer()
