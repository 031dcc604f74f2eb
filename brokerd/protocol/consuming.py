"""Consuming on a channel: qos, consume, cancel, get, ack/nack/reject, recover.

The channel holds what it delivered and not yet settled (``unacked``: delivery
tag -> queue, message, consumer) and hands settlements back to the queue
(``ack``, ``reject``, ``requeue``), whatever the queue's type. Consume and get
answer through the queue's ``Reply`` callback, so a queue held by another
server answers when that server has; the channel holds later frames meanwhile.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands

from brokerd.model.errors import (
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    AMQPError,
    ConnectionError_,
    precondition_failed,
)
from brokerd.model.interfaces import Got
from brokerd.model.message import Message
from brokerd.model.queue import Queue
from brokerd.model.storage import Gate
from brokerd.wire import codec
from brokerd.wire.codec import INLINE_BODY

if TYPE_CHECKING:
    from brokerd.protocol.connection import Connection

#: an unsettled delivery: its queue, the message, the consumer (None for basic.get)
Unacked = tuple[Queue, Message, "Consumer | None"]


class Consumer:
    """A basic.consume subscription; implements the model's ConsumerSink."""

    __slots__ = (
        "channel",
        "connection",
        "connection_id",
        "exclusive",
        "no_ack",
        "no_local",
        "prefetch",
        "queue",
        "tag",
        "tag_raw",
        "unacked",
    )

    def __init__(
        self,
        channel: Consuming,
        queue: Queue,
        tag: str,
        *,
        no_ack: bool,
        exclusive: bool,
        no_local: bool,
        prefetch: int,
    ) -> None:
        self.channel = channel
        self.connection = channel.connection
        self.connection_id = channel.connection.id
        self.queue = queue
        self.tag = tag
        self.tag_raw = codec.shortstr(tag)
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.no_local = no_local
        self.prefetch = 0 if no_ack else prefetch
        self.unacked = 0

    @property
    def window(self) -> int:
        """Unacked deliveries it may hold at once (0: no limit): its own prefetch,
        else the channel's global one. A queue on another server sends no more."""
        return self.prefetch or (0 if self.no_ack else self.channel.global_prefetch)

    def ready(self) -> bool:
        ch = self.channel
        return (
            ch.flow
            and self.connection.writable
            and (not self.prefetch or self.unacked < self.prefetch)
            and (not ch.global_prefetch or ch.unacked_count < ch.global_prefetch)
        )

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        ch = self.channel
        tag = ch.next_tag
        ch.next_tag = tag + 1
        if not self.no_ack:
            ch.unacked[tag] = (queue, message, self)
            self.unacked += 1
            ch.unacked_count += 1
            queue.unacked += 1
        conn = self.connection
        conn.messages_out += 1
        conn.broker.messages_out += 1
        if redelivered:
            conn.broker.messages_redelivered += 1
        number = ch.number
        conn.write(codec.deliver_frame(number, self.tag_raw, tag, redelivered, message.tail))
        if len(message.body) <= INLINE_BODY:
            conn.write(message.content(number, conn.frame_max))
        else:
            conn.write_parts(message.content_parts(number, conn.frame_max))

    def cancelled(self, queue: Queue) -> None:
        self.channel.consumer_cancelled_by_server(self)

    def hold(self, gate: Gate) -> None:
        """A store holds this delivery until ``gate`` opens (Recipient)."""
        self.connection.hold_output(gate)


