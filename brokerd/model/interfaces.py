"""What a queue offers and needs, as protocols: the channel, the cluster and the
stores implement or call them, so none of them needs the queue's code."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

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
