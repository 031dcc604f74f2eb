"""Queues and the consumer interface they dispatch to."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

from brokerd.model.errors import precondition_failed
from brokerd.model.message import Message

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


class ConsumerSink(Protocol):
    """What a queue needs from a consumer; the channel layer implements it."""

    tag: str
    exclusive: bool
    no_local: bool
    connection_id: int

    def ready(self) -> bool:
        """Can it take one more message now (prefetch, flow, socket)?"""

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        """Send the message; the consumer now owns it until ack/reject."""

    def cancelled(self, queue: Queue) -> None:
        """The queue went away under the consumer (server-side cancel)."""


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
    """A FIFO of messages and a round-robin set of consumers."""

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
        #: counters for dumps, rates and the console: copies enqueued (or handed
        #: straight to a consumer), copies delivered or got, copies dropped by overflow
        self.stats_in = 0
        self.stats_out = 0
        self.stats_dropped = 0
        #: delivered copies not yet acked; the channel layer keeps it (it holds the tags)
        self.unacked = 0

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

    def push(self, message: Message) -> bool:
        """Enqueue (or hand straight to a ready consumer); False if refused by overflow."""
        self.stats_in += 1
        if not self.messages and self.consumers:
            consumer = self._next_ready(message)
            if consumer is not None:
                self.stats_out += 1
                consumer.deliver(self, message, False)
                return True
        max_length = self.max_length
        if max_length is not None and len(self.messages) >= max_length:
            if self.reject_publish:
                self.stats_in -= 1
                self.stats_dropped += 1
                return False
            while self.messages and len(self.messages) >= max_length:
                self._pop()
                self.stats_dropped += 1
            if max_length == 0:
                self.stats_dropped += 1
                return True
        self.messages.append(message)
        return True

    def requeue(self, messages: Iterable[Message]) -> None:
        """Put rejected/recovered messages back at the head, in their original order."""
        for message in reversed(list(messages)):
            self.messages.appendleft(message)
            self._redelivered.add(id(message))
        self.dispatch()

    def _pop(self) -> tuple[Message, bool]:
        message = self.messages.popleft()
        if self._redelivered and id(message) in self._redelivered:
            self._redelivered.discard(id(message))
            return message, True
        return message, False

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
            consumer.deliver(self, message, redelivered)

    def get(self) -> tuple[Message, bool] | None:
        """basic.get: take the head message, if any."""
        if not self.messages:
            return None
        self.stats_out += 1
        return self._pop()

    def purge(self) -> int:
        count = len(self.messages)
        self.messages.clear()
        self._redelivered.clear()
        return count

    # -- consumers -----------------------------------------------------------

    def add_consumer(self, consumer: ConsumerSink) -> None:
        self.consumers.append(consumer)
        self.had_consumers = True
        self.dispatch()

    def remove_consumer(self, consumer: ConsumerSink) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    @property
    def unused_auto_delete(self) -> bool:
        """An auto-delete queue goes once it had consumers and the last one left."""
        return self.auto_delete and self.had_consumers and not self.consumers

    def __repr__(self) -> str:
        return f"<Queue {self.vhost}:{self.name} {len(self.messages)} ready>"
