"""A replicated shared queue: every other primary keeps a copy, fed by its owner's
replication stream, and a publish is confirmed once a majority of the known
primaries holds it (the owner and ``known // 2`` replicas: ``replication.quorum``).
A durable shared queue declared without ``x-queue-type`` is one (Rookery's mirrored
queue); ``quorum.QuorumQueue`` narrows the copies to a group.

When its owner is lost, the root places it on the replica furthest along its
stream, and nothing confirmed is lost; meanwhile, and while it moves, publishes
for it are kept (``orphans``) and go to its next owner in order. Until its first
placement it is nobody's: calls wait for the owner rather than fail."""

from __future__ import annotations

from typing import Any

from brokerd.cluster.queues.replication.content import QueueCopy
from brokerd.cluster.queues.replication.entry import Entry
from brokerd.cluster.queues.replication.marks import ConfirmMarks
from brokerd.cluster.queues.replication.store import ReplicatingStore
from brokerd.cluster.queues.shared import SharedQueue
from brokerd.model.interfaces import PublishWaiter
from brokerd.model.message import Message


class ReplicatedQueue(SharedQueue):
    kind = "replicated"
    replicated_kind = True

    def _first_local(self) -> bool:
        return False  # nobody's until placed

    def _replicas(self) -> list[dict[str, Any]]:
        return self.services.stream.members(self.group_key)

    def unavailable(self) -> bool:
        # placed once and no copy left to fail over to; before its first placement the
        # calls wait for it
        return self.owner is None and self.epoch > 0

    def to_owner(self, message: Message, waiter: PublishWaiter | None) -> bool:
        services = self.services
        owner = self.owner
        if owner != services.spid and (
            services.orphans.holds(self.name)
            or owner is None
            or self.moving is not None
            or not services.reachable(owner)
            or (self.sent is not None and self.behind())
        ):
            # its owner unreachable (a failover under way), the queue being moved,
            # publishes for it wait for its next owner already, or the old owner holds
            # one unsettled (this one must not overtake them): kept
            return services.orphans.hold(message, ("", self.name), waiter)
        if services.forward(owner, message, ("", self.name), waiter):
            self.sent = services.transport.mark(owner)
            return True
        return False

    def _owning(self) -> bool:
        return self.replicated is not None

    def _taken_over(self, entries: dict[int, Entry], copy: QueueCopy | None) -> None:
        """Its store numbers on from the copy and replicates every event; the replicas
        are reset to this server's copy."""
        stream = self.services.stream
        marks = None
        if ConfirmMarks.enabled():  # a fault drill's server: the placement it owns by
            marks = ConfirmMarks(
                self.name, self.epoch, self.services.members.state_term(), self.services.spid
            )
        store = ReplicatingStore(self.name, stream, self.journal_store, entries, marks)
        if copy is not None:
            store.next_mid = max(store.next_mid, copy.top + 1)
        self.replicated = store
        stream.adopt(self.name, store.entries, self.group_key)

    def _copy_to_keep(self) -> QueueCopy:
        """Its store's entries, by message id: the next owner's stream resets them.
        Publishes no quorum held yet go on to that next owner."""
        services = self.services
        copy = QueueCopy()
        store, self.replicated = self.replicated, None
        if store is None:
            return copy
        if store.marks is not None:
            # what it held unconfirmed goes on to the next owner, whose confirm completes
            # the same publish: that one is not this owner's to mark
            store.marks.retire()
        # what no quorum of its group holds yet, before the stream forgets the group
        services.orphans.adopt(services.stream.unreplicated(self.name, store))
        services.stream.disown(self.name)
        for mid, entry in store.entries.items():
            copy.entries[mid] = entry
            if not entry.message.paged:
                copy.bytes += len(entry.message.body)
        copy.top = store.next_mid - 1
        return copy
