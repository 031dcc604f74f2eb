"""A planned stop of a primary (``brokerd`` on SIGTERM, after ``hand_over``): the
replicated queues it owns move to the other primaries instead of failing over once
it is gone, and the forwards it relays to their new owners are settled before its
links close (``PlannedStop``, mixed into ``ClusterController``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from brokerd.cluster.election import PRIMARY
from brokerd.cluster.ownership.moves import MOVE_TIMEOUT

if TYPE_CHECKING:
    from brokerd.cluster.ownership.moves import QueueMoves
    from brokerd.cluster.ownership.placer import Placer
    from brokerd.cluster.peers import Peer
    from brokerd.cluster.queues.service import QueueService
    from brokerd.cluster.standing import Standing

log = logging.getLogger("brokerd.cluster")

#: a planned stop waits at most this long (seconds) for the forwards it relays to
#: its moved queues' new owners to be settled before its links close
RELAY_SETTLE_LIMIT = 2.0


class PlannedStop:
    """Moving a stopping server's queues away, and settling what it relays."""

    spid: str
    queues: QueueService
    moves: QueueMoves
    placer: Placer
    standing: Standing
    peers: dict[str, Peer]
    clock: Callable[[], float]

    async def move_queues_away(self, limit: float = MOVE_TIMEOUT + 1.0) -> None:
        """A planned stop (after ``hand_over``, while this server still listens): its
        replicated queues move to the other primaries and are not failed over once
        it is gone. Waits, at most ``limit``, until each has moved, been refused or
        been called off, or no move can end any more (``why_queues_stay``): the
        last primaries of a cluster being stopped would otherwise wait out the
        whole limit for moves no root can order."""
        owned = len(self.queues.owned_replicated())
        if not owned:
            return
        why = self.why_queues_stay()
        if why is not None:
            log.warning("stopping: %s, %s", why, _staying(owned))
            return
        refused: set[str] = set()
        moves = self.moves.evacuate(refused.add)
        if not moves:
            return
        started = self.clock()
        epochs = {m["queue"]: q.epoch for m in moves if (q := self.queues.shared_queue(m["queue"]))}

        def under_way(name: str) -> bool:
            queue = self.queues.shared_queue(name)
            if queue is None or not queue.local or name in refused:
                return False
            # the move's placement and the one calling it off: each one epoch on
            return queue.moving is not None or queue.epoch < epochs[name] + 2

        pending = list(epochs)
        while pending and self.clock() - started < limit:
            await asyncio.sleep(0.005)
            pending = [name for name in pending if under_way(name)]
            if pending and (why := self.why_queues_stay()) is not None:
                break  # the root or its quorum went meanwhile: nothing more will move
        moved = sum(
            1 for name in epochs if (q := self.queues.shared_queue(name)) is None or not q.local
        )
        log.warning(
            "stopping: %d of %d queues moved to other primaries in %.0f ms%s",
            moved,
            len(epochs),
            (self.clock() - started) * 1000,
            f"; still under way: {', '.join(pending)}" if pending else "",
        )
        if pending and why is not None:
            log.warning("stopping: %s, %s", why, _staying(len(pending)))
        await self.settle_relays()

    async def settle_relays(self, limit: float = RELAY_SETTLE_LIMIT) -> None:
        """A planned stop, its queues moved: what peers forwarded here for them while
        they were handed over is relayed to their new owners, and the peers hear
        it settled only once those settle it. Links closed before that would have
        the peers send it again, flagged, beside the relayed copy: a duplicate a
        planned stop must not make. So wait, at most ``limit``, until what is kept
        is relayed and the relays made so far are settled (later forwards, from
        this server's own clients, are not waited for: they may never pause)."""
        queues, deadline = self.queues, self.clock() + limit
        while queues.orphans.kept and self.clock() < deadline:
            await asyncio.sleep(0.005)
        transport = queues.transport
        marks = [(out, max(out.unsettled)) for out in transport.outbound.values() if out.unsettled]
        while any(transport.unsettled_upto(mark) for mark in marks) and self.clock() < deadline:
            await asyncio.sleep(0.005)

    def why_queues_stay(self) -> str | None:
        """Why no queue of this stopping server can move now (None: they can).

        A move is ordered by a root, which needs a quorum of voting primaries; this
        server abstains once stopping (``hand_over``), so only the other primaries
        that are active, vote and are not stopping themselves can keep the root's
        quorum. A move also needs another live primary to take the queue. Judged on
        this server's view, as the move itself would be; a queue that cannot move
        stays here, kept by its copies on the other servers or by its journal."""
        root = self.standing.current_root
        if root is None:
            return "no root"
        if root == self.spid:
            return "no other primary can be root"
        now = self.clock()
        known = self.standing.known_primaries(now)
        backers = [
            peer
            for peer in self.peers.values()
            if (status := peer.status) is not None
            and status.type == PRIMARY
            and status.listed
            and status.vote is not None
            and not status.stopping
            and self.standing.active(peer, now)
        ]
        if 2 * len(backers) <= known:
            return f"no quorum ({len(backers)} of {known} known primaries stay)"
        if not self.placer.mover.targets():
            return "no other live primary to take them"
        return None


def _staying(count: int) -> str:
    """What a planned stop leaves here, for its log line."""
    if count == 1:
        return "1 queue stays here (its copies elsewhere, or its journal, keep it)"
    return f"{count} queues stay here (their copies elsewhere, or their journals, keep them)"
