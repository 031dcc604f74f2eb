"""The AMQP connection state machine (handshake, channels, heartbeats, close)."""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.model.broker import Broker
from brokerd.model.errors import (
    CHANNEL_ERROR,
    CONNECTION_FORCED,
    FRAME_ERROR,
    INTERNAL_ERROR,
    NOT_IMPLEMENTED,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
    AMQPError,
    ConnectionError_,
)
from brokerd.protocol.channel import Channel
from brokerd.protocol.handshake import (
    LoginCheck,
)
from brokerd.protocol.hooks import ConnectionHooks, Wait
from brokerd.protocol.moving import Mover, Moving
from brokerd.protocol.negotiation import ConnectionState, Negotiation
from brokerd.protocol.output import OUTPUT_HIGH_WATER, Output
from brokerd.tls import PeerCertificate
from brokerd.wire import codec
from brokerd.wire.codec import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    FrameError,
    SyntaxError_,
    UnknownMethod,
)

__all__ = ["OUTPUT_HIGH_WATER", "Connection", "ConnectionState", "next_connection_id"]

log = logging.getLogger("brokerd.connection")
_OPEN = ConnectionState.OPEN
_CLOSED = ConnectionState.CLOSED

_PUBLISH_ID = bytes((0, 60, 0, 40))


def _publishing(ftype: int, payload: bytes) -> bool:
    """A basic.publish method frame, or content (the rest of a publish)."""
    return ftype in (FRAME_HEADER, FRAME_BODY) or (
        ftype == FRAME_METHOD and payload[:4] == _PUBLISH_ID
    )


HANDSHAKE_TIMEOUT = 10.0
CLOSE_TIMEOUT = 3.0
_ids = itertools.count(1)


def next_connection_id() -> int:
    return next(_ids)


