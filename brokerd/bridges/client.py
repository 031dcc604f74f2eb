"""The client side of one AMQP 0-9-1 connection, sans I/O (the h11 model).

A bridge talks to brokers as a client: ``ClientConnection`` takes the bytes a
broker sent (``receive``) and returns events, and queues the bytes to send
(``data_to_send``). It logs in (PLAIN, AMQPLAIN or EXTERNAL), negotiates the
tuning, opens the vhost and one channel, and from then on carries what a
shovel needs: queue and binding declarations, qos, a consumer, publishes with
confirms, acknowledgements. The asyncio shell (``bridges.runner``) owns the
socket, the heartbeat timer and the waiting.

Content is carried with its property bytes as they came (``wire.codec``): a
shovelled message reaches its destination with exactly the properties it had,
unlike a client library that adds a ``message_id`` of its own.

Bounds: frames larger than the negotiated ``frame_max`` are refused, and a
message body larger than ``BODY_MAX`` (RabbitMQ's own largest message) closes
the connection with 505 rather than grow a buffer without end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pamqp import commands
from pamqp.constants import DOMAIN_REGEX
from pamqp.encode import encode_table_value

from brokerd.wire import codec, tables
from brokerd.wire.codec import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
)

CHANNEL = 1
#: the frame size asked for (RabbitMQ's default)
FRAME_MAX = 131072
#: RabbitMQ's largest message (its max_message_size ceiling)
BODY_MAX = 512 * 1024 * 1024
#: the spec's reply codes used here
REPLY_SUCCESS = 200
FRAME_ERROR = 501
UNEXPECTED_FRAME = 505


class ProtocolError(Exception):
    """The broker sent something this client cannot follow; ``code`` is the
    AMQP reply code the connection is closed with."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


# -- events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Opened:
    """The vhost is open (channel 1 not yet)."""

    server_properties: dict[str, Any] = field(default_factory=dict)
    heartbeat: int = 0


@dataclass(frozen=True)
class Reply:
    """A synchronous reply on the channel (ChannelOpenOk, DeclareOk, ConsumeOk...)."""

    method: Any


@dataclass(frozen=True)
class Delivered:
    tag: int
    exchange: str
    routing_key: str
    redelivered: bool
    properties: bytes
    body: bytes


@dataclass(frozen=True)
class Confirmed:
    """The broker confirmed (``ok``) or nacked our publish ``tag`` (and earlier ones
    with ``multiple``)."""

    tag: int
    multiple: bool
    ok: bool


@dataclass(frozen=True)
class ConsumerCancelled:
    """The broker cancelled our consumer (its queue was deleted, or moved away)."""

    consumer_tag: str


@dataclass(frozen=True)
class Blocked:
    reason: str


@dataclass(frozen=True)
class Unblocked:
    pass


@dataclass(frozen=True)
class ChannelClosed:
    """The broker closed the channel: the reason (404 no such queue, 403...)."""

    code: int
    text: str


@dataclass(frozen=True)
class ConnectionClosed:
    code: int
    text: str


Event = (
    Opened
    | Reply
    | Delivered
    | Confirmed
    | ConsumerCancelled
    | Blocked
    | Unblocked
    | ChannelClosed
    | ConnectionClosed
)


@dataclass
class _Content:
    """A delivery whose header and body frames are still coming."""

    method: commands.Basic.Deliver
    size: int = -1
    properties: bytes = b""
    parts: list[bytes] = field(default_factory=list)
    received: int = 0


