"""What a queue offers and needs, as protocols: the channel, the cluster and the
stores implement or call them, so none of them needs the queue's code."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.model.queue import Queue


#: who published a message or owns a consumer, for no-local: a local connection id,
#: or ``"spid/connection"`` for a connection on another server of the cluster
Origin = int | str


class ConsumerSink(Protocol):
    """What a queue needs from a consumer; the channel layer implements it (and the
    cluster, for a consumer connected to another server)."""

    tag: str
    exclusive: bool
    no_local: bool
    #: its deliveries are settled as they are sent (the store forgets them at once)
    no_ack: bool
    connection_id: Origin

    def ready(self) -> bool:
        """Can it take one more message now (prefetch, flow, socket)?"""

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        """Send the message; the consumer now owns it until ack/reject."""

    def cancelled(self, queue: Queue) -> None:
        """The queue went away under the consumer (server-side cancel)."""


class PublishWaiter(Protocol):
    """The publisher side of a push that completes later (a queue on another
    server, a disk write): ``defer()`` hands the queue a callback that it calls
    once with ``(accepted, routed)`` when the message is safe (or refused);
    ``routed`` counts the queues that took it, for mandatory returns."""

    def defer(self) -> Callable[[bool, int], None]: ...


class Destination(Protocol):
    """What a binding leads to when it is not an exchange: a queue of any type, or
    the cluster's stand-in for a private queue on another server. The routing
    walk only pushes to it."""

    name: str
    #: its bindings, keyed as the vhost keys them
    bindings: dict[tuple[Any, ...], Any]

    def push(self, message: Message, waiter: PublishWaiter | None = None) -> bool: ...


#: a basic.get answer: the message, its redelivered flag, the messages left
Got = tuple[Message, bool, int]
#: the callback an operation that may complete later answers through: a result,
#: or an AMQPError for the caller to raise
Reply = Callable[[Any], None]


@runtime_checkable
class QueueType(Protocol):
    """What the channel, the vhost and the stores ask of a queue, whatever keeps it
    (RabbitMQ's ``rabbit_queue_type`` behaviour). The model's ``Queue`` is one
    implementation: a classic queue of this server. A cluster's shared queue serves
    each call in its role on this server, owner or proxy
    (``brokerd.cluster.queues.roles``): the channel never knows which."""

    def push(self, message: Message, waiter: PublishWaiter | None = None) -> bool:
        """Take a routed message; False refuses it (the publisher is nacked)."""

    def get(self, no_ack: bool, reply: Reply, recipient: Any = None) -> None:
        """basic.get: ``reply`` gets a ``Got`` or None (empty)."""

    def ack(self, messages: Sequence[Message]) -> None:
        """Deliveries settled: gone for good."""

    def reject(self, messages: Iterable[Message]) -> None:
        """Deliveries refused without requeue: dead-lettered or dropped."""

    def requeue(self, messages: Iterable[Message]) -> None:
        """Deliveries back into the queue, at their places, flagged redelivered."""

    def dispatch(self) -> None:
        """Hand ready messages to consumers that can take them."""

    def purge(self, reply: Reply) -> None:
        """queue.purge: ``reply`` gets the count purged."""

    def stat(self, reply: Reply) -> None:
        """The counts a declare-ok reports: ``reply`` gets (messages, consumers)."""

    def add_consumer(self, consumer: ConsumerSink, reply: Reply | None = None) -> None:
        """basic.consume: ``reply`` gets None, or the error refusing it."""

    def remove_consumer(self, consumer: ConsumerSink) -> None:
        """basic.cancel, or its channel closed: unsettled deliveries stay with it."""

    def load_recovered(self, messages: Iterable[tuple[Message, bool]]) -> int:
        """What the journal kept across a restart, in order: how many were taken."""