class Connection(Output, Negotiation, Moving):
    """One client connection, from protocol header to close.

    ``on_output`` is called (once) when the output buffer goes from empty to
    non-empty, so an I/O shell can schedule a single write per loop turn.
    ``on_login`` receives each password check to run off the loop (the shell
    answers with ``complete_login``); without it the machine checks inline,
    which keeps it usable with no loop at all.
    """

    def __init__(
        self,
        broker: Broker,
        peer: tuple[str, int],
        *,
        connection_id: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_output: Callable[[], None] | None = None,
        server_properties: dict[str, Any] | None = None,
        hooks: ConnectionHooks | None = None,
        on_login: Callable[[LoginCheck], None] | None = None,
        tls: bool = False,
        peer_certificate: PeerCertificate | None = None,
        mover: Mover | None = None,
    ) -> None:
        self.broker = broker
        #: over TLS, and the client's certificate as the handshake verified it (None:
        #: none sent, or not verified); EXTERNAL logs in as the user it names
        self.tls = tls
        self.peer_certificate = peer_certificate
        self.peer = peer
        self.id = connection_id if connection_id is not None else next_connection_id()
        self.name = f"{peer[0]}:{peer[1]}"
        self.clock = clock
        self.on_output = on_output
        self.state = ConnectionState.AWAIT_HEADER
        self.created = clock()
        self.last_received = self.created
        self.last_sent = self.created
        self._closing_since = 0.0
        self._buf = bytearray()
        self._out: list[bytes] = []
        #: output written while a store holds a delivery (``hold_output``), and its gate
        #: output held for the replicas: [gate, data...] segments, released in order
        self._holds: deque[list[Any]] = deque()
        self._held_bytes = 0
        self.server_properties = server_properties or {}
        self.hooks = hooks
        self.on_login = on_login
        #: the password check in progress; frames received meanwhile wait
        self.login: LoginCheck | None = None
        self._pending: list[tuple[int, int, bytes]] = []
        self._pending_error: AMQPError | None = None
        self._admission: Wait | None = None
        self._admission_deadline = 0.0
        self._closed_notified = False
        # negotiated
        self.frame_max = FRAME_MIN_SIZE
        self.channel_max = broker.limits.channel_max
        self.heartbeat = 0
        self.client_properties: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.user: Any = None
        self.vhost: Any = None
        self.channels: dict[int, Any] = {}
        #: a cluster link the cluster admitted: never blocked, never counted in limits
        self.cluster_link = False
        #: counted in the broker's connection limits (released at teardown)
        self.counted = False
        #: False while the transport's buffer is above its high-water mark or
        #: this machine's own output buffer holds more than OUTPUT_HIGH_WATER
        self.writable = True
        self._transport_paused = False
        self._output_full = False
        self._out_bytes = 0
        #: ``_out`` holds views of a large body (``write_parts``)
        self._parted = False
        self.blocked_reason: str | None = None
        #: blocked and a publisher's next frame came: the shell stops reading from the
        #: socket until unblocked (RabbitMQ's "blocked", not just a notification)
        self.read_paused = False
        self.close_reason: str = ""
        #: connection.close went out (the fallback close must not send a second one)
        self._close_sent = False
        # counters
        self.messages_in = 0
        self.messages_out = 0
        self._returns_window = 0.0
        self._returns_in_window = 0
        self.returns_dropped = 0
        self._confirm_dirty: set[Any] = set()
        #: a ``brokerd --workers`` worker's: the connection may move to a sibling
        self._init_moving(mover)

    @property
    def certificate_login(self) -> str | None:
        """The user the verified client certificate names (EXTERNAL), if any."""
        cert = self.peer_certificate
        return cert.login if cert is not None else None

    @property
    def closed(self) -> bool:
        """The shell should flush ``data_to_send`` and then close the transport."""
        return self.state is ConnectionState.CLOSED

    def receive_data(self, data: bytes) -> None:
        if self.state is ConnectionState.CLOSED:
            return
        self.last_received = self.clock()
        buf = self._buf
        buf += data
        if self._holding:
            if self.user is None and len(buf) > self.broker.limits.max_unauthenticated_bytes:
                self._refuse_unauthenticated(len(buf))
            return  # frames pipelined after start-ok or open wait for the answer
        if self.state is ConnectionState.AWAIT_HEADER:
            if len(buf) < 8:
                if PROTOCOL_HEADER.startswith(bytes(buf)):
                    return
                self._refuse_header()
                return
            if bytes(buf[:8]) != PROTOCOL_HEADER:
                self._refuse_header()
                return
            del buf[:8]
            self._send_start()
        if self.user is None and len(buf) > self.broker.limits.max_unauthenticated_bytes:
            self._refuse_unauthenticated(len(buf))
            return
        # a pipelining client may send tune-ok and large frames in one write:
        # until the connection is open, split against the server's own ceiling,
        # and before the login against what an unauthenticated peer may send
        if self.state is ConnectionState.OPEN:
            frame_max = self.frame_max
        elif self.user is None:
            frame_max = self.broker.limits.max_unauthenticated_bytes
        else:
            frame_max = self.broker.limits.frame_max
        error: AMQPError | None = None
        try:
            frames, pos = codec.split_frames(buf, 0, frame_max)
        except FrameError as exc:
            frames, pos = exc.frames, len(buf)
            error = ConnectionError_(FRAME_ERROR, str(exc))
        if pos:
            del buf[:pos]
        self._process(frames, error)

    @property
    def _holding(self) -> bool:
        """A password check or the cluster's admission is pending, or publishers are
        blocked and this one published: frames wait."""
        return (
            self.login is not None
            or self.state is ConnectionState.AWAIT_ADMISSION
            or self.read_paused
            or self.moving_to is not None
        )

    def _process(self, frames: list[tuple[int, int, bytes]], error: AMQPError | None) -> None:
        blocked = self.blocked_reason is not None and self.state is ConnectionState.OPEN
        for index, (ftype, channel, payload) in enumerate(frames):
            if blocked and channel and _publishing(ftype, payload):
                # blocked: this publish (or the rest of one) is not read, nor what follows
                self.read_paused = True
                self._pending = frames[index:]
                self._pending_error = error
                return
            if self._move_watch and ftype == FRAME_METHOD and channel:
                target = self._move_point(channel, payload)
                if target is not None:  # the frames wait while the socket moves
                    self.moving_to = target
                    self._pending = frames[index:]
                    self._pending_error = error
                    return
            try:
                try:
                    self._handle_frame(ftype, channel, payload)
                except AMQPError as exc:
                    self._flush_confirms()  # ... and precede the error
                    self._amqp_error(exc, channel)
            except Exception:
                # a broker bug must cost only this connection, and the client
                # hears why (RabbitMQ: 541 INTERNAL_ERROR), rather than a reset
                log.exception(
                    "internal error conn=%d peer=%s channel=%d", self.id, self.name, channel
                )
                self.internal_error()
            state = self.state
            if state is _CLOSED:
                break
            # a login or the cluster's admission (before the connection is open) or an
            # update-secret (channel 0) makes the rest of this read wait for its answer;
            # an open connection's channel frames never do, so they skip the test
            if (state is not _OPEN or not channel) and self._holding:
                self._pending = frames[index + 1 :]
                self._pending_error = error
                return
        try:
            self._flush_confirms()
        except Exception:
            log.exception("internal error conn=%d peer=%s (confirms)", self.id, self.name)
            self.internal_error()
        if error is not None:
            self.connection_error(error.reply_code, error.text)

    def internal_error(self) -> None:
        """Close with 541 even if the orderly close path is what failed."""
        try:
            self.connection_error(INTERNAL_ERROR, "internal error; see the broker log")
        except Exception:
            log.exception("internal error conn=%d peer=%s (closing)", self.id, self.name)
            if not self._close_sent:
                self.write(
                    codec.method_frame(
                        0, commands.Connection.Close(INTERNAL_ERROR, "INTERNAL_ERROR", 0, 0)
                    )
                )
            self.state = ConnectionState.CLOSED

    def _flush_confirms(self) -> None:
        if self._confirm_dirty:
            for ch in self._confirm_dirty:
                ch.flush_confirms()
            self._confirm_dirty.clear()

    def _refuse_unauthenticated(self, size: int) -> None:
        """Too much from a peer that has not logged in: 501, and the socket is dropped
        at once (there is no agreed frame size to wait for a close-ok with)."""
        limit = self.broker.limits.max_unauthenticated_bytes
        text = f"{size} bytes received before authentication, more than the limit of {limit}"
        log.warning("refused conn=%d peer=%s reason=%s", self.id, self.name, text)
        error = ConnectionError_(FRAME_ERROR, text)
        self.send_method(0, commands.Connection.Close(FRAME_ERROR, error.reply_text, 0, 0))
        self._close_sent = True
        self._buf.clear()
        self._teardown()
        self.state = ConnectionState.CLOSED

    def _refuse_header(self) -> None:
        log.info("refused conn=%d peer=%s reason=bad protocol header", self.id, self.name)
        self.write(PROTOCOL_HEADER)
        self.state = ConnectionState.CLOSED

    # -- frames ------------------------------------------------------------------

    def _handle_frame(self, ftype: int, channel: int, payload: bytes) -> None:
        state = self.state
        if state is ConnectionState.CLOSING:
            if ftype == FRAME_METHOD and channel == 0:
                method = self._decode(payload)
                if isinstance(method, commands.Connection.CloseOk):
                    self._finish_close()
                elif isinstance(method, commands.Connection.Close):
                    self.send_method(0, commands.Connection.CloseOk())
                    self._finish_close()
            return
        if ftype == FRAME_METHOD:
            if channel == 0:
                self._connection_method(self._decode(payload))
                return
            if state is not ConnectionState.OPEN:
                raise ConnectionError_(CHANNEL_ERROR, "channel frame before connection.open")
            ch = self.channels.get(channel)
            if ch is None:
                method = self._decode(payload)
                if not isinstance(method, commands.Channel.Open):
                    raise ConnectionError_(
                        CHANNEL_ERROR, f"expected 'channel.open' on channel {channel}"
                    )
                self._open_channel(channel)
                return
            ch.handle_method(payload)
        elif ftype in (FRAME_HEADER, FRAME_BODY):
            ch = self.channels.get(channel) if channel else None
            if ch is None or state is not ConnectionState.OPEN:
                raise ConnectionError_(
                    UNEXPECTED_FRAME, f"content frame on channel {channel}, which is not open"
                )
            if ftype == FRAME_BODY:
                ch.handle_body(payload)
            else:
                ch.handle_header(payload)
        elif ftype == FRAME_HEARTBEAT:
            if channel != 0:
                raise ConnectionError_(FRAME_ERROR, "heartbeat frame on a non-zero channel")
        else:
            raise ConnectionError_(FRAME_ERROR, f"unknown frame type {ftype}")

    def _decode(self, payload: bytes) -> Method:
        try:
            return codec.decode_method(payload)
        except UnknownMethod as exc:
            raise ConnectionError_(NOT_IMPLEMENTED, str(exc)) from None
        except SyntaxError_ as exc:
            raise ConnectionError_(SYNTAX_ERROR, str(exc)) from None

    def send_method(self, channel: int, method: Method) -> None:
        self.write(codec.method_frame(channel, method))

    # -- errors and closing ----------------------------------------------------

    def _amqp_error(self, exc: AMQPError, channel: int) -> None:
        ch = self.channels.get(channel) if channel else None
        if exc.connection_level or ch is None:
            self.connection_error(exc.reply_code, exc.text, *getattr(exc, "method_id", (0, 0)))
        else:
            ch.close_by_server(exc)

    def connection_error(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Close the connection with an AMQP error (spec 4.2.3: then ignore all but close-ok)."""
        if self.state in (ConnectionState.CLOSING, ConnectionState.CLOSED):
            return
        err = ConnectionError_(code, text)
        log.warning(
            "connection.error conn=%d peer=%s code=%d text=%r", self.id, self.name, code, text
        )
        self.close_reason = err.reply_text
        if self.state in (ConnectionState.AWAIT_HEADER, ConnectionState.AWAIT_START_OK):
            # before tune there is no agreed frame size; say why and drop the socket
            self.send_method(
                0, commands.Connection.Close(code, err.reply_text, class_id, method_id)
            )
            self._close_sent = True
            self._teardown()
            self.state = ConnectionState.CLOSED
            return
        self.send_method(0, commands.Connection.Close(code, err.reply_text, class_id, method_id))
        self._close_sent = True
        self._teardown()
        self.state = ConnectionState.CLOSING
        self._closing_since = self.clock()

    def close(
        self, code: int = CONNECTION_FORCED, text: str = "broker forced connection closure"
    ) -> None:
        """Server-initiated close (shutdown, operator): clients get connection.close."""
        if self.state is ConnectionState.OPEN:
            self.connection_error(code, text)
        elif self.state is not ConnectionState.CLOSED:
            self._teardown()
            self.state = ConnectionState.CLOSED

    def _finish_close(self) -> None:
        self._teardown()
        self.state = ConnectionState.CLOSED
        log.info("closed conn=%d peer=%s", self.id, self.name)

    def connection_lost(self) -> None:
        """The transport is gone: release everything the connection held."""
        if self.state is not ConnectionState.CLOSED:
            log.info("lost conn=%d peer=%s state=%s", self.id, self.name, self.state.value)
        self._teardown()
        self.state = ConnectionState.CLOSED

    def _teardown(self) -> None:
        self.writable = False  # requeued messages must not come back to this connection
        if self.counted:
            self.counted = False
            self.broker.close_connection(self.vhost.name)
        if self.hooks is not None and not self._closed_notified:
            self._closed_notified = True
            self.hooks.closed(self)
        for ch in list(self.channels.values()):
            ch.release()
        self.channels.clear()
        if self.vhost is not None:
            self.vhost.drop_exclusive(self.id)

    # -- timers ----------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """Heartbeats and timeouts; the shell calls this about once a second."""
        now = self.clock() if now is None else now
        state = self.state
        if state is ConnectionState.CLOSED:
            return
        if state is ConnectionState.CLOSING:
            if now - self._closing_since > CLOSE_TIMEOUT:
                self._finish_close()
            return
        if state is ConnectionState.AWAIT_ADMISSION:
            if now >= self._admission_deadline and self._admission is not None:
                self.connection_error(INTERNAL_ERROR, self._admission.reason)
            return
        if state is not ConnectionState.OPEN:
            if now - self.created > HANDSHAKE_TIMEOUT:
                log.info("handshake timeout conn=%d peer=%s", self.id, self.name)
                self._teardown()
                self.state = ConnectionState.CLOSED
            return
        if self.read_paused:
            self.last_received = now  # not reading: its heartbeats wait in the socket
        if self.heartbeat:
            if now - self.last_received > 2 * self.heartbeat:
                log.warning(
                    "missed heartbeats conn=%d peer=%s timeout=%ds",
                    self.id,
                    self.name,
                    2 * self.heartbeat,
                )
                self.close_reason = "missed heartbeats from client"
                self._teardown()
                self.state = ConnectionState.CLOSED
                return
            if now - self.last_sent >= self.heartbeat / 2 and not self._out:
                self.write(HEARTBEAT_FRAME)

    def set_blocked(self, reason: str | None) -> None:
        """connection.blocked / unblocked, for clients that declared the capability;
        while blocked, a publish stops the reading (``read_paused``) until unblocked."""
        if reason == self.blocked_reason:
            return
        was = self.blocked_reason
        self.blocked_reason = reason
        if self.state is ConnectionState.OPEN and self.capabilities.get("connection.blocked"):
            if reason is None:
                self.send_method(0, commands.Connection.Unblocked())
            elif was is None:
                self.send_method(0, commands.Connection.Blocked(reason))
        if reason is None and self.read_paused:
            self.read_paused = False
            self.last_received = self.clock()  # the client's heartbeats waited unread
            self._resume()

    # -- returned-message limit (seed 000) ---------------------------------------

    def may_return(self) -> bool:
        now = self.clock()
        if now - self._returns_window >= 1.0:
            self._returns_window = now
            self._returns_in_window = 0
        if self._returns_in_window >= self.broker.limits.max_returns_per_second:
            self.returns_dropped += 1
            if self.returns_dropped == 1 or self.returns_dropped % 1000 == 0:
                log.warning(
                    "return limit conn=%d peer=%s dropped=%d",
                    self.id,
                    self.name,
                    self.returns_dropped,
                )
            return False
        self._returns_in_window += 1
        return True

    # -- the handshake -----------------------------------------------------------

    def _resume(self) -> None:
        """The answer came: process the frames that waited for it, then the buffer."""
        frames, error = self._pending, self._pending_error
        self._pending, self._pending_error = [], None
        if frames or error is not None:
            self._process(frames, error)
        if self._buf and not self._holding and self.state is not ConnectionState.CLOSED:
            self.receive_data(b"")

    # -- channels ------------------------------------------------------------------

    def _open_channel(self, number: int) -> None:
        if not self.cluster_link:
            self.broker.check_channel(self.vhost.name, len(self.channels), self.channel_max)
        if number > self.channel_max:
            raise ConnectionError_(
                CHANNEL_ERROR, f"channel {number} exceeds channel_max {self.channel_max}"
            )
        self.channels[number] = Channel(self, number)
        self.send_method(number, commands.Channel.OpenOk())

    def channel_closed(self, number: int) -> None:
        self.channels.pop(number, None)

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "peer": self.name,
            "state": self.state.value,
            "user": getattr(self.user, "name", None),
            "vhost": getattr(self.vhost, "name", None),
            "client": self.client_properties.get("product"),
            "connection_name": self.client_properties.get("connection_name"),
            "channels": len(self.channels),
            "heartbeat": self.heartbeat,
            "messages_in": self.messages_in,
            "messages_out": self.messages_out,
        }
