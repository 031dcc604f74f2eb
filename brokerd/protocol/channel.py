"""The AMQP channel: wiring methods, publishing, consuming, acknowledgements.

A channel turns decoded methods into calls on the broker model and model
callbacks (deliveries, cancels) into frames on its connection. Publishing
and delivery take a fast path that avoids pamqp objects.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.model.errors import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NO_ROUTE,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    UNEXPECTED_FRAME,
    AMQPError,
    ChannelError,
    ConnectionError_,
    access_refused,
    precondition_failed,
)
from brokerd.model.exchange import Exchange
from brokerd.model.message import Message
from brokerd.model.queue import Queue
from brokerd.wire import codec
from brokerd.wire.codec import FRAME_BODY, FRAME_HEADER, FRAME_METHOD, SyntaxError_, UnknownMethod

if TYPE_CHECKING:
    from brokerd.protocol.connection import Connection

log = logging.getLogger("brokerd.channel")

_PUBLISH_ID = bytes((0, 60, 0, 40))


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
        channel: Channel,
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
        conn.write(message.content(number, conn.frame_max))

    def cancelled(self, queue: Queue) -> None:
        self.channel.consumer_cancelled_by_server(self)


class Channel:
    """One open channel of a connection."""

    def __init__(self, connection: Connection, number: int) -> None:
        self.connection = connection
        self.number = number
        self.open = True
        self.flow = True
        self.consumers: dict[str, Consumer] = {}
        self.unacked: OrderedDict[int, tuple[Queue, Message, Consumer | None]] = OrderedDict()
        self.unacked_count = 0
        self.next_tag = 1
        self.prefetch = 0
        self.global_prefetch = 0
        self.last_queue: str | None = None
        # confirms and transactions
        self.confirm = False
        self.publish_seq = 0
        self._confirms: list[tuple[int, bool]] = []
        self.tx = False
        self._tx_ops: list[Callable[[], None]] = []
        # content being assembled: (exchange, routing_key, mandatory), props, parts, size
        self._publish: tuple[str, str, bool] | None = None
        self._props = b""
        self._parts: list[bytes] = []
        self._size = 0
        self._received = 0
        self._write_allowed: dict[str, bool] = {}
        #: frames received while a wiring change waits for the cluster (None: not holding)
        self._held: list[tuple[int, bytes]] | None = None
        self._deferred: Method | None = None

    # -- frames in -------------------------------------------------------------

    def handle_method(self, payload: bytes) -> None:
        if self._held is not None:
            self._held.append((FRAME_METHOD, payload))
            return
        if not self.open:
            self._handle_while_closing(payload)
            return
        if self._publish is not None:
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                f"expected content header for basic.publish on channel {self.number}",
            )
        if payload[:4] == _PUBLISH_ID:
            try:
                exchange, routing_key, mandatory, immediate = codec.decode_publish(payload)
            except SyntaxError_ as exc:
                raise ConnectionError_(502, str(exc)) from None
            if immediate:
                raise ConnectionError_(NOT_IMPLEMENTED, "immediate=true")
            self._publish = (exchange, routing_key, mandatory)
            return
        method = self._decode(payload)
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise ConnectionError_(
                COMMAND_INVALID, f"method {method.name} is not allowed on a channel"
            )
        try:
            handler(self, method)
        except ChannelError as exc:
            exc.method_id = (method.index >> 16, method.index & 0xFFFF)  # type: ignore[attr-defined]
            raise

    def _decode(self, payload: bytes) -> Method:
        try:
            return codec.decode_method(payload)
        except UnknownMethod as exc:
            raise ConnectionError_(NOT_IMPLEMENTED, str(exc)) from None
        except SyntaxError_ as exc:
            raise ConnectionError_(502, str(exc)) from None

    def _handle_while_closing(self, payload: bytes) -> None:
        """After we sent channel.close, only close-ok (or a crossing close) counts."""
        try:
            method = codec.decode_method(payload)
        except (SyntaxError_, UnknownMethod):
            return
        if isinstance(method, commands.Channel.CloseOk):
            self.connection.channel_closed(self.number)
        elif isinstance(method, commands.Channel.Close):
            self.connection.send_method(self.number, commands.Channel.CloseOk())
            self.connection.channel_closed(self.number)

    def handle_header(self, payload: bytes) -> None:
        if self._held is not None:
            self._held.append((FRAME_HEADER, payload))
            return
        if not self.open:
            return
        if self._publish is None or self._parts or self._props:
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"unexpected content header on channel {self.number}"
            )
        try:
            class_id, size, props = codec.decode_header(payload)
        except SyntaxError_ as exc:
            raise ConnectionError_(502, str(exc)) from None
        if class_id != 60:
            raise ConnectionError_(UNEXPECTED_FRAME, f"content header for class {class_id}")
        limit = self.connection.broker.limits.max_message_size
        if size > limit:
            self._publish = None
            raise precondition_failed(
                f"message size {size} is larger than configured max size {limit}"
            )
        self._props = props
        self._size = size
        self._received = 0
        if size == 0:
            self._content_complete(b"")

    def handle_body(self, payload: bytes) -> None:
        if self._held is not None:
            self._held.append((FRAME_BODY, payload))
            return
        if not self.open:
            return
        if self._publish is None or not self._props:
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"unexpected content body on channel {self.number}"
            )
        received = self._received + len(payload)
        if received > self._size:
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"content body exceeds the declared size {self._size}"
            )
        if received == self._size:
            if self._parts:
                self._parts.append(payload)
                body = b"".join(self._parts)
                self._parts = []
            else:
                body = payload
            self._content_complete(body)
        else:
            self._parts.append(payload)
            self._received = received

    # -- publishing --------------------------------------------------------------

    def _content_complete(self, body: bytes) -> None:
        exchange_name, routing_key, mandatory = self._publish  # type: ignore[misc]
        props = self._props
        self._publish = None
        self._props = b""
        conn = self.connection
        if self.confirm:
            self.publish_seq += 1
        message = Message(exchange_name, routing_key, props, body, conn.id)
        if self.tx:
            self._check_publish(exchange_name)
            self._tx_ops.append(lambda: self._route(message, mandatory))
            return
        try:
            self._route(message, mandatory)
        except ChannelError as exc:
            exc.method_id = (60, 40)  # type: ignore[attr-defined]
            raise

    def _check_publish(self, exchange_name: str) -> Exchange:
        vhost = self.connection.vhost
        exchange = vhost.exchange(exchange_name)
        allowed = self._write_allowed.get(exchange_name)
        if allowed is None:
            try:
                self._permit("write", "exchange", exchange_name)
                allowed = True
            except ChannelError:
                allowed = False
            self._write_allowed[exchange_name] = allowed
        if not allowed:
            self._permit("write", "exchange", exchange_name)
        if exchange.internal:
            raise access_refused(
                f"cannot publish to internal exchange '{exchange_name}' in vhost '{vhost.name}'"
            )
        return exchange

    def _route(self, message: Message, mandatory: bool) -> None:
        conn = self.connection
        exchange = self._check_publish(message.exchange)
        if exchange.muxer.client_traffic:
            conn.messages_in += 1
            conn.broker.messages_in += 1
        queues = conn.vhost.route(exchange, message)
        accepted = True
        if queues:
            conn.broker.messages_routed += len(queues)
            for queue in queues:
                if not queue.push(message):
                    accepted = False
                    conn.broker.messages_routed -= 1
        elif mandatory:
            self.send_return(NO_ROUTE, "NO_ROUTE", message)
        if self.confirm:
            self._confirms.append((self.publish_seq, accepted))
            conn._confirm_dirty.add(self)

    def send_return(self, code: int, text: str, message: Message) -> None:
        conn = self.connection
        if not conn.may_return():
            return
        conn.broker.messages_returned += 1
        conn.send_method(
            self.number,
            commands.Basic.Return(code, text, message.exchange, message.routing_key),
        )
        conn.write(message.content(self.number, conn.frame_max))

    def flush_confirms(self) -> None:
        """Send pending confirms, folding runs of acks into one ``multiple`` ack."""
        confirms = self._confirms
        if not confirms or not self.open:
            confirms.clear()
            return
        send = self.connection.send_method
        run_end = 0
        for seq, ok in confirms:
            if ok:
                run_end = seq
                continue
            if run_end:
                send(self.number, commands.Basic.Ack(run_end, multiple=True))
                run_end = 0
            send(self.number, commands.Basic.Nack(seq, multiple=False, requeue=False))
        if run_end:
            send(self.number, commands.Basic.Ack(run_end, multiple=True))
        confirms.clear()

    # -- replication of wiring (cluster) -------------------------------------------

    def _reply(self, method: Method, reply: Method, *, changed: bool) -> None:
        """Send a wiring method's -Ok, after the cluster has ordered the change if it
        changed shared wiring; the channel holds later frames meanwhile."""
        hooks = self.connection.hooks
        if changed and hooks is not None and hooks.replicate(self.connection, self, method):
            self._held = []
            self._deferred = None if getattr(method, "nowait", False) else reply
            return
        if not getattr(method, "nowait", False):
            self.connection.send_method(self.number, reply)

    def replicated(self, error: AMQPError | None) -> None:
        """The cluster ordered (or refused) the change this channel is holding for."""
        held, self._held = self._held, None
        reply, self._deferred = self._deferred, None
        if held is None or not self.open:
            return
        conn = self.connection
        if error is not None:
            if error.connection_level:
                conn.connection_error(error.reply_code, error.text)
            else:
                self.close_by_server(error)
            return
        if reply is not None:
            conn.send_method(self.number, reply)
        for index, (kind, payload) in enumerate(held):
            try:
                if kind == FRAME_METHOD:
                    self.handle_method(payload)
                elif kind == FRAME_HEADER:
                    self.handle_header(payload)
                else:
                    self.handle_body(payload)
            except AMQPError as exc:
                conn._amqp_error(exc, self.number)
                return
            if self._held is not None:  # a later method is being replicated in turn
                self._held.extend(held[index + 1 :])
                break
        conn._flush_confirms()

    # -- permissions ----------------------------------------------------------------

    def _permit(self, kind: str, resource_type: str, name: str) -> None:
        conn = self.connection
        conn.broker.users.check(conn.user, conn.vhost.name, kind, resource_type, name)

    def _queue_name(self, name: str) -> str:
        """AMQP: an empty queue name means the last queue declared on this channel."""
        if name:
            return name
        if self.last_queue is None:
            raise ConnectionError_(NOT_ALLOWED, "no previously declared queue")
        return self.last_queue

    # -- channel class -----------------------------------------------------------

    def _on_close(self, method: commands.Channel.Close) -> None:
        self.flush_confirms()  # acks of earlier publishes precede close-ok
        self.release()
        self.connection.send_method(self.number, commands.Channel.CloseOk())
        self.connection.channel_closed(self.number)

    def _on_close_ok(self, method: commands.Channel.CloseOk) -> None:
        raise ConnectionError_(COMMAND_INVALID, "channel.close-ok without channel.close")

    def _on_flow(self, method: commands.Channel.Flow) -> None:
        self.flow = bool(method.active)
        self.connection.send_method(self.number, commands.Channel.FlowOk(self.flow))
        if self.flow:
            for queue in {c.queue for c in self.consumers.values()}:
                queue.dispatch()

    def _on_open(self, method: commands.Channel.Open) -> None:
        raise ConnectionError_(504, f"channel {self.number} is already open")

    def close_by_server(self, exc: AMQPError) -> None:
        """A channel exception: say why, release resources, await close-ok."""
        class_id, method_id = getattr(exc, "method_id", (0, 0))
        log.info(
            "channel.error conn=%d channel=%d code=%d text=%r",
            self.connection.id,
            self.number,
            exc.reply_code,
            exc.text,
        )
        self.release()
        self.connection.send_method(
            self.number, commands.Channel.Close(exc.reply_code, exc.reply_text, class_id, method_id)
        )

    def release(self) -> None:
        """Cancel consumers and requeue unacknowledged messages (channel or connection gone)."""
        if not self.open:
            return
        self.open = False
        self._held = None
        self._publish = None
        self._parts = []
        self._confirms.clear()
        for consumer in list(self.consumers.values()):
            self._remove_consumer(consumer)
        self.consumers.clear()
        self._requeue_unacked(list(self.unacked))

    # -- exchange class ----------------------------------------------------------

    def _on_exchange_declare(self, m: commands.Exchange.Declare) -> None:
        vhost = self.connection.vhost
        if not m.passive:
            self._permit("configure", "exchange", m.exchange)
        _exchange, created = vhost.declare_exchange(
            m.exchange,
            m.exchange_type or "direct",
            passive=m.passive,
            durable=m.durable,
            auto_delete=m.auto_delete,
            internal=m.internal,
            arguments=m.arguments or {},
        )
        self._reply(m, commands.Exchange.DeclareOk(), changed=created)

    def _on_exchange_delete(self, m: commands.Exchange.Delete) -> None:
        self._permit("configure", "exchange", m.exchange)
        deleted = self.connection.vhost.delete_exchange(m.exchange, if_unused=m.if_unused)
        self._reply(m, commands.Exchange.DeleteOk(), changed=deleted is not None)

    def _on_exchange_bind(self, m: commands.Exchange.Bind) -> None:
        vhost = self.connection.vhost
        self._permit("write", "exchange", m.destination)
        self._permit("read", "exchange", m.source)
        source = vhost.exchange(m.source)
        before = len(source.bindings)
        vhost.bind(source, vhost.exchange(m.destination), m.routing_key, m.arguments or {})
        self._reply(m, commands.Exchange.BindOk(), changed=len(source.bindings) != before)

    def _on_exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        vhost = self.connection.vhost
        self._permit("write", "exchange", m.destination)
        self._permit("read", "exchange", m.source)
        source = vhost.exchanges.get(m.source)
        destination = vhost.exchanges.get(m.destination)
        if source is None or destination is None:
            # RabbitMQ: the binding is gone with its exchange, so unbinding succeeds
            self._reply(m, commands.Exchange.UnbindOk(), changed=False)
            return
        before = len(source.bindings)
        vhost.unbind(source, destination, m.routing_key, m.arguments or {})
        self._reply(m, commands.Exchange.UnbindOk(), changed=len(source.bindings) != before)

    # -- queue class ---------------------------------------------------------------

    def _on_queue_declare(self, m: commands.Queue.Declare) -> None:
        conn = self.connection
        name = m.queue
        if not m.passive:
            # RabbitMQ checks configure on a server-named queue's generated name too
            name = name or conn.vhost.server_queue_name()
            self._permit("configure", "queue", name)
        queue, created = conn.vhost.declare_queue(
            name,
            server_named=not m.queue,
            connection_id=conn.id,
            passive=m.passive,
            durable=m.durable,
            exclusive=m.exclusive,
            auto_delete=m.auto_delete,
            arguments=m.arguments or {},
        )
        self.last_queue = queue.name
        m.queue = queue.name  # a server-named queue replicates under its name
        self._reply(
            m,
            commands.Queue.DeclareOk(queue.name, queue.message_count, queue.consumer_count),
            changed=created,
        )

    def _on_queue_bind(self, m: commands.Queue.Bind) -> None:
        conn = self.connection
        name = self._queue_name(m.queue)
        self._permit("write", "queue", name)
        self._permit("read", "exchange", m.exchange)
        queue = conn.vhost.queue(name, conn.id)
        before = len(queue.bindings)
        conn.vhost.bind(conn.vhost.exchange(m.exchange), queue, m.routing_key, m.arguments or {})
        m.queue = name
        self._reply(m, commands.Queue.BindOk(), changed=len(queue.bindings) != before)

    def _on_queue_unbind(self, m: commands.Queue.Unbind) -> None:
        conn = self.connection
        name = self._queue_name(m.queue)
        self._permit("write", "queue", name)
        self._permit("read", "exchange", m.exchange)
        exchange = conn.vhost.exchanges.get(m.exchange)
        if name not in conn.vhost.queues or exchange is None:
            # RabbitMQ: the binding is gone with its queue or exchange; unbind-ok
            # (aio-pika's RPC.close() unbinds after its auto-delete queue went)
            self._reply(m, commands.Queue.UnbindOk(), changed=False)
            return
        queue = conn.vhost.queue(name, conn.id)
        before = len(queue.bindings)
        conn.vhost.unbind(exchange, queue, m.routing_key, m.arguments or {})
        m.queue = name
        self._reply(m, commands.Queue.UnbindOk(), changed=len(queue.bindings) != before)

    def _on_queue_purge(self, m: commands.Queue.Purge) -> None:
        conn = self.connection
        name = self._queue_name(m.queue)
        self._permit("read", "queue", name)
        count = conn.vhost.queue(name, conn.id).purge()
        if not m.nowait:
            conn.send_method(self.number, commands.Queue.PurgeOk(count))

    def _on_queue_delete(self, m: commands.Queue.Delete) -> None:
        conn = self.connection
        name = self._queue_name(m.queue)
        self._permit("configure", "queue", name)
        existed = conn.vhost.queues.get(name)
        count = conn.vhost.delete_queue(
            name, connection_id=conn.id, if_unused=m.if_unused, if_empty=m.if_empty
        )
        m.queue = name
        shared = existed is not None and not existed.exclusive
        self._reply(m, commands.Queue.DeleteOk(count), changed=shared)

    # -- basic class -----------------------------------------------------------------

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
        if queue.consumers and (m.exclusive or any(c.exclusive for c in queue.consumers)):
            raise ChannelError(
                ACCESS_REFUSED,
                f"queue '{name}' in vhost '{conn.vhost.name}' in exclusive use"
                if not m.exclusive
                else f"queue '{name}' in vhost '{conn.vhost.name}' has consumers, "
                "cannot become exclusive",
            )
        consumer = Consumer(
            self,
            queue,
            tag,
            no_ack=m.no_ack,
            exclusive=m.exclusive,
            no_local=m.no_local,
            prefetch=self.prefetch,
        )
        self.consumers[tag] = consumer
        if not m.nowait:
            conn.send_method(self.number, commands.Basic.ConsumeOk(tag))
        queue.add_consumer(consumer)

    def _on_basic_cancel(self, m: commands.Basic.Cancel) -> None:
        consumer = self.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            self._remove_consumer(consumer)
        if not m.nowait:
            self.connection.send_method(self.number, commands.Basic.CancelOk(m.consumer_tag))

    def _remove_consumer(self, consumer: Consumer) -> None:
        queue = consumer.queue
        queue.remove_consumer(consumer)
        if queue.unused_auto_delete and not queue.deleted:
            self.connection.vhost.remove_queue(queue)

    def consumer_cancelled_by_server(self, consumer: Consumer) -> None:
        """The queue was deleted: tell clients that understand basic.cancel from the server."""
        if self.consumers.pop(consumer.tag, None) is None or not self.open:
            return
        if self.connection.capabilities.get("consumer_cancel_notify"):
            self.connection.send_method(
                self.number, commands.Basic.Cancel(consumer.tag, nowait=True)
            )

    def _on_basic_get(self, m: commands.Basic.Get) -> None:
        conn = self.connection
        name = self._queue_name(m.queue)
        self._permit("read", "queue", name)
        queue = conn.vhost.queue(name, conn.id)
        entry = queue.get()
        if entry is None:
            conn.send_method(self.number, commands.Basic.GetEmpty())
            return
        message, redelivered = entry
        tag = self.next_tag
        self.next_tag += 1
        if not m.no_ack:
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
                tag, redelivered, message.exchange, message.routing_key, queue.message_count
            ),
        )
        conn.write(message.content(self.number, conn.frame_max))

    def _take(self, tag: int, multiple: bool) -> list[tuple[Queue, Message, Consumer | None]]:
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

    def _settled(self, taken: list[tuple[Queue, Message, Consumer | None]]) -> None:
        """After acks freed prefetch credit, let the affected queues dispatch again."""
        if len(taken) == 1:
            queue = taken[0][0]
            if queue.messages:
                queue.dispatch()
            return
        for queue in {entry[0] for entry in taken}:
            if queue.messages:
                queue.dispatch()

    def _on_basic_ack(self, m: commands.Basic.Ack) -> None:
        if self.tx:
            self._tx_ops.append(lambda: self._ack(m.delivery_tag, m.multiple))
            return
        self._ack(m.delivery_tag, m.multiple)

    def _ack(self, tag: int, multiple: bool) -> None:
        taken = self._take(tag, multiple)
        self.connection.broker.messages_acked += len(taken)
        self._settled(taken)

    def _on_basic_nack(self, m: commands.Basic.Nack) -> None:
        self._reject(m.delivery_tag, m.multiple, m.requeue)

    def _on_basic_reject(self, m: commands.Basic.Reject) -> None:
        self._reject(m.delivery_tag, False, m.requeue)

    def _reject(self, tag: int, multiple: bool, requeue: bool) -> None:
        def apply() -> None:
            taken = self._take(tag, multiple)
            if requeue:
                self._requeue_entries(taken)
            self._settled(taken)

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
        self._requeue_entries(entries)

    @staticmethod
    def _requeue_entries(entries: list[tuple[Queue, Message, Consumer | None]]) -> None:
        by_queue: dict[Queue, list[Message]] = {}
        for queue, message, _consumer in entries:
            if not queue.deleted:
                by_queue.setdefault(queue, []).append(message)
        for queue, messages in by_queue.items():
            queue.requeue(messages)

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
            self._requeue_entries(orphans)
        if isinstance(m, commands.Basic.Recover):
            self.connection.send_method(self.number, commands.Basic.RecoverOk())

    # -- confirm and tx classes ------------------------------------------------------

    def _on_confirm_select(self, m: commands.Confirm.Select) -> None:
        if self.tx:
            raise precondition_failed("cannot switch from tx to confirm mode")
        self.confirm = True
        if not m.nowait:
            self.connection.send_method(self.number, commands.Confirm.SelectOk())

    def _on_tx_select(self, m: commands.Tx.Select) -> None:
        if self.confirm:
            raise precondition_failed("cannot switch from confirm to tx mode")
        self.tx = True
        self.connection.send_method(self.number, commands.Tx.SelectOk())

    def _on_tx_commit(self, m: commands.Tx.Commit) -> None:
        if not self.tx:
            raise precondition_failed("channel is not transactional")
        ops, self._tx_ops = self._tx_ops, []
        for op in ops:
            op()
        self.connection.send_method(self.number, commands.Tx.CommitOk())

    def _on_tx_rollback(self, m: commands.Tx.Rollback) -> None:
        if not self.tx:
            raise precondition_failed("channel is not transactional")
        self._tx_ops = []
        self.connection.send_method(self.number, commands.Tx.RollbackOk())

    def describe(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "consumers": len(self.consumers),
            "unacked": self.unacked_count,
            "prefetch": self.prefetch,
            "global_prefetch": self.global_prefetch,
            "confirm": self.confirm,
            "tx": self.tx,
            "flow": self.flow,
        }


def _unsupported(text: str) -> Callable[[Channel, Method], None]:
    def handler(self: Channel, method: Method) -> None:
        raise ConnectionError_(NOT_IMPLEMENTED, text)

    return handler


_HANDLERS: dict[type, Callable[[Channel, Any], None]] = {
    commands.Channel.Close: Channel._on_close,
    commands.Channel.CloseOk: Channel._on_close_ok,
    commands.Channel.Flow: Channel._on_flow,
    commands.Channel.Open: Channel._on_open,
    commands.Exchange.Declare: Channel._on_exchange_declare,
    commands.Exchange.Delete: Channel._on_exchange_delete,
    commands.Exchange.Bind: Channel._on_exchange_bind,
    commands.Exchange.Unbind: Channel._on_exchange_unbind,
    commands.Queue.Declare: Channel._on_queue_declare,
    commands.Queue.Bind: Channel._on_queue_bind,
    commands.Queue.Unbind: Channel._on_queue_unbind,
    commands.Queue.Purge: Channel._on_queue_purge,
    commands.Queue.Delete: Channel._on_queue_delete,
    commands.Basic.Qos: Channel._on_basic_qos,
    commands.Basic.Consume: Channel._on_basic_consume,
    commands.Basic.Cancel: Channel._on_basic_cancel,
    commands.Basic.Get: Channel._on_basic_get,
    commands.Basic.Ack: Channel._on_basic_ack,
    commands.Basic.Nack: Channel._on_basic_nack,
    commands.Basic.Reject: Channel._on_basic_reject,
    commands.Basic.Recover: Channel._on_basic_recover,
    commands.Basic.RecoverAsync: Channel._on_basic_recover,
    commands.Confirm.Select: Channel._on_confirm_select,
    commands.Tx.Select: Channel._on_tx_select,
    commands.Tx.Commit: Channel._on_tx_commit,
    commands.Tx.Rollback: Channel._on_tx_rollback,
}

__all__ = ["Channel", "Consumer"]
