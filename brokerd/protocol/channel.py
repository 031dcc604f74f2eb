"""The AMQP channel: frames in, the channel class, and the classes it serves.

A channel turns decoded methods into calls on the broker model and model
callbacks (deliveries, cancels) into frames on its connection. Its concerns
live in mixins: ``publishing`` (content, routing, returns, confirms, tx),
``consuming`` (qos, consume, get, acks, recover) and ``wiring`` (exchange
and queue classes). Publishing and delivery take a fast path that avoids
pamqp objects.

An operation may complete later (a queue held by another server answers a
get when that server has; a shared wiring change waits for the root): the
channel *suspends* (``_suspend``), holding every later frame in arrival
order, and ``resume`` sends the reply (or raises its error) and replays them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.model.errors import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
    AMQPError,
    ChannelError,
    ConnectionError_,
    precondition_failed,
)
from brokerd.model.limits import check_not_internal
from brokerd.model.message import LARGE_BODY, Body, body_buffer
from brokerd.protocol.consuming import Consumer, Consuming
from brokerd.protocol.publishing import Publishing
from brokerd.protocol.wiring import Wiring
from brokerd.wire import codec
from brokerd.wire.codec import FRAME_BODY, FRAME_HEADER, FRAME_METHOD, SyntaxError_, UnknownMethod

if TYPE_CHECKING:
    from brokerd.protocol.connection import Connection

log = logging.getLogger("brokerd.channel")

_PUBLISH_ID = bytes((0, 60, 0, 40))
#: methods whose 404 comes from looking a name up, before anything changed: tried once
#: more after the cluster caught up (``Channel._catch_up``)
_LOOKUPS = frozenset(
    {
        commands.Queue.Declare,  # passive
        commands.Exchange.Declare,  # passive
        commands.Queue.Bind,
        commands.Queue.Purge,
        commands.Exchange.Bind,
        commands.Basic.Consume,
        commands.Basic.Get,
    }
)


class Channel(Publishing, Consuming, Wiring):
    """One open channel of a connection."""

    def __init__(self, connection: Connection, number: int) -> None:
        self.connection = connection
        self.number = number
        self.open = True
        self.flow = True
        self.last_queue: str | None = None
        self._init_consuming()
        # confirms and transactions
        self.confirm = False
        self.publish_seq = 0
        self._confirms: list[tuple[int, bool]] = []
        self.tx = False
        self._tx_ops: list[Callable[[], None]] = []
        # content being assembled: (exchange, routing_key, mandatory), props, parts, size;
        # a large body goes straight into one buffer of its declared size instead
        self._publish: tuple[str, str, bool] | None = None
        self._props = b""
        self._parts: list[bytes] = []
        self._buffer: memoryview | None = None
        self._size = 0
        self._received = 0
        self._write_allowed: dict[str, bool] = {}
        self._init_publishing()
        #: frames received while an operation completes elsewhere (None: not suspended)
        self._held: list[tuple[int, bytes]] | None = None
        #: (class id, method id) of the operation suspended for, for its channel.close
        self._suspended_for = (0, 0)

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
                raise ConnectionError_(SYNTAX_ERROR, str(exc)) from None
            if immediate:
                raise ConnectionError_(NOT_IMPLEMENTED, "immediate=true")
            self._publish = (exchange, routing_key, mandatory)
            return
        method = self._decode(payload)
        method.raw_payload = payload  # a replicated change travels as the client sent it
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise ConnectionError_(
                COMMAND_INVALID, f"method {method.name} is not allowed on a channel"
            )
        try:
            handler(self, method)
        except ChannelError as exc:
            if exc.reply_code == NOT_FOUND and self._catch_up(handler, method):
                return
            exc.method_id = (method.index >> 16, method.index & 0xFFFF)  # type: ignore[attr-defined]
            raise

    def _catch_up(self, handler: Callable[[Any, Method], None], method: Method) -> bool:
        """A name this server lacks (404) may be one the cluster ordered an instant ago
        and this server has not applied yet: the cluster catches up (``hooks``), and
        the method runs once more, holding later frames meanwhile. Only methods that
        look a name up before they change anything are tried again."""
        hooks = self.connection.hooks
        if hooks is None or type(method) not in _LOOKUPS:
            return False
        if isinstance(method, commands.Queue.Declare | commands.Exchange.Declare) and not (
            method.passive
        ):
            return False
        self._suspend(method)
        if hooks.catch_up(self.connection, lambda: self.resume(lambda: handler(self, method))):
            return True
        self._unsuspend()
        return False

    def _decode(self, payload: bytes) -> Method:
        try:
            return codec.decode_method(payload)
        except UnknownMethod as exc:
            raise ConnectionError_(NOT_IMPLEMENTED, str(exc)) from None
        except SyntaxError_ as exc:
            raise ConnectionError_(SYNTAX_ERROR, str(exc)) from None

    # -- operations that complete later ----------------------------------------------

    def _suspend(self, method: Method) -> None:
        """Hold every later frame until ``resume``: the reply to ``method`` comes first."""
        self._held = []
        self._suspended_for = (method.index >> 16, method.index & 0xFFFF)

    def _unsuspend(self) -> None:
        """Nothing was held after all (the operation was not taken elsewhere)."""
        self._held = None

    def resume(self, action: Callable[[], None] | None) -> None:
        """The operation this channel waited for completed: run ``action`` (it sends
        the reply, or raises the operation's error), then the frames held meanwhile."""
        held, self._held = self._held, None
        if held is None or not self.open:
            return
        conn = self.connection
        try:
            if action is not None:
                action()
        except AMQPError as exc:
            if not getattr(exc, "method_id", None):
                exc.method_id = self._suspended_for  # type: ignore[attr-defined]
            conn._amqp_error(exc, self.number)
            return
        for index, (kind, payload) in enumerate(held):
            if self._held is not None:  # a later operation suspended in turn
                self._held.extend(held[index:])
                break
            try:
                if kind == FRAME_METHOD:
                    self.handle_method(payload)
                elif kind == FRAME_HEADER:
                    self.handle_header(payload)
                else:
                    self.handle_body(payload)
            except AMQPError as exc:
                conn._flush_confirms()
                conn._amqp_error(exc, self.number)
                return
        conn._flush_confirms()

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
        if self._publish is None or self._props:
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"unexpected content header on channel {self.number}"
            )
        try:
            class_id, size, props = codec.decode_header(payload)
        except SyntaxError_ as exc:
            raise ConnectionError_(SYNTAX_ERROR, str(exc)) from None
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
        start = self._received
        received = start + len(payload)
        if received > self._size:
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"content body exceeds the declared size {self._size}"
            )
        if received == self._size:
            body: Body
            if self._buffer is not None:
                buffer, self._buffer = self._buffer, None
                buffer[start:received] = payload
                body = buffer.toreadonly()
                buffer.release()
            elif self._parts:
                self._parts.append(payload)
                body = b"".join(self._parts)
                self._parts = []
            else:
                body = payload  # one frame: the usual case, no copy at all
            self._content_complete(body)
            return
        if start == 0 and self._size >= LARGE_BODY:
            self._buffer = body_buffer(self._size)
        if self._buffer is not None:
            self._buffer[start:received] = payload  # the frame is freed: ~1x the body
        else:
            self._parts.append(payload)
        self._received = received

    # -- permissions ----------------------------------------------------------------

    def _permit(self, kind: str, resource_type: str, name: str) -> None:
        """Every exchange or queue a method names passes here (``Wiring``, ``Publishing``,
        ``Consuming``): the broker's internal ones are refused to every client, whatever
        its permissions (a cluster link's records never get here), then the user's
        permissions are checked."""
        check_not_internal(resource_type, name)
        conn = self.connection
        conn.broker.users.check(conn.user, conn.vhost.name, kind, resource_type, name)

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
        raise ConnectionError_(CHANNEL_ERROR, f"channel {self.number} is already open")

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
        self._buffer = None
        self._confirms.clear()
        self._inflight.clear()
        self._deferring = None
        self._release_consumers()

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