class ClientConnection:
    """One connection with one channel, as a shovel or federation link uses it."""

    def __init__(
        self,
        *,
        vhost: str = "/",
        username: str = "guest",
        password: str = "guest",
        mechanism: str = "plain",
        heartbeat: int = 60,
        client_properties: dict[str, Any] | None = None,
    ) -> None:
        self.vhost = vhost
        self.username = username
        self.password = password
        self.mechanism = mechanism.upper()
        self.heartbeat = heartbeat
        self.client_properties = client_properties or {}
        self.frame_max = FRAME_MAX
        self.state = "start"
        self._in = bytearray()
        self._out: list[bytes] = [PROTOCOL_HEADER]
        self._content: _Content | None = None
        #: the broker's, from connection.start
        self.server_properties: dict[str, Any] = {}

    # -- bytes in and out -------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        out, self._out = b"".join(self._out), []
        return out

    def receive(self, data: bytes) -> list[Event]:
        """Bytes from the broker: the events they complete. ``ProtocolError`` if the
        broker broke the protocol (the shell then closes the socket)."""
        if self.state == "closed":
            return []
        self._in += data
        limit = max(self.frame_max, FRAME_MIN_SIZE) + 8
        try:
            frames, pos = codec.split_frames(self._in, 0, limit)
        except codec.FrameError as exc:
            raise ProtocolError(FRAME_ERROR, str(exc)) from None
        del self._in[:pos]
        events: list[Event] = []
        for ftype, channel, payload in frames:
            events += self._frame(ftype, channel, payload)
            if self.state == "closed":
                break
        return events

    def heartbeat_frame(self) -> None:
        self._out.append(HEARTBEAT_FRAME)

    # -- frames -----------------------------------------------------------------------------

    def _frame(self, ftype: int, channel: int, payload: bytes) -> list[Event]:
        if ftype == FRAME_HEARTBEAT:
            return []
        if ftype == FRAME_METHOD:
            if self._content is not None:
                raise ProtocolError(UNEXPECTED_FRAME, "a method frame inside a message")
            try:
                method = codec.decode_method(payload)
            except (codec.SyntaxError_, codec.UnknownMethod) as exc:
                raise ProtocolError(FRAME_ERROR, str(exc)) from None
            if channel == 0:
                return self._connection_method(method)
            if channel != CHANNEL:
                raise ProtocolError(UNEXPECTED_FRAME, f"a frame on unknown channel {channel}")
            return self._channel_method(method)
        if channel != CHANNEL or self._content is None:
            raise ProtocolError(UNEXPECTED_FRAME, f"content frame type {ftype} out of place")
        content = self._content
        if ftype == FRAME_HEADER:
            if content.size >= 0:
                raise ProtocolError(UNEXPECTED_FRAME, "a second content header")
            try:
                _class, size, properties = codec.decode_header(payload)
            except codec.SyntaxError_ as exc:
                raise ProtocolError(FRAME_ERROR, str(exc)) from None
            if size > BODY_MAX:
                raise ProtocolError(UNEXPECTED_FRAME, f"message body of {size} bytes")
            content.size, content.properties = size, properties
        elif ftype == FRAME_BODY:
            if content.size < 0 or content.received + len(payload) > content.size:
                raise ProtocolError(UNEXPECTED_FRAME, "body frame beyond the announced size")
            content.parts.append(payload)
            content.received += len(payload)
        else:
            raise ProtocolError(UNEXPECTED_FRAME, f"unknown frame type {ftype}")
        if content.size >= 0 and content.received == content.size:
            self._content = None
            method = content.method
            return [
                Delivered(
                    method.delivery_tag,
                    method.exchange,
                    method.routing_key,
                    bool(method.redelivered),
                    content.properties,
                    b"".join(content.parts),
                )
            ]
        return []

    def _connection_method(self, method: Any) -> list[Event]:
        if isinstance(method, commands.Connection.Start) and self.state == "start":
            self.server_properties = dict(method.server_properties or {})
            self._send(0, self._start_ok(method))
            self.state = "tune"
            return []
        if isinstance(method, commands.Connection.Tune) and self.state == "tune":
            frame_max = method.frame_max or FRAME_MAX
            self.frame_max = max(FRAME_MIN_SIZE, min(FRAME_MAX, frame_max))
            theirs, ours = method.heartbeat, self.heartbeat
            self.heartbeat = min(theirs, ours) if theirs and ours else (theirs or ours)
            self._send(
                0,
                commands.Connection.TuneOk(
                    channel_max=max(1, min(method.channel_max or 65535, 2047)),
                    frame_max=self.frame_max,
                    heartbeat=self.heartbeat,
                ),
            )
            self._send(0, commands.Connection.Open(virtual_host=self.vhost))
            self.state = "open"
            return []
        if isinstance(method, commands.Connection.OpenOk) and self.state == "open":
            self.state = "opened"
            return [Opened(self.server_properties, self.heartbeat)]
        if isinstance(method, commands.Connection.Close):
            self._send(0, commands.Connection.CloseOk())
            self.state = "closed"
            return [ConnectionClosed(method.reply_code, method.reply_text)]
        if isinstance(method, commands.Connection.CloseOk):
            self.state = "closed"
            return [ConnectionClosed(REPLY_SUCCESS, "closed")]
        if isinstance(method, commands.Connection.Blocked):
            return [Blocked(method.reason)]
        if isinstance(method, commands.Connection.Unblocked):
            return [Unblocked()]
        if isinstance(method, commands.Connection.Secure):
            raise ProtocolError(UNEXPECTED_FRAME, "a login challenge this client cannot answer")
        raise ProtocolError(UNEXPECTED_FRAME, f"{method.name} in state {self.state}")

    def _start_ok(self, start: commands.Connection.Start) -> commands.Connection.StartOk:
        offered = (start.mechanisms or "").split()
        if self.mechanism not in offered:
            raise ProtocolError(
                403 if self.mechanism == "EXTERNAL" else UNEXPECTED_FRAME,
                f"the broker does not offer {self.mechanism} (it offers {', '.join(offered)})",
            )
        if self.mechanism == "PLAIN":
            response = f"\0{self.username}\0{self.password}"
        elif self.mechanism == "AMQPLAIN":
            from pamqp import encode

            raw = (
                encode.short_string("LOGIN")
                + b"S"
                + encode.long_string(self.username)
                + encode.short_string("PASSWORD")
                + b"S"
                + encode.long_string(self.password)
            )
            if not raw.isascii():
                # pamqp sends the response as UTF-8 text: only ASCII bytes pass unchanged
                raise ProtocolError(403, "AMQPLAIN needs ASCII credentials here: use PLAIN")
            response = raw.decode("ascii")
        else:  # EXTERNAL: the certificate is the login
            response = ""
        properties = {
            "product": "Rookery bridge",
            "capabilities": {
                "publisher_confirms": True,
                "consumer_cancel_notify": True,
                "connection.blocked": True,
                "basic.nack": True,
                "authentication_failure_close": True,
            },
            **self.client_properties,
        }
        return commands.Connection.StartOk(
            client_properties=properties,
            mechanism=self.mechanism,
            response=response,
            locale="en_US",
        )

    def _channel_method(self, method: Any) -> list[Event]:
        if isinstance(method, commands.Basic.Deliver):
            self._content = _Content(method)
            return []
        if isinstance(method, commands.Basic.Ack):
            return [Confirmed(method.delivery_tag, bool(method.multiple), True)]
        if isinstance(method, commands.Basic.Nack):
            return [Confirmed(method.delivery_tag, bool(method.multiple), False)]
        if isinstance(method, commands.Basic.Cancel):
            if not method.nowait:
                self._send(CHANNEL, commands.Basic.CancelOk(consumer_tag=method.consumer_tag))
            return [ConsumerCancelled(method.consumer_tag)]
        if isinstance(method, commands.Channel.Close):
            self._send(CHANNEL, commands.Channel.CloseOk())
            return [ChannelClosed(method.reply_code, method.reply_text)]
        if isinstance(method, commands.Channel.Flow):
            self._send(CHANNEL, commands.Channel.FlowOk(active=method.active))
            return []
        if isinstance(method, commands.Basic.Return):
            return []  # never mandatory: only a broker's mistake sends one
        return [Reply(method)]

    # -- what a bridge asks ---------------------------------------------------------------------

    def _send(self, channel: int, method: Any) -> None:
        self._out.append(codec.method_frame(channel, method))

    def open_channel(self) -> None:
        self._send(CHANNEL, commands.Channel.Open())

    def qos(self, prefetch: int) -> None:
        self._send(CHANNEL, commands.Basic.Qos(prefetch_count=prefetch))

    def confirm_select(self) -> None:
        self._send(CHANNEL, commands.Confirm.Select())

    def declare_queue(
        self,
        name: str,
        *,
        passive: bool = False,
        durable: bool = True,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        method = commands.Queue.Declare(
            passive=passive,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        self._send(CHANNEL, _named(method, queue=name))

    def declare_exchange_passive(self, name: str) -> None:
        self._send(CHANNEL, _named(commands.Exchange.Declare(passive=True), exchange=name))

    def declare_exchange(
        self,
        name: str,
        type_name: str,
        *,
        durable: bool = True,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self._send(
            CHANNEL,
            _typed(
                _named(
                    commands.Exchange.Declare(
                        exchange_type=type_name, durable=durable, internal=internal
                    ),
                    exchange=name,
                ),
                arguments or {},
            ),
        )

    def bind_exchange(
        self, destination: str, source: str, routing_key: str, arguments: dict[str, Any] | None
    ) -> None:
        self._send(
            CHANNEL,
            _named(
                commands.Exchange.Bind(routing_key=routing_key, arguments=arguments),
                destination=destination,
                source=source,
            ),
        )

    def unbind_exchange(
        self, destination: str, source: str, routing_key: str, arguments: dict[str, Any] | None
    ) -> None:
        self._send(
            CHANNEL,
            _named(
                commands.Exchange.Unbind(routing_key=routing_key, arguments=arguments),
                destination=destination,
                source=source,
            ),
        )

    def bind_queue(self, queue: str, exchange: str, routing_key: str) -> None:
        method = commands.Queue.Bind(routing_key=routing_key)
        self._send(CHANNEL, _named(method, queue=queue, exchange=exchange))

    def consume(
        self, queue: str, tag: str, *, no_ack: bool, arguments: dict[str, Any] | None = None
    ) -> None:
        self._send(
            CHANNEL,
            _named(
                commands.Basic.Consume(consumer_tag=tag, no_ack=no_ack, arguments=arguments),
                queue=queue,
            ),
        )

    def cancel(self, tag: str) -> None:
        self._send(CHANNEL, commands.Basic.Cancel(consumer_tag=tag))

    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        method = commands.Basic.Publish(routing_key=routing_key)
        self._send(CHANNEL, _named(method, exchange=exchange))
        self._out.append(codec.content_frames(CHANNEL, properties, body, self.frame_max))

    def ack(self, tag: int, multiple: bool = False) -> None:
        self._send(CHANNEL, commands.Basic.Ack(delivery_tag=tag, multiple=multiple))

    def nack(self, tag: int, *, multiple: bool = False, requeue: bool = True) -> None:
        self._send(
            CHANNEL, commands.Basic.Nack(delivery_tag=tag, multiple=multiple, requeue=requeue)
        )

    def close(self, code: int = REPLY_SUCCESS, text: str = "bridge stopped") -> None:
        if self.state in ("closing", "closed"):
            return
        self._send(
            0,
            commands.Connection.Close(reply_code=code, reply_text=text, class_id=0, method_id=0),
        )
        self.state = "closing"


_PAMQP_NAME = DOMAIN_REGEX["exchange-name"]


def _named(method: Any, **names: str) -> Any:
    """``method`` with its exchange and queue names set after pamqp's checks: those
    allow only ``[a-zA-Z0-9-_.:@#,/ ]``, where a broker takes any UTF-8 name up to
    255 bytes (RabbitMQ's federation names its objects ``federation: X -> NODE``);
    the broker judges the name."""
    for field_name, value in names.items():
        setattr(method, field_name, value)
    if any(not _PAMQP_NAME.fullmatch(v) for v in names.values()):
        method.validate = _valid  # marshal checks again: this name is the broker's to judge
    return method


def _valid() -> None:
    """A method's checks, passed (see ``_named``)."""


class Long(int):
    """An integer sent as AMQP's signed 64-bit ``l`` (RabbitMQ's ``long``) whatever its
    size: pamqp picks the smallest type, and some arguments must be ``long`` exactly
    (RabbitMQ's ``x-federation-upstream`` refuses an ``x-max-hops`` of another)."""


def _typed(method: Any, arguments: dict[str, Any]) -> Any:
    """``method`` (whose last field is its arguments table) with ``arguments`` encoded
    as pamqp does, except ``Long`` values."""
    if not any(isinstance(v, Long) for v in arguments.values()):
        method.arguments = arguments or None
        return method
    raw = tables.encode_table(
        [
            (key.encode(), tables.long(v) if isinstance(v, Long) else encode_table_value(v))
            for key, v in arguments.items()
        ]
    )
    plain = method.marshal
    empty = b"\x00\x00\x00\x00"

    def marshal() -> bytes:
        data = plain()
        assert data.endswith(empty), "the arguments table comes last"
        return data[: -len(empty)] + raw

    method.arguments = {}
    method.marshal = marshal
    return method
