"""Forwards a failed root left unsettled, kept for the next root.

Without this, a publish the root had not settled when it failed (or voided
our session) was nacked: for a publisher without confirms, lost; so was one
read between the loss of the root's link and the block of publishers that
follows it (``hold``). Here it is kept (bounded: ``ORPHAN_BYTES_MAX``, and
the open timeout) and sent again to whichever server is root next, flagged
redelivered where the old one may have taken it: RabbitMQ would drop it, we
do not have to.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from brokerd.cluster.plane.flow import feeder
from brokerd.cluster.plane.outbound import Callbacks, Outbound, Unsettled
from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.cluster.plane.forwarding import MessagePlane
    from brokerd.model.interfaces import PublishWaiter

log = logging.getLogger("brokerd.cluster.plane.forwarding")

#: bytes of orphaned forwards kept for the next root; past it the oldest are nacked
ORPHAN_BYTES_MAX = 64 * 1024 * 1024


class Orphans:
    """The kept forwards, oldest first."""

    def __init__(self, plane: MessagePlane) -> None:
        self.plane = plane
        self.kept: deque[Unsettled] = deque()
        self.bytes = 0
        self.since = 0.0

    def keep(self, out: Outbound, *, maybe_taken: bool) -> None:
        """The peer will not settle its forwards (it failed, or voided our session).
        Those to the root for queues that follow it are kept, to go again to
        whichever server is root next (``send``), flagged redelivered if the peer
        may have taken them; the others (to a private queue's server, or a classic
        queue's owner) can go nowhere else and are nacked.
        ``maybe_taken``: the peer may have taken them (their settlements lost with a
        link); a void counts as that too, as its settlements may have been dropped
        with the link that ended the session."""
        plane = self.plane
        if out.fwd_message is not None:
            plane.finish_forward(out)
        unsettled, out.unsettled = out.unsettled, {}
        out.unsettled_bytes = 0
        to_root = out.spid == plane.root_spid() or out.spid == plane.root_was
        for message, targets, done, redelivered in unsettled.values():
            # a classic queue's forwards were its owner's alone: no other server may
            # take them (``SharedQueue.push``)
            if to_root and all(not spid and plane.follows_root(name) for spid, name in targets):
                if not self.kept:
                    self.since = plane.members.clock()
                self.kept.append((message, targets, done, redelivered or maybe_taken))
                self.bytes += len(message.body)
            else:
                for callback in done or ():
                    callback(False, 0)
        while self.bytes > ORPHAN_BYTES_MAX and self.kept:
            self._nack(self.kept.popleft())

    def hold(self, message: Message, target: tuple[str, str], waiter: PublishWaiter | None) -> bool:
        """A publish for a shared queue while there is no root, or no link to it:
        kept like a failed root's forwards (never sent, so not flagged redelivered)
        and sent when a root is there. Always accepted (the bound nacks the oldest)."""
        if not self.kept:
            self.since = self.plane.members.clock()
        done = [waiter.defer()] if waiter is not None else None
        self.kept.append((message, [target], done, False))
        self.bytes += len(message.body)
        while self.bytes > ORPHAN_BYTES_MAX and len(self.kept) > 1:
            self._nack(self.kept.popleft())
        return True

    def adopt(self, messages: list[tuple[Message, str]]) -> None:
        """A demoted root's unconfirmed publishes no quorum held (``ReplicaSet.
        unreplicated``): kept for the next root, flagged redelivered (a replica may
        have applied them; a consumer may have had them)."""
        if not messages:
            return
        if not self.kept:
            self.since = self.plane.members.clock()
        for message, name in messages:
            self.kept.append((message, [("", name)], None, True))
            self.bytes += len(message.body)
        log.warning(
            "%d unconfirmed publishes no replica quorum held: kept for the next root", len(messages)
        )
        while self.bytes > ORPHAN_BYTES_MAX and len(self.kept) > 1:
            self._nack(self.kept.popleft())

    def _nack(self, orphan: Unsettled) -> None:
        self.bytes -= len(orphan[0].body)
        for callback in orphan[2] or ():
            callback(False, 0)

    def send(self) -> None:
        """Send the kept forwards to the root, in the order they were first sent: to
        its link, or into our own queues if we are root now."""
        plane = self.plane
        root = plane.root_spid()
        if not self.kept or root is None:
            return
        if root != plane.spid and not plane.out(root).up:
            return
        orphans, self.kept = self.kept, deque()
        self.bytes = 0
        log.warning("%d unsettled forwards sent again to root %s", len(orphans), root)
        for message, targets, done, redelivered in orphans:
            if root == plane.spid:
                waiter = Callbacks(done or [])
                ok, routed = plane.apply_forward(message, targets, redelivered, waiter)
                waiter.arm(ok, routed)
                continue
            out = plane.out(root)
            if out.fwd_message is not None:
                plane.finish_forward(out)
            out.fwd_message = message
            out.fwd_redelivered = redelivered
            out.fwd_targets = list(targets)
            out.fwd_done = list(done or ())
            out.feeders.add(feeder(message.publisher), len(message.body))
            plane.finish_forward(out)
        plane.schedule()

    def expire(self) -> None:
        """Kept forwards that found no root within the open timeout are nacked."""
        plane = self.plane
        if self.kept and (plane.members.clock() - self.since > plane.members.config.open_timeout):
            log.warning("%d unsettled forwards found no root in time: nacked", len(self.kept))
            while self.kept:
                self._nack(self.kept.popleft())
            self.bytes = 0
