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

Order: a queue is its FIFO (``messages``) plus a heap of requeued messages
(``_returned``). Every message gets a position when it enters; the FIFO's
positions are consecutive, so only its head's is stored, and a delivered
message's is kept until it is settled. A requeued one goes into the heap
under its old position, and since every position in the heap is below the
FIFO's head, the heap drains first, in position order: nacking 2, 3, 4, 5 of
1..6 brings them back as 2, 3, 4, 5 ahead of 6, as RabbitMQ does, at
O(log n) a message. TTL and x-expires are ``expiry.QueueExpiry``'s; the length
limits (x-max-length, x-overflow) ``overflow.QueueOverflow``'s; dead-lettering is
``deadletter``'s.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from brokerd.model.arguments import (
    OVERFLOW_MODES,
    QUEUE_ARGUMENTS,
    amqp_type_name,
    validate_queue_arguments,
)
from brokerd.model.consumers import QueueConsumers
from brokerd.model.deadletter import REJECTED
from brokerd.model.expiry import QueueExpiry
from brokerd.model.interfaces import ConsumerSink, Got, PublishWaiter, Reply
from brokerd.model.message import Message
from brokerd.model.overflow import QueueOverflow
from brokerd.model.storage import CorruptMessage, QueueStore

if TYPE_CHECKING:
    from brokerd.model.deadletter import DeadLetters

# the protocols a queue offers and needs live in ``interfaces``: import them from there
__all__ = [
    "OVERFLOW_MODES",
    "QUEUE_ARGUMENTS",
    "Queue",
    "amqp_type_name",
    "validate_queue_arguments",
]

#: bytes of message bodies a queue keeps in memory before it pages new ones out to
#: its store (the store's setting replaces it)
PAGE_LIMIT = 64 * 1024 * 1024


#: orders requeued messages of equal position (unknown ones): first requeued, first out
_TIEBREAK = itertools.count()