class Consuming:
    """The consuming half of a channel (a mixin of ``Channel``)."""

    connection: Connection
    number: int
    open: bool
    flow: bool
    tx: bool
    _tx_ops: list[Callable[[], None]]

    if TYPE_CHECKING:

        def _permit(self, kind: str, resource_type: str, name: str) -> None: ...
        def _queue_name(self, name: str) -> str: ...
        def _suspend(self, method: Any) -> None: ...
        def resume(self, action: Callable[[], None] | None) -> None: ...

    def _init_consuming(self) -> None:
        self.consumers: dict[str, Consumer] = {}
        self.unacked: OrderedDict[int, Unacked] = OrderedDict()
        self.unacked_count = 0
        self.next_tag = 1
        self.prefetch = 0
        self.global_prefetch = 0
        #: server cancels held while this channel deletes a queue (None: not deleting)
        self._held_cancels: list[str] | None = None

    # -- qos, consume, cancel -------------------------------------------------------

    def _on_basic_qos(self, m: commands.Basic.Qos) -> None:
        if m.prefetch_size:
            raise ConnectionError_(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})")
        # RabbitMQ semantics: global=false sets the limit for each new consumer,
        # global=true one limit shared by the whole channel
        if m.global_:
            self.global_prefetch = m.prefetch_count
        else:
            self.prefetch = m.prefetch_count
        self.connection.send_method(self.number, commands.Basic.QosOk())
        for queue in {c.queue for c in self.consumers.values()}:
            queue.dispatch()

    def _on_basic_consume(self, m: commands.Basic.Consume) -> None:
        conn = self.connection
        name = self._queue_name(m.queue)
        self._permit("read", "queue", name)
        queue = conn.vhost.queue(name, conn.id)
        tag = m.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        if tag in self.consumers:
            raise ConnectionError_(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        consumer = Consumer(
            self,
            queue,
            tag,
            no_ack=m.no_ack,
            exclusive=m.exclusive,
            no_local=m.no_local,
            prefetch=self.prefetch,
        )
        self.consumers[tag] = consumer  # the tag is taken while the queue answers

        def answered(error: AMQPError | None) -> None:
            def reply() -> None:
                if error is not None:
                    self.consumers.pop(tag, None)
                    raise error
                if not m.nowait:
                    conn.send_method(self.number, commands.Basic.ConsumeOk(tag))

            self.resume(reply)

        self._suspend(m)
        queue.add_consumer(consumer, answered)

    def _on_basic_cancel(self, m: commands.Basic.Cancel) -> None:
        consumer = self.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)
        if not m.nowait:
            self.connection.send_method(self.number, commands.Basic.CancelOk(m.consumer_tag))

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        """The queue was deleted: tell clients that understand basic.cancel from the server.
        While this channel is deleting a queue itself, the cancels wait for its
        queue.delete-ok, as RabbitMQ orders them (``hold_cancels``)."""
        if self.consumers.pop(consumer.tag, None) is None or not self.open:
            return
        if not self.connection.capabilities.get("consumer_cancel_notify"):
            return
        if self._held_cancels is not None:
            self._held_cancels.append(consumer.tag)
        else:
            self.connection.send_method(
                self.number, commands.Basic.Cancel(consumer.tag, nowait=True)
            )

    def hold_cancels(self) -> None:
        """This channel is deleting a queue: its own consumers' cancels wait."""
        if self._held_cancels is None:
            self._held_cancels = []

    def release_cancels(self) -> None:
        """The delete is answered: send the cancels it caused."""
        held, self._held_cancels = self._held_cancels, None
        if held and self.open:
            for tag in held:
                self.connection.send_method(self.number, commands.Basic.Cancel(tag, nowait=True))

    # -- get ---------------------------------------------------------------------------

    def _on_basic_get(self, m: commands.Basic.Get) -> None:
        conn = self.connection
        name = self._queue_name(m.queue)
        self._permit("read", "queue", name)
        queue = conn.vhost.queue(name, conn.id)

        def answered(got: Got | AMQPError | None) -> None:
            self.resume(lambda: self._get_reply(queue, got, m.no_ack))

        self._suspend(m)
        queue.get(m.no_ack, answered, self)

    def hold(self, gate: Gate) -> None:
        """A store holds a get-ok until ``gate`` opens (the channel is a Recipient)."""
        self.connection.hold_output(gate)

    def _get_reply(self, queue: Queue, got: Got | AMQPError | None, no_ack: bool) -> None:
        conn = self.connection
        if isinstance(got, AMQPError):
            raise got
        if got is None:
            conn.send_method(self.number, commands.Basic.GetEmpty())
            return
        message, redelivered, remaining = got
        tag = self.next_tag
        self.next_tag += 1
        if not no_ack:
            self.unacked[tag] = (queue, message, None)
            self.unacked_count += 1
            queue.unacked += 1
        conn.messages_out += 1
        conn.broker.messages_out += 1
        if redelivered:
            conn.broker.messages_redelivered += 1
        conn.send_method(
            self.number,
            commands.Basic.GetOk(
                tag, redelivered, message.exchange, message.routing_key, remaining
            ),
        )
        if len(message.body) <= INLINE_BODY:
            conn.write(message.content(self.number, conn.frame_max))
        else:
            conn.write_parts(message.content_parts(self.number, conn.frame_max))

    # -- settling ------------------------------------------------------------------

    def _take(self, tag: int, multiple: bool) -> list[Unacked]:
        """Remove and return the unacked deliveries an ack/nack/reject refers to."""
        unacked = self.unacked
        if multiple:
            if tag >= self.next_tag:
                raise precondition_failed(f"unknown delivery tag {tag}")
            taken = []
            while unacked:
                first = next(iter(unacked))
                if tag and first > tag:
                    break
                taken.append(unacked.popitem(last=False)[1])
            if not taken and tag:
                raise precondition_failed(f"unknown delivery tag {tag}")
        else:
            entry = unacked.pop(tag, None)
            if entry is None:
                raise precondition_failed(f"unknown delivery tag {tag}")
            taken = [entry]
        self.unacked_count -= len(taken)
        for queue, _message, consumer in taken:
            queue.unacked -= 1
            if consumer is not None:
                consumer.unacked -= 1
        return taken

    @staticmethod
    def _settle(taken: list[Unacked], outcome: str) -> None:
        """Hand settled deliveries back to their queues: ``ack``, ``reject`` or ``requeue``."""
        if len(taken) == 1:
            queue, message, _consumer = taken[0]
            getattr(queue, outcome)((message,))
            return
        by_queue: dict[Queue, list[Message]] = {}
        for queue, message, _consumer in taken:
            by_queue.setdefault(queue, []).append(message)
        for queue, messages in by_queue.items():
            getattr(queue, outcome)(messages)

    def _on_basic_ack(self, m: commands.Basic.Ack) -> None:
        if self.tx:
            self._tx_ops.append(lambda: self._ack(m.delivery_tag, m.multiple))
            return
        self._ack(m.delivery_tag, m.multiple)

    def _ack(self, tag: int, multiple: bool) -> None:
        taken = self._take(tag, multiple)
        self.connection.broker.messages_acked += len(taken)
        self._settle(taken, "ack")

    def _on_basic_nack(self, m: commands.Basic.Nack) -> None:
        self._reject(m.delivery_tag, m.multiple, m.requeue)

    def _on_basic_reject(self, m: commands.Basic.Reject) -> None:
        self._reject(m.delivery_tag, False, m.requeue)

    def _reject(self, tag: int, multiple: bool, requeue: bool) -> None:
        def apply() -> None:
            self._settle(self._take(tag, multiple), "requeue" if requeue else "reject")

        if self.tx:
            self._tx_ops.append(apply)
        else:
            apply()

    def _requeue_unacked(self, tags: list[int]) -> None:
        entries = []
        for tag in tags:
            entry = self.unacked.pop(tag, None)
            if entry is not None:
                entries.append(entry)
                entry[0].unacked -= 1
                if entry[2] is not None:
                    entry[2].unacked -= 1
        self.unacked_count -= len(entries)
        if entries:
            self._settle(entries, "requeue")

    def _on_basic_recover(self, m: commands.Basic.Recover | commands.Basic.RecoverAsync) -> None:
        if m.requeue:
            self._requeue_unacked(list(self.unacked))
        else:
            # redeliver to the original consumer where it still exists
            entries = list(self.unacked.items())
            self.unacked.clear()
            self.unacked_count = 0
            orphans = []
            for _tag, (queue, _message, consumer) in entries:
                queue.unacked -= 1
                if consumer is not None:
                    consumer.unacked -= 1
            for _tag, (queue, message, consumer) in entries:
                if consumer is not None and consumer.tag in self.consumers:
                    consumer.deliver(queue, message, True)
                else:
                    orphans.append((queue, message, consumer))
            if orphans:
                self._settle(orphans, "requeue")
        if isinstance(m, commands.Basic.Recover):
            self.connection.send_method(self.number, commands.Basic.RecoverOk())

    def _release_consumers(self) -> None:
        """The channel is going: cancel its consumers, requeue what it holds."""
        for consumer in list(self.consumers.values()):
            consumer.queue.remove_consumer(consumer)
        self.consumers.clear()
        self._requeue_unacked(list(self.unacked))
