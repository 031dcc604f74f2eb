"""A classic shared queue: its owner's alone (RabbitMQ's ``rabbit_classic_queue`` on
one node). No other server keeps a copy: a transient one is lost with its owner,
a durable one waits for it (its journal keeps it), and while its owner is away
the calls made of it are answered at once, as RabbitMQ answers for a queue whose
node is down. A new classic queue is the master on the root until its placement
says where it lives; a publish for it goes straight to its owner, or is refused
(nacked) when that owner cannot be reached: no other server may take it."""

from __future__ import annotations

from typing import Any

from brokerd.cluster.queues.replication.content import QueueCopy
from brokerd.cluster.queues.replication.entry import Entry
from brokerd.cluster.queues.shared import SharedQueue
from brokerd.model.interfaces import PublishWaiter
from brokerd.model.message import Message


class ClassicQueue(SharedQueue):
    kind = "classic"
    replicated_kind = False

    def _first_local(self) -> bool:
        return self.services.is_root

    def _replicas(self) -> list[dict[str, Any]]:
        return []  # its owner's alone

    def unavailable(self) -> bool:
        return self.owner is None

    def to_owner(self, message: Message, waiter: PublishWaiter | None) -> bool:
        # its owner away or unreachable: refused (a second copy elsewhere would fork it)
        return self.services.forward(self.owner, message, ("", self.name), waiter)

    def _taken_over(self, entries: dict[int, Entry], copy: QueueCopy | None) -> None:
        return None  # its journal is its store, here as before

    def _copy_to_keep(self) -> QueueCopy:
        """Its ready messages, in order: the content again if this server owns it
        again (its journal keeps the persistent part across a restart too)."""
        copy = QueueCopy()
        for position, (message, redelivered) in enumerate(self.inner.ready(), start=1):
            copy.entries[position] = Entry(message, redelivered=redelivered, persistent=True)
            copy.top = position
        return copy
