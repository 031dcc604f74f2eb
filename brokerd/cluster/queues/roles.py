"""A shared queue's two roles on one server, each an implementation of the model's
``QueueType``: RabbitMQ's queue-type behaviour, per server.

- ``Owner``: this server holds the queue's messages, in the model's local queue
  the shared queue holds (``SharedQueue.inner``; a replicated one numbers and
  replicates through its store, which the queue code never sees).
- ``Proxy``: another server owns it. A push is forwarded to the owner (a
  replicated queue's is kept for its next owner while the owner is
  unreachable), and consumers, gets, purges, counts and settlements go to the
  owner through ``proxy.ProxySide``.

``SharedQueue`` holds one role at a time and hands every ``QueueType`` call to
it; a placement swaps the role (``SharedQueue.local``), so the channels holding
the queue never notice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from brokerd.cluster.queues.replication.content import QueueCopy
from brokerd.cluster.queues.replication.entry import Entry
from brokerd.model.interfaces import ConsumerSink, PublishWaiter, Reply
from brokerd.model.message import Message
from brokerd.model.queue import Queue

if TYPE_CHECKING:
    from brokerd.cluster.queues.shared import SharedQueue


class Owner:
    """The queue served here: the model's local queue (``inner``) does the work."""

    __slots__ = ("inner", "queue")

    master = True

    def __init__(self, queue: SharedQueue, inner: Queue) -> None:
        self.queue = queue
        self.inner = inner

    def push(self, message: Message, waiter: PublishWaiter | None = None) -> bool:
        queue = self.queue
        services = queue.services
        if queue.replicated_kind and (
            services.stream.fenced
            or (
                not services.orphans.passing
                and (
                    (queue.sent is not None and queue.behind())
                    or services.orphans.holds(queue.name)
                )
            )
        ):
            # fenced: the queue is about to fail over, and a confirm through this
            # stream would be given by the numbers of its next generation, which
            # replicas holding nothing of the queue ack: kept for its next owner. Or
            # its old owner holds a publish sent before it came here, and may relay
            # it yet, or publishes for it are kept already: kept behind those (unless
            # the intake let this one past them: ``Orphans.passing``)
            return services.orphans.hold(message, ("", queue.name), waiter)
        if queue.moving is None:
            return self.inner.push(message, waiter)
        return queue.push_moving(message, waiter)

    def get(self, no_ack: bool, reply: Reply, recipient: Any = None) -> None:
        queue = self.queue
        if queue.moving is not None:
            # nothing leaves a queue being handed over: asked again once it has its owner
            if not queue.defer(lambda: queue.get(no_ack, reply, recipient)):
                reply(None)
            return
        self.inner.get(no_ack, reply, recipient)

    def ack(self, messages: Sequence[Message]) -> None:
        self.inner.ack(messages)

    def reject(self, messages: Iterable[Message]) -> None:
        self.inner.reject(messages)

    def requeue(self, messages: Iterable[Message]) -> None:
        # a message delivered by an earlier owner (``ref`` set) is that one's to requeue
        self.inner.requeue([m for m in messages if m.ref is None])

    def dispatch(self) -> None:
        if self.queue.moving is None:  # a queue being handed over delivers nothing
            self.inner.dispatch()

    def purge(self, reply: Reply) -> None:
        queue = self.queue
        if queue.moving is not None and queue.defer(lambda: queue.purge(reply)):
            return  # its new owner purges it
        self.inner.purge(reply)

    def stat(self, reply: Reply) -> None:
        self.inner.stat(reply)

    def add_consumer(self, consumer: ConsumerSink, reply: Reply | None = None) -> None:
        self.inner.add_consumer(consumer, reply)

    def remove_consumer(self, consumer: ConsumerSink) -> None:
        self.inner.remove_consumer(consumer)

    def load_recovered(self, messages: Iterable[tuple[Message, bool]]) -> int:
        return self.inner.load_recovered(messages)


class Proxy:
    """The queue owned elsewhere: every call goes to its owner."""

    __slots__ = ("inner", "queue")

    master = False

    def __init__(self, queue: SharedQueue, inner: Queue) -> None:
        self.queue = queue
        self.inner = inner

    def push(self, message: Message, waiter: PublishWaiter | None = None) -> bool:
        self.inner.stats_in += 1
        return self.queue.to_owner(message, waiter)  # as its kind decides

    def get(self, no_ack: bool, reply: Reply, recipient: Any = None) -> None:
        self.queue.services.proxy.get(self.queue, no_ack, reply)

    def ack(self, messages: Sequence[Message]) -> None:
        self.queue.services.proxy.settle(messages, "ack")
        self.dispatch()  # the consumer's prefetch freed: deliveries waiting here go

    def reject(self, messages: Iterable[Message]) -> None:
        self.queue.services.proxy.settle(messages, "reject")
        self.dispatch()

    def requeue(self, messages: Iterable[Message]) -> None:
        # what this server delivered while it was the owner is the new owner's already
        # (its replica had it acquired: it came back there, flagged redelivered)
        self.queue.services.proxy.settle(list(messages), "requeue")
        self.dispatch()

    def dispatch(self) -> None:
        proxy = self.queue.services.proxy
        for state in list(self.queue.proxied.values()):
            proxy.drain(state)

    def purge(self, reply: Reply) -> None:
        self.queue.services.proxy.purge(self.queue, reply)

    def stat(self, reply: Reply) -> None:
        self.queue.services.proxy.stat(self.queue, reply)

    def add_consumer(self, consumer: ConsumerSink, reply: Reply | None = None) -> None:
        self.queue.services.proxy.attach(self.queue, consumer, reply)

    def remove_consumer(self, consumer: ConsumerSink) -> None:
        self.inner.detach(consumer)
        self.queue.services.proxy.detach(self.queue, consumer)

    def load_recovered(self, messages: Iterable[tuple[Message, bool]]) -> int:
        """What this server's journal kept: the copy a failover may start from (the
        owner, if another server is, resets it and sends its own)."""
        queue = self.queue
        store = queue.journal_store
        replica = QueueCopy()
        for message, redelivered in messages:
            if message.paged:  # left on disk by the store: known by its journal id
                mid = message.jid  # type: ignore[attr-defined]
            else:
                mid = store.ids.get(id(message), 0) if store is not None else 0
            if not mid:
                continue
            replica.entries[mid] = Entry(message, redelivered=redelivered, persistent=True)
            replica.top = max(replica.top, mid)
            if not message.paged:
                replica.bytes += len(message.body)
        queue.services.copies.hand(queue.name, replica)
        return len(replica.entries)
