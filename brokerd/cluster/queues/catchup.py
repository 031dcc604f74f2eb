"""Catching up with the root before taking a peer's records for a queue not here.

The root orders every declare and sends it to each server on its own link, so a
peer can have applied a declare this server has not: a client declares a queue
through server A, the root places it on B, A hears of it first and forwards the
client's next publish (or proxies its consume, get, purge) to B before the
root's word reached B. Taken at once, that record finds no queue: the publish is
not routed (a mandatory one comes back), the consume fails with 404, although
to the client the queue was there (RabbitMQ's nodes would all know it).

So a record that names a queue this server lacks is held, with everything the
same peer sends after it on the same paths (forwards and the owner side's
records: their order is the peer's), and this server asks the root for a
barrier: its answer comes after everything the root ordered before it. Then the
held records are taken in order, a queue still missing handled as today. A
barrier covers only records received before it was asked; a later one naming a
missing queue waits for the next barrier. Held records are dropped with their
session (``drop``): the peer voids or resends them as it does for any record a
cut link took. A barrier not answered in ``WAIT`` seconds is given up on, so a
slow root delays a peer's records that long at most; their count is bounded by
the peer's own pacing (its unsettled forwards).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Container, Iterable
from typing import Any

from brokerd.cluster.plane import records as rec
from brokerd.cluster.plane.outbound import Outbound

log = logging.getLogger("brokerd.cluster.queues.catchup")

#: seconds a barrier may take before the records it holds are taken anyway
WAIT = 2.0

Handler = Callable[[Outbound, Any], None]
#: asks the root for a barrier; runs its argument once answered (or failed); False
#: when there is no root to ask (this server is the root, or follows none yet)
Barrier = Callable[[Callable[[], None]], bool]


def named_queues(spid: str, r: object) -> Iterable[str]:
    """The queues of this server a record needs (a relay target is another's)."""
    if isinstance(r, rec.Forward):
        return [name for owner, name in r.targets if not owner or owner == spid]
    if isinstance(r, rec.Consume | rec.Get | rec.Purge | rec.Stat):
        return (r.queue,)
    return ()


class CatchUp:
    """Holds a peer's records behind a barrier while they name a queue not here."""

    def __init__(
        self,
        spid: Callable[[], str],
        queues: Callable[[], Container[str]],
        clock: Callable[[], float],
    ) -> None:
        self.spid = spid
        #: the names of the queues here (the vhost's queues)
        self.queues = queues
        self.clock = clock
        #: set by the controller: the wiring's barrier (``WiringReplication.barrier``)
        self.barrier: Barrier | None = None
        #: per peer, its held records in order: (the barrier they need, out, record, handler)
        self.held: dict[str, deque[tuple[int, Outbound, Any, Handler]]] = {}
        #: barriers asked so far, and the last one answered (or given up on)
        self.asked = 0
        self.answered = 0
        self._since = 0.0
        self._releasing = False
        #: records held so far (a figure for tests and logs)
        self.holds = 0
        #: after a peer's held records were taken (the owner side's ``after_batch``)
        self.after: Callable[[Outbound], None] | None = None

    def wrap(self, handler: Handler) -> Handler:
        """``handler``, taking its records in turn with any held from the same peer."""

        def take(out: Outbound, r: Any) -> None:
            if self.held or self._missing(r):
                self.receive(out, r, handler)
            else:  # the common case, once per record: nothing held, every queue here
                handler(out, r)

        return take

    def wrap_forward(self, handler: Handler) -> Handler:
        """``wrap`` for forwards, the check inline: every forwarded publish passes here."""
        spid, queues, receive = self.spid, self.queues, self.receive

        def take(out: Outbound, r: rec.Forward) -> None:
            if not self.held:
                names = queues()
                for owner, name in r.targets:
                    if name not in names and (not owner or owner == spid()):
                        break  # a queue of this server not here
                else:
                    handler(out, r)
                    return
            receive(out, r, handler)

        return take

    def receive(self, out: Outbound, r: Any, handler: Handler) -> None:
        held = self.held.get(out.spid)
        need = self.asked + 1  # a barrier asked from now on covers it
        if held is not None:
            held.append((need, out, r, handler))
            return
        if self._missing(r) and self._ask():
            self.holds += 1
            log.info("records from %s wait for the root: a queue named is not here", out.spid)
            self.held[out.spid] = deque([(need, out, r, handler)])
            return
        handler(out, r)

    def drop(self, spid: str) -> None:
        """The session with ``spid`` ended: what it sent and is held goes with it."""
        held = self.held.pop(spid, None)
        if held:
            log.info("dropping %d records held from %s: the session ended", len(held), spid)

    def tick(self) -> None:
        """Give up on a barrier the root has not answered in ``WAIT`` seconds."""
        if self.asked > self.answered and self.clock() - self._since > WAIT:
            log.warning("the root did not answer a barrier in %.0f s: taking held records", WAIT)
            self._answer(self.asked)

    # -- inside -------------------------------------------------------------------------

    def _missing(self, r: Any) -> bool:
        queues = self.queues()
        return any(name not in queues for name in named_queues(self.spid(), r))

    def _ask(self) -> bool:
        """A barrier is under way (asked now, or earlier): False if none can be."""
        if self.asked > self.answered:
            return True
        barrier = self.barrier
        if barrier is None:
            return False
        number = self.asked + 1
        self.asked = number
        self._since = self.clock()
        if barrier(lambda: self._answer(number)) and self.answered < number:
            return True
        self.answered = number  # no root to ask: what is here is all there is
        return False

    def _answer(self, number: int) -> None:
        if number <= self.answered:
            return  # given up on already
        self.answered = number
        if self._releasing:
            return  # answered at once, within a release: its loop goes on
        self._releasing = True
        try:
            for spid in list(self.held):
                self._release(spid)
        finally:
            self._releasing = False

    def _release(self, spid: str) -> None:
        """Take the peer's records the answered barriers cover, then those after them
        that name no missing queue, up to one that does: it waits for a new barrier."""
        held = self.held.get(spid)
        taken: Outbound | None = None
        while held:
            need, out, r, handler = held[0]
            if need > self.answered and self._missing(r) and self._ask():
                break
            held.popleft()
            handler(out, r)
            taken = out
            held = self.held.get(spid)  # a handler may end the session (``drop``)
        if not held:
            self.held.pop(spid, None)
        if taken is not None and self.after is not None:
            self.after(taken)
