"""Queues: the interface every queue type offers, and the local FIFO queue.

The channel and the routing walk talk to queues only through the methods of
``Queue``: ``push`` (with an optional ``PublishWaiter`` for publishes that
complete later), ``ack`` / ``reject`` / ``requeue`` for settled deliveries,
and ``add_consumer``, ``get``, ``purge`` and ``stat``, which answer through a
``Reply`` callback because a queue held by another server (the cluster's
shared queues) answers only when that server has. A local queue answers at
once, from inside the call. The cluster's queue types subclass ``Queue``, so
the channel never knows which kind it holds (compare RabbitMQ's queue-type
behaviour).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from brokerd.model.errors import ACCESS_REFUSED, ChannelError, precondition_failed
from brokerd.model.message import Message
from brokerd.model.storage import QueueStore

#: the queue arguments this broker understands, with the types they accept
QUEUE_ARGUMENTS: dict[str, tuple[type, ...]] = {
    "x-max-length": (int,),
    "x-overflow": (str,),
    "x-message-ttl": (int,),
    "x-expires": (int,),
    "x-dead-letter-exchange": (str,),
    "x-dead-letter-routing-key": (str,),
}
OVERFLOW_MODES = ("drop-head", "reject-publish")
#: bytes of message bodies a queue keeps in memory before it pages new ones out to
#: its store (the store's setting replaces it)
PAGE_LIMIT = 64 * 1024 * 1024


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


def amqp_type_name(value: Any) -> str:
    """The AMQP field type a client most likely sent ``value`` as, named as RabbitMQ does."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, str | bytes):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "void"
    return {"Decimal": "decimal", "datetime": "timestamp"}.get(type(value).__name__, "longstr")


def validate_queue_arguments(name: str, vhost: str, arguments: dict[str, Any]) -> None:
    """Refuse mistyped or out-of-range x-arguments with 406 and RabbitMQ's texts."""
    for key, value in arguments.items():
        types = QUEUE_ARGUMENTS.get(key)
        if types is None:
            continue
        invalid = f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}'"
        if isinstance(value, bool) or not isinstance(value, types):
            got = amqp_type_name(value)
            if key == "x-dead-letter-exchange":
                raise precondition_failed(
                    f"invalid type '{got}' for arg '{key}' in queue '{name}' in vhost '{vhost}'"
                )
            if int in types:
                raise precondition_failed(f'{invalid}: "expected integer, got {got}"')
            raise precondition_failed(f"{invalid}: {{unacceptable_type,{got}}}")
        if isinstance(value, int) and value < 0:
            raise precondition_failed(f"{invalid}: {{value_negative,{value}}}")
        if key == "x-expires" and value == 0:
            raise precondition_failed(f"{invalid}: {{value_zero,{value}}}")
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise precondition_failed(
            f"invalid arg 'x-dead-letter-routing-key' for queue '{name}' in vhost '{vhost}': "
            "routing_key_but_no_dlx_defined"
        )
    overflow = arguments.get("x-overflow")
    if overflow is not None and overflow not in OVERFLOW_MODES:
        raise precondition_failed(
            f"invalid arg 'x-overflow' for queue '{name}' in vhost '{vhost}': invalid_overflow"
        )


