"""Forwards a failed owner left unsettled, kept for the queues' next owners.

Without this, a publish for a replicated queue that its owner had not settled
when it failed (or voided our session) was nacked: for a publisher without
confirms, lost; so was one read while the owner's link was down (``hold``).
Here it is kept (bounded: ``ORPHAN_BYTES_MAX``, and the open timeout) and sent
again to each target queue's owner once the state log has placed it on a
reachable server, flagged redelivered where the old one may have taken it:
RabbitMQ would drop it, we do not have to. A classic queue's forwards can go
to no other server (its owner alone holds it) and are nacked.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from brokerd.cluster.plane.outbound import Callbacks, Outbound, Unsettled
from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.cluster.plane.transport import Transport
    from brokerd.cluster.queues.shared import SharedQueue
    from brokerd.model.interfaces import PublishWaiter

log = logging.getLogger("brokerd.cluster.queues.orphans")

#: pushes a kept forward into this server's queues (``Intake.apply``)
Apply = Callable[..., tuple[bool, int]]

#: bytes of orphaned forwards kept for the next root; past it the oldest are nacked
ORPHAN_BYTES_MAX = 64 * 1024 * 1024


class Orphans:
    """The kept forwards, oldest first."""

    def __init__(
        self,
        transport: Transport,
        shared_queue: Callable[[str], SharedQueue | None],
        is_fenced: Callable[[str], bool],
        clock: Callable[[], float],
        open_timeout: Callable[[], float],
    ) -> None:
        self.transport = transport
        self.shared_queue = shared_queue
        self.is_fenced = is_fenced
        self.clock = clock
        self.open_timeout = open_timeout
        #: into this server's own queues (the service sets it: ``Intake.apply``)
        self.apply: Apply = _nowhere
        self.kept: deque[Unsettled] = deque()
        self.bytes = 0
        self.since = 0.0
        #: kept forwards per target queue: a new publish for one of them joins the
        #: keep (``holds``), so that it cannot overtake them
        self.queues: Counter[str] = Counter()
        #: a forward is being pushed into this server's queues past the keep's own
        #: check (``Intake.apply``): ``roles.Owner`` must not keep it again
        self.passing = False
        #: old owners whose settlements kept publishes wait for (``SharedQueue.behind``)
        self.awaited: set[str] = set()
        transport.after_settle.append(self._settled)

    def _add(self, orphan: Unsettled, *, first: bool = False) -> None:
        if not self.kept:
            self.since = self.clock()
        if first:
            self.kept.appendleft(orphan)
        else:
            self.kept.append(orphan)
        self.bytes += len(orphan[0].body)
        self.queues.update(name for _spid, name in orphan[1])

    def _take(self) -> Unsettled:
        orphan = self.kept.popleft()
        self._forget(orphan)
        return orphan

    def _forget(self, orphan: Unsettled) -> None:
        """``orphan`` leaves the keep: its bytes and queues are counted no more."""
        self.bytes -= len(orphan[0].body)
        for _spid, name in orphan[1]:
            left = self.queues[name] - 1
            if left > 0:
                self.queues[name] = left
            else:
                del self.queues[name]

    def _bound(self, keep: int) -> None:
        """Past ``ORPHAN_BYTES_MAX`` the oldest are nacked (``keep`` stay at least)."""
        while self.bytes > ORPHAN_BYTES_MAX and len(self.kept) > keep:
            self._nack(self._take())

    def holds(self, name: str) -> bool:
        """Publishes for queue ``name`` are kept: a new one must wait behind them."""
        return self.queues[name] > 0

    def keep(self, out: Outbound, *, maybe_taken: bool) -> None:
        """The peer will not settle its forwards (it failed, or voided our session).
        Those for replicated queues are kept, to go again to their owners
        (``send``), flagged redelivered if the peer may have taken them; the others
        (to a private queue's server, or a classic queue's owner) can go nowhere
        else and are nacked. ``maybe_taken``: the peer may have taken them (their
        settlements lost with a link); a void counts as that too, as its
        settlements may have been dropped with the link that ended the session.

        They go ahead of what is kept already: publishes for their queues kept
        since were sent after them (``SharedQueue.behind`` held them back)."""
        if out.fwd_message is not None:
            self.transport.finish_forward(out)
        unsettled, out.unsettled = out.unsettled, {}
        out.unsettled_bytes = 0
        for message, targets, done, redelivered in reversed(unsettled.values()):
            if all(not spid and self._replicated(name) for spid, name in targets):
                self._add((message, targets, done, redelivered or maybe_taken), first=True)
            else:
                for callback in done or ():
                    callback(False, 0)
        self._bound(0)

    def _replicated(self, name: str) -> bool:
        queue = self.shared_queue(name)
        return queue is None or queue.replicated_kind  # gone: not routed when sent

    def hold(
        self,
        message: Message,
        target: tuple[str, str],
        waiter: PublishWaiter | None,
        redelivered: bool = False,
    ) -> bool:
        """A publish for a replicated queue whose owner is unreachable (failed, and
        not failed over yet), or that is being moved (``handover``), or behind kept
        ones for its queue: kept like a failed owner's forwards (flagged
        redelivered only if it came so) and sent, in order, when the queue has a
        reachable owner. Always accepted (the bound nacks the oldest)."""
        done = [waiter.defer()] if waiter is not None else None
        self._add((message, [target], done, redelivered))
        self._bound(1)
        queue = self.shared_queue(target[1])
        old = queue.behind() if queue is not None else ""
        if old:
            self.awaited.add(old)  # its settlement sends this one (``_settled``)
        return True

    def adopt(self, messages: list[tuple[Message, str]]) -> None:
        """Unconfirmed publishes no quorum held of a queue this server no longer owns
        (``Stream.unreplicated``): kept for its next owner, flagged redelivered
        (a replica may have applied them; a consumer may have had them)."""
        if not messages:
            return
        for message, name in messages:
            self._add((message, [("", name)], None, True))
        log.warning(
            "%d unconfirmed publishes no replica quorum held: kept for the next owner",
            len(messages),
        )
        self._bound(1)

    def _nack(self, orphan: Unsettled) -> None:
        for callback in orphan[2] or ():
            callback(False, 0)

    def send(self) -> None:
        """Send the kept forwards, in the order they were first sent, to their queues'
        owners: to their links, or into this server's queues. One whose owner is not
        reachable yet (failover under way, a move) waits, and so does everything
        after it for the same queues; the other queues' go on."""
        if not self.kept:
            return
        sent = 0
        blocked: set[str] = set()
        left: deque[Unsettled] = deque()
        while self.kept:
            orphan = self.kept.popleft()
            names = {name for _spid, name in orphan[1]}
            if blocked.isdisjoint(names) and self._route(orphan):
                self._forget(orphan)
                sent += 1
            else:
                blocked |= names
                left.append(orphan)
        self.kept = left
        if sent:
            log.warning("%d unsettled forwards sent again to their owners", sent)
            self.transport.schedule()

    def _route(self, orphan: Unsettled) -> bool:
        """Send one kept forward to its queues' owners; False if one is not reachable."""
        transport = self.transport
        spid = transport.spid
        message, targets, done, redelivered = orphan
        plan: list[tuple[str, str]] = []
        for _spid, name in targets:
            queue = self.shared_queue(name)
            if queue is None:
                continue  # deleted meanwhile: not routed
            owner = queue.owner
            if owner is None or self._waits_for(queue):
                return False
            plan.append((owner, name))
        waiter = Callbacks(done or [])
        here = [("", name) for owner, name in plan if owner == spid]
        ok, routed = (
            self.apply(message, here, redelivered, waiter, kept=True) if here else (True, 0)
        )
        for owner, name in plan:
            if owner == spid:
                continue
            if transport.forward(owner, message, ("", name), waiter, redelivered):
                routed += 1
                queue = self.shared_queue(name)
                if queue is not None:
                    queue.sent = transport.mark(owner)
            else:
                ok = False
        waiter.arm(ok, routed)
        return True

    def describe(self) -> dict[str, Any]:
        """What is kept, for how long, and per queue why it cannot go yet (the state
        dump shows it: a publisher waiting on a confirm waits here)."""
        out: dict[str, Any] = {"kept": len(self.kept), "bytes": self.bytes}
        if self.kept:
            out["for_seconds"] = round(self.clock() - self.since, 3)
        out["queues"] = {
            name: {"kept": count, "waits": self._waits(name)}
            for name, count in sorted(self.queues.items())
            if count > 0
        }
        return out

    def _waits(self, name: str) -> str:
        """Why a forward for queue ``name`` cannot be routed now ("" if it can)."""
        queue = self.shared_queue(name)
        return "" if queue is None else self._waits_for(queue)

    def _waits_for(self, queue: SharedQueue) -> str:
        """Why a forward for ``queue`` cannot go to its owner now ("" if it can): the
        one rule ``_route`` follows and a state dump shows."""
        owner = queue.owner
        if owner is None:
            return "no owner"
        if queue.moving is not None:
            return f"moving to {queue.moving}"
        if self.is_fenced(owner):
            return f"owner {owner} fenced, failover under way"
        old = queue.behind()
        if old:
            self.awaited.add(old)
            return f"old owner {old} has earlier publishes unsettled"
        if owner == self.transport.spid:
            return "" if queue.local else "owned here, not taken yet"
        out = self.transport.outbound.get(owner)
        if out is None or not out.up:
            return f"owner {owner}: link down"
        if not self.transport.reachable(owner):
            return f"owner {owner}: not active (silent)"
        return ""

    def _settled(self, out: Outbound) -> None:
        """An old owner some kept publishes wait for settled forwards: they may go."""
        if out.spid in self.awaited:
            self.awaited.clear()  # ``send`` adds those still waiting back
            self.send()

    def expire(self) -> None:
        """Kept forwards that found no owner within the open timeout are nacked."""
        if self.kept and (self.clock() - self.since > self.open_timeout()):
            log.warning("%d unsettled forwards found no owner in time: nacked", len(self.kept))
            while self.kept:
                self._nack(self._take())


def _nowhere(*_args: Any, **_kwargs: Any) -> tuple[bool, int]:
    return False, 0
