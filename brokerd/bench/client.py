"""A minimal blocking AMQP 0-9-1 client over a plain socket.

Just enough for the benchmark: the handshake (protocol header, start-ok with
PLAIN, tune-ok, open), channels, synchronous methods (declare, bind, purge,
delete, consume, confirm.select) and an orderly close. The hot loops of the
publisher and the consumer (``workers``) use the socket directly.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.bench import frames
from brokerd.bench.frames import AMQPURL, FrameError

CLIENT_PROPERTIES: dict[str, Any] = {
    "product": "rookery-bench",
    "version": "0.1.0",
    "platform": "Python",
    "information": "python -m brokerd.bench",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "authentication_failure_close": True,
    },
}


#: connection.close-ok (10, 51) and connection.close (10, 50) as they start a method payload
_CLOSE_IDS = (b"\x00\x0a\x00\x33", b"\x00\x0a\x00\x32")


class ServerClosed(Exception):
    """The server closed the connection or a channel (with its reply code and text)."""


class Client:
    """One AMQP connection; methods block until the server's reply arrives."""

    def __init__(self, url: AMQPURL, *, timeout: float = 10.0, name: str = "control") -> None:
        self.url = url
        self.timeout = timeout
        self.name = name
        self.sock: socket.socket | None = None
        self.buf = bytearray()
        self.frame_max = frames.FRAME_MIN_SIZE
        self.channel_max = 0
        self.server_properties: dict[str, Any] = {}
        #: method frames that arrived while waiting for something else
        self.pending: list[tuple[int, Method]] = []
        #: basic.deliver frames skipped while waiting for a reply
        self.early_deliveries = 0
        self._next_channel = 1

    # -- connection ------------------------------------------------------------------

    def connect(self) -> Client:
        sock = socket.create_connection((self.url.host, self.url.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        context = self.url.ssl_context()
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=self.url.host)
        self.sock = sock
        sock.sendall(frames.PROTOCOL_HEADER)
        start = self.wait(0, commands.Connection.Start)
        self.server_properties = dict(start.server_properties or {})
        mechanisms = (start.mechanisms or "").split()
        if "PLAIN" not in mechanisms:
            raise ServerClosed(f"server does not offer PLAIN (offers {mechanisms})")
        response = f"\0{self.url.user}\0{self.url.password}"
        client_properties = dict(CLIENT_PROPERTIES, connection_name=self.name)
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties=client_properties,
                mechanism="PLAIN",
                response=response,
                locale="en_US",
            ),
        )
        tune = self.wait(0, commands.Connection.Tune)
        self.frame_max = tune.frame_max or 131072
        self.channel_max = tune.channel_max or 2047
        # heartbeat 0: the benchmark's hot loops do not send heartbeats
        self.send(
            0,
            commands.Connection.TuneOk(
                channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=0
            ),
        )
        self.send(0, commands.Connection.Open(virtual_host=self.url.vhost))
        self.wait(0, commands.Connection.OpenOk)
        return self

    def close(self) -> None:
        """connection.close and wait (briefly) for close-ok; then drop the socket."""
        sock = self.sock
        if sock is None:
            return
        try:
            self.send(
                0,
                commands.Connection.Close(
                    reply_code=200, reply_text="bench done", class_id=0, method_id=0
                ),
            )
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                if self.drain_until_close_ok(deadline - time.monotonic()):
                    break
        except (OSError, ServerClosed, FrameError):
            pass
        finally:
            self.sock = None
            sock.close()

    def drain_until_close_ok(self, timeout: float) -> bool:
        """Read (and discard deliveries) until connection.close-ok; True when seen."""
        assert self.sock is not None
        self.sock.settimeout(max(timeout, 0.01))
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return False
        if not data:
            return True
        self.buf += data
        others: list[tuple[int, bytes]] = []
        counts = [0] * 65536
        pos = frames.scan_frames(self.buf, 0, len(self.buf), counts, others)
        del self.buf[:pos]
        return any(payload[:4] in _CLOSE_IDS for _channel, payload in others)

    # -- channels ----------------------------------------------------------------------

    def open_channel(self) -> int:
        number = self._next_channel
        self._next_channel += 1
        self.send(number, commands.Channel.Open())
        self.wait(number, commands.Channel.OpenOk)
        return number

    # -- frames --------------------------------------------------------------------------

    def send(self, channel: int, method: Method) -> None:
        assert self.sock is not None
        self.sock.sendall(frames.method_frame(channel, method))

    def send_raw(self, data: bytes) -> None:
        assert self.sock is not None
        self.sock.sendall(data)

    def _read_frame(self) -> tuple[int, int, bytes]:
        """The next whole frame as ``(type, channel, payload)``."""
        assert self.sock is not None
        buf = self.buf
        while True:
            if len(buf) >= 8:
                ftype, channel, size = frames._unpack_head(buf, 0)
                if len(buf) >= size + 8:
                    if buf[size + 7] != frames.FRAME_END:
                        raise FrameError("frame end octet is not 0xce")
                    payload = bytes(buf[7 : 7 + size])
                    del buf[: size + 8]
                    return ftype, channel, payload
            self.sock.settimeout(self.timeout)
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                raise ServerClosed(f"{self.name}: no reply from the server") from None
            if not data:
                if buf.startswith(b"AMQP"):
                    raise ServerClosed(f"server refused the protocol header {bytes(buf[:8])!r}")
                raise ServerClosed(f"{self.name}: server closed the connection")
            buf += data

    def wait(self, channel: int, *expected: type[Method]) -> Any:
        """Block until one of ``expected`` arrives on ``channel``; raise on close."""
        while True:
            ftype, ch, payload = self._read_frame()
            if ftype != frames.FRAME_METHOD:
                continue  # heartbeats, content of deliveries
            if payload[:4] == b"\x00\x3c\x00\x3c":
                self.early_deliveries += 1
                continue
            method = frames.decode_method(payload)
            if isinstance(method, commands.Connection.Close):
                self.send(0, commands.Connection.CloseOk())
                raise ServerClosed(
                    f"connection closed by server: {method.reply_code} {method.reply_text}"
                )
            if isinstance(method, commands.Channel.Close):
                self.send(ch, commands.Channel.CloseOk())
                raise ServerClosed(
                    f"channel {ch} closed by server: {method.reply_code} {method.reply_text}"
                )
            if ch == channel and isinstance(method, expected):
                return method
            self.pending.append((ch, method))

    def rpc(self, channel: int, method: Method, *expected: type[Method]) -> Any:
        self.send(channel, method)
        return self.wait(channel, *expected)

    def rpc_many(self, channel: int, methods: list[Method], expected: type[Method]) -> list[Any]:
        """Pipelined: send every method in one write, then read the replies (in order)."""
        self.send_raw(b"".join(frames.method_frame(channel, m) for m in methods))
        return [self.wait(channel, expected) for _ in methods]

    # -- the few synchronous methods the benchmark needs ---------------------------------

    def queue_declare(
        self,
        channel: int,
        name: str,
        *,
        passive: bool = False,
        arguments: dict[str, Any] | None = None,
        durable: bool = False,
    ) -> commands.Queue.DeclareOk:
        durable = durable or bool(arguments and arguments.get("x-queue-type") == "quorum")
        return self.rpc(
            channel,
            commands.Queue.Declare(
                queue=name, passive=passive, durable=durable, arguments=arguments or {}
            ),
            commands.Queue.DeclareOk,
        )

    def queue_depth(self, channel: int, name: str) -> int:
        return int(self.queue_declare(channel, name, passive=True).message_count)

    def queue_depths(self, channel: int, names: list[str]) -> list[int]:
        """message_count of every queue (passive declares, pipelined)."""
        methods = [commands.Queue.Declare(queue=name, passive=True) for name in names]
        return [
            int(ok.message_count)
            for ok in self.rpc_many(channel, methods, commands.Queue.DeclareOk)
        ]

    def queue_purges(self, channel: int, names: list[str]) -> list[int]:
        """Purge every queue (pipelined); the purged message counts."""
        methods = [commands.Queue.Purge(queue=name) for name in names]
        return [
            int(ok.message_count) for ok in self.rpc_many(channel, methods, commands.Queue.PurgeOk)
        ]

    def queue_purge(self, channel: int, name: str) -> int:
        ok = self.rpc(channel, commands.Queue.Purge(queue=name), commands.Queue.PurgeOk)
        return int(ok.message_count)

    def queue_delete(self, channel: int, name: str) -> int:
        ok = self.rpc(channel, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)
        return int(ok.message_count)

    def queue_bind(self, channel: int, queue: str, exchange: str, routing_key: str = "") -> None:
        self.rpc(
            channel,
            commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=routing_key),
            commands.Queue.BindOk,
        )

    def exchange_declare(self, channel: int, name: str, kind: str) -> None:
        self.rpc(
            channel,
            commands.Exchange.Declare(exchange=name, exchange_type=kind),
            commands.Exchange.DeclareOk,
        )

    def exchange_delete(self, channel: int, name: str) -> None:
        self.rpc(channel, commands.Exchange.Delete(exchange=name), commands.Exchange.DeleteOk)

    def confirm_select(self, channel: int) -> None:
        self.rpc(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)

    def basic_consume(self, channel: int, queue: str, tag: str, *, no_ack: bool = True) -> None:
        self.rpc(
            channel,
            commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack),
            commands.Basic.ConsumeOk,
        )
