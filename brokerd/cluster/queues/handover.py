"""Moving a replicated queue's owner without losing or reordering anything (seed 001,
"moving queue ownership"; issue 23): this server's side of each hand-over.

The root orders a move as a placement that keeps the owner and names the
target (``queue.place`` with ``to``). From then until the placement that ends
it, every server plays its part:

- **every other server** keeps its publishes for the queue (``Proxy.push``
  holds them, as for an owner being failed over) and tells the owner with a
  ``records.Drained`` on its link: every forward it made for the queue is in
  ahead of that record;
- **the owner** delivers nothing more from the queue (its consumers stay
  attached; gets and purges wait), and still takes what is forwarded. Once
  every linked server has drained (a server whose link is down cannot send
  more: what it had in flight is voided, and kept for the next owner) it
  *freezes* the queue at its stream's position (later publishes, even its own
  clients', are kept for the next owner), waits for the target to hold the
  queue that far (``Stream.holds``: its copy is then the queue, event for
  event), and asks the root to place the queue on the target (``on_handed``);
- **the target** takes the queue from its copy when that placement arrives,
  as in a failover: what the old owner had delivered and not seen settled
  comes back flagged redelivered, and every kept publish follows, in order.

Publishers and consumers see a pause of a link round trip plus the target's
catch-up. A move that does not complete in ``MOVE_TIMEOUT`` is called off by
the root (``moving``), which places the queue on its owner again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from brokerd.cluster.plane.transport import Transport
    from brokerd.cluster.queues.replication.stream import Stream
    from brokerd.cluster.queues.shared import SharedQueue

log = logging.getLogger("brokerd.cluster.queues.handover")

#: moves whose ``Drained`` records may wait for their placement at once
MAX_EARLY = 10_000


@dataclass
class Handover:
    """One queue this server owns and is handing to ``target``."""

    queue: SharedQueue
    target: str
    #: the placement that started it (a ``Drained`` names it)
    epoch: int
    started: float
    #: linked servers whose ``Drained`` has not arrived
    waiting: set[str] = field(default_factory=set)
    #: the stream position the queue froze at (None: still draining)
    point: int | None = None
    #: the root was asked to place the queue on the target
    asked: bool = False


class Handovers:
    """The hand-overs under way on this server, as owner and as any other server."""

    def __init__(
        self,
        transport: Transport,
        shared_queue: Callable[[str], SharedQueue | None],
        stream: Stream,
        clock: Callable[[], float],
    ) -> None:
        self.transport = transport
        self.shared_queue = shared_queue
        self.stream = stream
        self.clock = clock
        self.out: dict[str, Handover] = {}
        #: ``Drained`` records that came before the placement starting their move here
        #: (it reaches each server on its own lane): (queue, epoch) -> senders
        self.early: dict[tuple[str, int], set[str]] = {}
        #: asks the root to place queue ``name`` on ``target`` (the controller sets it)
        self.on_handed: Callable[[SharedQueue, str], None] | None = None

    def started(self, queue: SharedQueue) -> None:
        """A placement says ``queue`` is moving (``queue.moving``): the owner locks it
        and waits for the others' ``Drained``; any other server keeps its publishes
        for it (``Proxy.push``) and drains its link to the owner."""
        transport = self.transport
        target = queue.moving
        assert target is not None
        if queue.local:
            if queue.name in self.out:
                return  # a sync replayed the placement
            waiting = {spid for spid, out in transport.outbound.items() if out.up}
            waiting -= self.early.pop((queue.name, queue.epoch), set()) | {transport.spid}
            self.early = {k: v for k, v in self.early.items() if k[0] != queue.name}
            self.out[queue.name] = Handover(queue, target, queue.epoch, self.clock(), waiting)
            log.info(
                "queue=%s moving to %s: waiting for %d servers to drain",
                queue.name,
                target,
                len(waiting),
            )
            self.check()
            return
        owner = queue.owner
        if owner is not None and owner != transport.spid:
            out = transport.outbound.get(owner)
            if out is not None and out.up:
                transport.batch(out).drained(queue.name, queue.epoch)

    def drained(self, spid: str, name: str, epoch: int) -> None:
        handover = self.out.get(name)
        if handover is not None and handover.epoch == epoch:
            handover.waiting.discard(spid)
            self.check()
            return
        # the placement that starts the move has not reached this server yet (it may
        # not even own the queue yet: the placement before it is on its way too)
        queue = self.shared_queue(name)
        if queue is not None and epoch > queue.epoch and len(self.early) < MAX_EARLY:
            self.early.setdefault((name, epoch), set()).add(spid)

    def ended(self, queue: SharedQueue) -> None:
        """The placement that ends the move (the queue is the target's now, or the root
        called the move off) arrived."""
        handover = self.out.pop(queue.name, None)
        if self.early:
            self.early = {
                k: v for k, v in self.early.items() if k[0] != queue.name or k[1] > queue.epoch
            }
        if handover is not None:
            elapsed = (self.clock() - handover.started) * 1000
            log.info(
                "queue=%s hand-over to %s over after %.0f ms: owner %s",
                queue.name,
                handover.target,
                elapsed,
                queue.owner,
            )

    def check(self) -> None:
        """Freeze what has drained; ask for the placement of what the target holds."""
        if not self.out:
            return
        outbound = self.transport.outbound
        stream = self.stream
        # a placement ordered here (this server is root) ends its hand-over at once
        for handover in list(self.out.values()):
            if handover.asked:
                continue
            queue = handover.queue
            if handover.point is None:
                handover.waiting = {
                    spid
                    for spid in handover.waiting
                    if (out := outbound.get(spid)) is not None and out.up
                }
                if handover.waiting:
                    continue
                handover.point = stream.seq
                queue.frozen = True
                log.info("queue=%s frozen at stream seq=%d", queue.name, handover.point)
            if not stream.holds(handover.target, queue.name, handover.point):
                continue
            handover.asked = True
            log.info(
                "queue=%s: %s holds it up to seq=%d: asking for its placement there",
                queue.name,
                handover.target,
                handover.point,
            )
            if self.on_handed is not None:
                self.on_handed(queue, handover.target)

    def describe(self) -> dict[str, dict[str, object]]:
        return {
            name: {
                "to": h.target,
                "waiting": sorted(h.waiting),
                "point": h.point,
                "asked": h.asked,
            }
            for name, h in self.out.items()
        }