class Queue(QueueConsumers, QueueExpiry, QueueOverflow):
    """The local queue type: a FIFO of messages and a round-robin set of consumers.

    Standalone every queue is one; in a cluster the private (exclusive) queues
    are, and the root's master copy of each shared queue is kept in one.
    """

    # slots, not a __dict__: past 29 instance attributes CPython stops specialising
    # attribute access (shared-key dicts), and push/dispatch read a dozen per message
    # fmt: off
    __slots__ = (
        "_checked", "_dead_letter_refused", "_head_pos", "_paged_bytes", "_positions",
        "_redelivered", "_returned", "_rr", "arguments", "auto_delete", "bindings", "bytes",
        "consumers", "dead_letter_exchange", "dead_letter_routing_key", "dead_letters", "deleted",
        "delivering",
        "durable", "exclusive_owner", "face", "had_consumers", "max_length", "max_length_bytes",
        "messages", "name", "on_unused", "page_limit", "reject_publish", "stats_corrupt",
        "stats_dead_lettered", "stats_dropped", "stats_expired", "stats_in", "stats_out", "store",
        "timed", "unacked", "vhost",
    )
    # fmt: on

    def __init__(
        self,
        name: str,
        vhost: str,
        *,
        durable: bool = False,
        exclusive_owner: int | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        timed: bool = True,
    ) -> None:
        self.name = name
        #: the object consumers and stores are handed as "the queue" (their acks come
        #: back to it): this one, or a queue type that holds it (a cluster's shared
        #: queue, whose calls go through its role on this server)
        self.face: Any = self
        #: its TTL and x-expires timers run (a queue type holding it turns them off
        #: while its messages are elsewhere: another server owns a shared queue)
        self.timed = timed
        self.vhost = vhost
        self.durable = durable
        #: connection id owning an exclusive queue, else None (a shared queue)
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        #: ready messages never delivered (or handed over), oldest first; plain
        #: Message objects, so a deep queue costs one reference per message
        self.messages: deque[Message] = deque()
        #: requeued messages, a heap of (position, tiebreak, message): they go out
        #: before ``messages``, each where it was
        self._returned: list[tuple[int, int, Message]] = []
        #: the position of ``messages[0]`` (of the next message when it is empty)
        self._head_pos = 0
        #: the position of each delivered message not yet settled (keyed by the
        #: message itself: identity hash, no id() call)
        self._positions: dict[Message, int] = {}
        #: ids of FIFO entries that were delivered before (handed over, recovered)
        self._redelivered: set[int] = set()
        self.consumers: list[ConsumerSink] = []
        self.bindings: dict[tuple[Any, ...], Any] = {}
        self.had_consumers = False
        #: offers messages to its consumers (False: a queue being handed to another
        #: server delivers nothing, whatever frees a consumer's credit meanwhile)
        self.delivering = True
        self.deleted = False
        self._rr = 0
        self.max_length: int | None = self.arguments.get("x-max-length")
        self.max_length_bytes: int | None = self.arguments.get("x-max-length-bytes")
        overflow = self.arguments.get("x-overflow")
        self.reject_publish = overflow in ("reject-publish", "reject-publish-dlx")
        self._dead_letter_refused = overflow == "reject-publish-dlx"
        self.dead_letter_exchange: str | None = self.arguments.get("x-dead-letter-exchange")
        self.dead_letter_routing_key: str | None = self.arguments.get("x-dead-letter-routing-key")
        #: the vhost's dead-letter publisher (set when the vhost declares the queue)
        self.dead_letters: DeadLetters | None = None
        #: called when an auto-delete queue loses its last consumer, or an x-expires
        #: one has gone unused: the vhost removes it (the cluster orders the
        #: removal of a shared one)
        self.on_unused: Callable[[Queue], None] | None = None
        #: counters for dumps, rates and the console: copies enqueued (or handed
        #: straight to a consumer), copies delivered or got, copies dropped by
        #: overflow, expired, dead-lettered (copies made for the DLX)
        self.stats_in = 0
        self.stats_out = 0
        self.stats_dropped = 0
        self.stats_expired = 0
        self.stats_dead_lettered = 0
        #: paged messages whose record the store found damaged: skipped, never delivered
        self.stats_corrupt = 0
        #: delivered copies not yet acked; the channel layer keeps it (it holds the tags)
        self.unacked = 0
        #: this queue's part of the message store (journal, flow to disk); None: none
        self.store: QueueStore | None = None
        #: bytes of the bodies of queued messages held in memory; past ``page_limit``
        #: new arrivals are paged out to the store (flow to disk)
        self.bytes = 0
        #: bytes of the bodies of queued messages paged out (with ``bytes``: the
        #: ready bytes x-max-length-bytes bounds)
        self._paged_bytes = 0
        self.page_limit = PAGE_LIMIT
        self._init_expiry()
        #: a TTL or a length limit applies to every message: push checks each
        self._checked = (
            self.message_ttl is not None
            or self.max_length is not None
            or self.max_length_bytes is not None
        )

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def message_count(self) -> int:
        return len(self.messages) + len(self._returned)

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
        if self.consumers and self.delivering and not self.messages and not self._returned:
            consumer = self._next_ready(message)
            if consumer is not None:
                if not consumer.no_ack:  # a position for a requeue (none can come back)
                    position = self._head_pos
                    self._head_pos = position + 1
                    self._positions[message] = position
                    if self.message_ttl is not None or message.expiring:
                        self._keep_deadline(position, message)
                self.stats_out += 1
                if store is not None:
                    if store.tracks_enqueues:
                        store.enqueued(message, waiter)
                    store.delivered(message, consumer, consumer.no_ack)
                consumer.deliver(self.face, message, False)
                return True
        if self._checked or message.expiring:  # a TTL or a length limit
            return self._push_checked(message, waiter)
        if store is not None:
            if store.tracks_enqueues:
                store.enqueued(message, waiter)
            if self.bytes > self.page_limit and (stub := store.page_out(message)) is not None:
                self.messages.append(stub)  # flow to disk: the body leaves memory
                self._paged_bytes += stub.length
                return True
        self.messages.append(message)
        self.bytes += len(message.body)
        return True

    def _keep_deadline(self, position: int, message: Message) -> None:
        deadline = self._deadline(message)
        if deadline is not None:
            self._deadlines[position] = deadline

    # -- settling deliveries -------------------------------------------------

    def _settled(self, messages: Sequence[Message]) -> None:
        """Delivered messages are settled for good: their positions (and deadlines) go."""
        positions = self._positions
        deadlines = self._deadlines
        for message in messages:
            position = positions.pop(message, None)
            if deadlines and position is not None:
                deadlines.pop(position, None)

    def ack(self, messages: Sequence[Message]) -> None:
        """Delivered messages were acked: forget them, and use the freed credit."""
        positions = self._positions
        if positions:
            if self._deadlines:
                self._settled(messages)
            else:
                for message in messages:
                    positions.pop(message, None)
        if self.store is not None:
            self.store.dequeued(messages)
        if self.messages or self._returned:
            self.dispatch()

    def reject(self, messages: Iterable[Message]) -> None:
        """Delivered messages were rejected without requeue: dropped, or dead-lettered."""
        messages = list(messages)
        if self._positions:
            self._settled(messages)
        if self.store is not None:
            self.store.dequeued(messages)
        if not self.deleted:
            self._dead_letter(messages, REJECTED)
        if self.messages or self._returned:
            self.dispatch()

    def requeue(self, messages: Iterable[Message]) -> None:
        """Put rejected/recovered messages back where they were in the queue (one
        whose position is unknown goes to the head)."""
        if self.deleted:
            return
        messages = list(messages)
        positions = self._positions
        returned = self._returned
        for message in messages:
            heapq.heappush(returned, (positions.pop(message, -1), next(_TIEBREAK), message))
            if message.paged:
                self._paged_bytes += message.length  # type: ignore[attr-defined]
            else:
                self.bytes += len(message.body)
        if self.store is not None:
            self.store.requeued(messages)
        if self._deadlines:  # they keep their deadlines: due ones go, not out again
            self._expire_head()
            self._arm_expiry()
        self.dispatch()

    def restore(self, message: Message, waiter: PublishWaiter | None = None) -> None:
        """A message delivered once before comes back from elsewhere (another server,
        a former master, a forward re-sent after a failover): enqueue it at the tail,
        flagged redelivered; ``waiter`` as for ``push`` (a confirm waits for it)."""
        self.stats_in += 1
        store = self.store
        if store is not None:
            # flagged in the store too: a journal must bring it back flagged after a
            # restart, and a replicated queue's replicas must keep the flag, or a copy
            # promoted after a failover would lose it
            store.enqueued(message, waiter, redelivered=True)
        deadline = self._deadline(message)
        if not self.messages and not self._returned and self.consumers:
            consumer = self._next_ready(message)
            if consumer is not None:
                position = self._head_pos
                self._head_pos = position + 1
                if not consumer.no_ack:
                    self._positions[message] = position
                    if deadline is not None:
                        self._deadlines[position] = deadline
                self.stats_out += 1
                if store is not None:
                    store.delivered(message, consumer, consumer.no_ack)
                consumer.deliver(self.face, message, True)
                return
        if deadline is not None:
            self._deadlines[self._head_pos + len(self.messages)] = deadline
        self.messages.append(message)
        self.bytes += len(message.body)
        self._redelivered.add(id(message))
        if self._deadlines:
            self._arm_expiry()

    def _dead_letter(self, messages: list[Message], reason: str) -> None:
        """Messages leave for ``reason``: to the DLX if there is one (counted either way)."""
        if self.dead_letters is not None and messages:
            self.stats_dead_lettered += self.dead_letters.publish(self, messages, reason)

    # -- the head ------------------------------------------------------------

    def _pop(self, past_corrupt: bool = True) -> tuple[Message, bool, int] | None:
        """Take the head: the message (loaded if paged), its redelivered flag, its
        position. A paged one the store finds corrupt is dropped (``_lost``) and the
        next one taken, or None returned if ``past_corrupt`` is False (the caller
        chose by the head) or nothing else was left."""
        returned = self._returned
        while self.messages or returned:
            if returned:
                position, _, message = heapq.heappop(returned)
                redelivered = True
            else:
                message = self.messages.popleft()
                position = self._head_pos
                self._head_pos = position + 1
                redelivered = False
                if self._redelivered and id(message) in self._redelivered:
                    self._redelivered.discard(id(message))
                    redelivered = True
            if message.paged:
                assert self.store is not None
                self._paged_bytes -= message.length  # type: ignore[attr-defined]
                try:
                    message = self.store.load(message)  # type: ignore[arg-type]
                except CorruptMessage:
                    self._lost(position)
                    if past_corrupt:
                        continue
                    return None
            else:
                self.bytes -= len(message.body)
            return message, redelivered, position
        return None

    def _lost(self, position: int) -> None:
        """A paged message at ``position`` could not be read back intact: the store
        has logged it and set it aside; here it is counted and forgotten."""
        self.stats_corrupt += 1
        if self._deadlines:
            self._deadlines.pop(position, None)

    def _head_position(self) -> int:
        returned = self._returned
        return returned[0][0] if returned else self._head_pos

    def peek(self) -> tuple[Message, bool] | None:
        """The head message and its redelivered flag, without taking it."""
        if self._returned:
            return self._returned[0][2], True
        if not self.messages:
            return None
        message = self.messages[0]
        return message, id(message) in self._redelivered

    def ready(self) -> list[tuple[Message, bool]]:
        """The ready messages in the order they will go out, with their redelivered
        flags (dumps and tests; a copy, O(n log n))."""
        returned = [(message, True) for _, _, message in sorted(self._returned)]
        return returned + [(m, id(m) in self._redelivered) for m in self.messages]

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
        if not self.delivering:
            return
        messages = self.messages
        returned = self._returned
        deadlines = self._deadlines
        if not returned and not deadlines:
            self._dispatch_fifo()
            return
        while (messages or returned) and self.consumers:
            if deadlines:
                self._expire_head()  # a message past its deadline is never delivered
                if not (messages or returned):
                    break
            consumer = self._next_ready(returned[0][2] if returned else messages[0])
            if consumer is None:
                break
            popped = self._pop(past_corrupt=False)
            if popped is None:
                continue  # the head was corrupt (dropped): choose for the next one
            message, redelivered, position = popped
            if consumer.no_ack:
                if deadlines:
                    deadlines.pop(position, None)
            else:
                self._positions[message] = position
            self.stats_out += 1
            if self.store is not None:
                self.store.delivered(message, consumer, consumer.no_ack)
            consumer.deliver(self.face, message, redelivered)
        if deadlines:
            self._arm_expiry()

    def _dispatch_fifo(self) -> None:
        """``dispatch`` when nothing was requeued and nothing has a deadline: the
        FIFO alone, ``_pop`` inlined (the path every throughput benchmark takes)."""
        messages = self.messages
        returned = self._returned
        positions = self._positions
        seen = self._redelivered
        store = self.store
        face = self.face
        while messages and self.consumers and not returned:
            consumer = self._next_ready(messages[0])
            if consumer is None:
                return
            message = messages.popleft()
            position = self._head_pos
            self._head_pos = position + 1
            redelivered = False
            if seen and id(message) in seen:
                seen.discard(id(message))
                redelivered = True
            if message.paged:
                assert store is not None
                self._paged_bytes -= message.length  # type: ignore[attr-defined]
                try:
                    message = store.load(message)  # type: ignore[arg-type]
                except CorruptMessage:
                    self._lost(position)
                    continue
            else:
                self.bytes -= len(message.body)
            if not consumer.no_ack:
                positions[message] = position
            self.stats_out += 1
            if store is not None:
                store.delivered(message, consumer, consumer.no_ack)
            consumer.deliver(face, message, redelivered)

    def take(self, no_ack: bool = False, recipient: Any = None) -> Got | None:
        """Take the head message, if any, with its redelivered flag and what is left."""
        self.touch()
        deadlines = self._deadlines
        popped = None
        while popped is None and (self.messages or self._returned):
            if deadlines:
                self._expire_head()
            popped = self._pop(past_corrupt=False)  # None: corrupt, dropped; the next
        if popped is None:
            return None
        self.stats_out += 1
        message, redelivered, position = popped
        if no_ack:
            if deadlines:
                deadlines.pop(position, None)
        else:
            self._positions[message] = position
        if self.store is not None:
            self.store.delivered(message, recipient, no_ack)
        if deadlines:
            self._expire_head()
            self._arm_expiry()
        return message, redelivered, self.message_count

    def get(self, no_ack: bool, reply: Reply, recipient: Any = None) -> None:
        """basic.get: answer ``reply`` with a ``Got``, or None if the queue is empty.
        ``recipient`` is where the message goes (its output can be held: stores)."""
        reply(self.take(no_ack, recipient))

    def drop_all(self) -> int:
        """Empty the queue; returns how many messages it held."""
        count = self.message_count
        if self.store is not None and count:
            self.store.purged([*(entry[2] for entry in self._returned), *self.messages])
        deadlines = self._deadlines
        if deadlines:
            for position, _, _ in self._returned:
                deadlines.pop(position, None)
            for position in range(self._head_pos, self._head_pos + len(self.messages)):
                deadlines.pop(position, None)
        self._head_pos += len(self.messages)
        self.messages.clear()
        self._returned.clear()
        self._redelivered.clear()
        self.bytes = self._paged_bytes = 0
        return count

    def clear(self) -> None:
        """Forget the contents and the deliveries with no store event (a queue type
        holding this one hands them over elsewhere) and stop the timers."""
        self._head_pos += len(self.messages)
        self.messages.clear()
        self._returned.clear()
        self._redelivered.clear()
        self._positions.clear()
        self._deadlines.clear()
        self.bytes = self._paged_bytes = 0
        self.stop_timers()

    def load_recovered(self, messages: Iterable[tuple[Message, bool]]) -> int:
        """Messages rebuilt from the store at start, in order (already on disk: a
        deep queue pages them straight out again, and the store hands the tail past
        its memory as paged stand-ins). A TTL counts from now: the
        journal keeps no enqueue time."""
        count = 0
        store = self.store
        for message, redelivered in messages:
            entry = message  # a paged one was left on disk by the store (a deep tail)
            if not message.paged and store is not None and self.bytes > self.page_limit:
                entry = store.page_out(message) or message
            if entry.paged:
                self._paged_bytes += entry.length  # type: ignore[attr-defined]
            else:
                self.bytes += len(entry.body)
            if self.message_ttl is not None or message.expiring:
                self._keep_deadline(self._head_pos + len(self.messages), message)
            self.messages.append(entry)
            if redelivered:
                self._redelivered.add(id(entry))
            count += 1
        if self._deadlines:
            self._arm_expiry()
        return count

    def replace_messages(self, messages: Iterable[tuple[Message, bool]]) -> None:
        """The queue's content replaced wholesale, in its original order, with no
        store event (a replica promoted to master brings its copy; a demoted
        master hands its copy over). Entries may be paged stand-ins. A TTL counts
        from now: a replica keeps no enqueue time."""
        self.clear()
        for message, redelivered in messages:
            if self.message_ttl is not None or message.expiring:
                self._keep_deadline(self._head_pos + len(self.messages), message)
            self.messages.append(message)
            if redelivered:
                self._redelivered.add(id(message))
            if message.paged:
                self._paged_bytes += message.length  # type: ignore[attr-defined]
            else:
                self.bytes += len(message.body)

    def purge(self, reply: Reply) -> None:
        """queue.purge: answer with the number of messages removed."""
        reply(self.drop_all())

    def stat(self, reply: Reply) -> None:
        """The (messages, consumers) counts a queue.declare-ok carries."""
        self.touch()
        reply((self.message_count, self.consumer_count))

    def __repr__(self) -> str:
        return f"<Queue {self.vhost}:{self.name} {self.message_count} ready>"