class Queue:
    """The local queue type: a FIFO of messages and a round-robin set of consumers.

    Standalone every queue is one; in a cluster the private (exclusive) queues
    are, and the root's master copy of each shared queue is kept in one.
    """

    #: its contents live on this server (False for a queue proxied to another)
    local = True

    def __init__(
        self,
        name: str,
        vhost: str,
        *,
        durable: bool = False,
        exclusive_owner: int | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.vhost = vhost
        self.durable = durable
        #: connection id owning an exclusive queue, else None (a shared queue)
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        #: ready messages, oldest first; plain Message objects, so a deep queue
        #: costs one reference per message and no per-entry allocation
        self.messages: deque[Message] = deque()
        #: ids of queued messages that were delivered before (requeued ones)
        self._redelivered: set[int] = set()
        self.consumers: list[ConsumerSink] = []
        self.bindings: dict[tuple[Any, ...], Any] = {}
        self.had_consumers = False
        self.deleted = False
        self._rr = 0
        self.max_length: int | None = self.arguments.get("x-max-length")
        self.reject_publish = self.arguments.get("x-overflow") == "reject-publish"
        #: called when an auto-delete queue loses its last consumer: the vhost
        #: removes it (the cluster orders the removal of a shared one)
        self.on_unused: Callable[[Queue], None] | None = None
        #: counters for dumps, rates and the console: copies enqueued (or handed
        #: straight to a consumer), copies delivered or got, copies dropped by overflow
        self.stats_in = 0
        self.stats_out = 0
        self.stats_dropped = 0
        #: delivered copies not yet acked; the channel layer keeps it (it holds the tags)
        self.unacked = 0
        #: this queue's part of the message store (journal, flow to disk); None: none
        self.store: QueueStore | None = None
        #: bytes of the bodies of queued messages held in memory; past ``page_limit``
        #: new arrivals are paged out to the store (flow to disk)
        self.bytes = 0
        self.page_limit = PAGE_LIMIT

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        return len(self.messages)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    # -- messages in -------------------------------------------------------

    def push(self, message: Message, waiter: PublishWaiter | None = None) -> bool:
        """Enqueue (or hand straight to a ready consumer); False if refused by overflow.

        A queue without a store completes at once; a durable one defers the
        publish (``waiter``) until the store has a persistent message on disk."""
        self.stats_in += 1
        store = self.store
        if not self.messages and self.consumers:
            consumer = self._next_ready(message)
            if consumer is not None:
                self.stats_out += 1
                if store is not None:
                    store.enqueued(message, waiter)
                    store.delivered(message, consumer, consumer.no_ack)
                consumer.deliver(self, message, False)
                return True
        max_length = self.max_length
        if max_length is not None and len(self.messages) >= max_length:
            if self.reject_publish:
                self.stats_in -= 1
                self.stats_dropped += 1
                return False
            while self.messages and len(self.messages) >= max_length:
                dropped, _ = self._pop()
                self.stats_dropped += 1
                if store is not None:
                    store.dequeued((dropped,))
            if max_length == 0:
                self.stats_dropped += 1
                return True
        if store is not None:
            store.enqueued(message, waiter)
            if self.bytes > self.page_limit:
                stub = store.page_out(message)
                if stub is not None:  # flow to disk: the body leaves memory
                    self.messages.append(stub)
                    return True
        self.messages.append(message)
        self.bytes += len(message.body)
        return True

    # -- settling deliveries -------------------------------------------------

    def ack(self, messages: Iterable[Message]) -> None:
        """Delivered messages were acked: forget them, and use the freed credit."""
        if self.store is not None:
            self.store.dequeued(messages)
        if self.messages:
            self.dispatch()

    def reject(self, messages: Iterable[Message]) -> None:
        """Delivered messages were rejected without requeue: they are dropped."""
        if self.store is not None:
            self.store.dequeued(messages)
        if self.messages:
            self.dispatch()

    def requeue(self, messages: Iterable[Message]) -> None:
        """Put rejected/recovered messages back at the head, in their original order."""
        if self.deleted:
            return
        messages = list(messages)
        for message in reversed(messages):
            self.messages.appendleft(message)
            self._redelivered.add(id(message))
            self.bytes += len(message.body)
        if self.store is not None:
            self.store.requeued(messages)
        self.dispatch()

    def restore(self, message: Message) -> None:
        """A message delivered once before comes back from elsewhere (another server,
        a former master): enqueue it at the tail, flagged redelivered."""
        self.stats_in += 1
        store = self.store
        if store is not None:
            store.enqueued(message, None)
        if not self.messages and self.consumers:
            consumer = self._next_ready(message)
            if consumer is not None:
                self.stats_out += 1
                if store is not None:
                    store.delivered(message, consumer, consumer.no_ack)
                consumer.deliver(self, message, True)
                return
        self.messages.append(message)
        self.bytes += len(message.body)
        self._redelivered.add(id(message))

    def _pop(self) -> tuple[Message, bool]:
        message = self.messages.popleft()
        redelivered = False
        if self._redelivered and id(message) in self._redelivered:
            self._redelivered.discard(id(message))
            redelivered = True
        if message.paged:
            assert self.store is not None
            message = self.store.load(message)  # type: ignore[arg-type]
        else:
            self.bytes -= len(message.body)
        return message, redelivered

    def peek(self) -> tuple[Message, bool] | None:
        """The head message and its redelivered flag, without taking it."""
        if not self.messages:
            return None
        message = self.messages[0]
        return message, id(message) in self._redelivered

    # -- messages out ------------------------------------------------------

    def _next_ready(self, message: Message) -> ConsumerSink | None:
        consumers = self.consumers
        n = len(consumers)
        for _ in range(n):
            index = self._rr % n
            self._rr = index + 1
            consumer = consumers[index]
            if consumer.ready() and not (
                consumer.no_local and message.publisher == consumer.connection_id
            ):
                return consumer
        return None

    def dispatch(self) -> None:
        """Hand queued messages to ready consumers until one side runs out."""
        messages = self.messages
        while messages and self.consumers:
            consumer = self._next_ready(messages[0])
            if consumer is None:
                return
            message, redelivered = self._pop()
            self.stats_out += 1
            if self.store is not None:
                self.store.delivered(message, consumer, consumer.no_ack)
            consumer.deliver(self, message, redelivered)

    def take(self, no_ack: bool = False, recipient: Any = None) -> Got | None:
        """Take the head message, if any, with its redelivered flag and what is left."""
        if not self.messages:
            return None
        self.stats_out += 1
        message, redelivered = self._pop()
        if self.store is not None:
            self.store.delivered(message, recipient, no_ack)
        return message, redelivered, len(self.messages)

    def get(self, no_ack: bool, reply: Reply, recipient: Any = None) -> None:
        """basic.get: answer ``reply`` with a ``Got``, or None if the queue is empty.
        ``recipient`` is where the message goes (its output can be held: stores)."""
        reply(self.take(no_ack, recipient))

    def drop_all(self) -> int:
        """Empty the queue; returns how many messages it held."""
        count = len(self.messages)
        if self.store is not None and count:
            self.store.purged(list(self.messages))
        self.messages.clear()
        self._redelivered.clear()
        self.bytes = 0
        return count

    def load_recovered(self, messages: Iterable[tuple[Message, bool]]) -> int:
        """Messages rebuilt from the store at start, in order (already on disk: a
        deep queue pages them straight out again)."""
        count = 0
        store = self.store
        for message, redelivered in messages:
            entry = message
            if store is not None and self.bytes > self.page_limit:
                entry = store.page_out(message) or message
            if entry is message:
                self.bytes += len(message.body)
            self.messages.append(entry)
            if redelivered:
                self._redelivered.add(id(entry))
            count += 1
        return count

    def replace_messages(self, messages: Iterable[tuple[Message, bool]]) -> None:
        """The queue's content replaced wholesale, with no store event (a replica
        promoted to master brings its copy; a demoted master hands its copy over).
        Entries may be paged stand-ins."""
        self.messages.clear()
        self._redelivered.clear()
        self.bytes = 0
        for message, redelivered in messages:
            self.messages.append(message)
            if redelivered:
                self._redelivered.add(id(message))
            if not message.paged:
                self.bytes += len(message.body)

    def purge(self, reply: Reply) -> None:
        """queue.purge: answer with the number of messages removed."""
        reply(self.drop_all())

    def stat(self, reply: Reply) -> None:
        """The (messages, consumers) counts a queue.declare-ok carries."""
        reply((self.message_count, self.consumer_count))

    # -- consumers -----------------------------------------------------------

    def check_consumer(self, consumer: ConsumerSink) -> None:
        """Refuse a consumer that exclusivity rules out (403, RabbitMQ's texts)."""
        if self.consumers and (consumer.exclusive or any(c.exclusive for c in self.consumers)):
            raise ChannelError(
                ACCESS_REFUSED,
                f"queue '{self.name}' in vhost '{self.vhost}' in exclusive use"
                if not consumer.exclusive
                else f"queue '{self.name}' in vhost '{self.vhost}' has consumers, "
                "cannot become exclusive",
            )

    def add_consumer(self, consumer: ConsumerSink, reply: Reply | None = None) -> None:
        """Attach a consumer; ``reply(None)`` (consume-ok) goes before any delivery,
        ``reply(error)`` refuses it. Without ``reply`` an error is raised."""
        try:
            self.check_consumer(consumer)
        except ChannelError as exc:
            if reply is None:
                raise
            reply(exc)
            return
        self.consumers.append(consumer)
        self.had_consumers = True
        if reply is not None:
            reply(None)
        self.dispatch()

    def remove_consumer(self, consumer: ConsumerSink) -> None:
        """Detach a consumer (cancel, channel gone); an auto-delete queue that has
        lost its last consumer goes (``on_unused``)."""
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        if self.unused_auto_delete and not self.deleted and self.on_unused is not None:
            self.on_unused(self)

    @property
    def unused_auto_delete(self) -> bool:
        """An auto-delete queue goes once it had consumers and the last one left."""
        return self.auto_delete and self.had_consumers and not self.consumers

    def __repr__(self) -> str:
        return f"<Queue {self.vhost}:{self.name} {len(self.messages)} ready>"
