"""The publisher and consumer processes.

Both talk to the coordinator only through shared memory (``Shared``): plain
64-bit counters that the workers overwrite after every socket read or write
and that the coordinator samples at the edges of the measurement window.
No locks: each counter has exactly one writer, and aligned 8-byte stores are
atomic on the platforms this runs on.
"""

from __future__ import annotations

import contextlib
import select
import selectors
import signal
import socket
import ssl
import sys
import traceback
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext

from brokerd.bench import frames
from brokerd.bench.client import Client, ServerClosed
from brokerd.bench.frames import AMQPURL, FrameError

#: per-connection receive buffer of the consumer (and the publisher's confirm reader)
RECV_BUFFER = 1 << 21

# worker status values (Shared.status)
STARTING, READY, DONE, FAILED = 0, 1, 2, -1

# Shared.pub slots
PUBLISHED, CONFIRMED, NACKED, BLOCKED, THROTTLED = range(5)


class Shared:
    """Counters shared between the coordinator and the workers of one scenario run."""

    def __init__(self, ctx: BaseContext, queues: int, workers: int) -> None:
        self.stop = ctx.RawValue("b", 0)
        #: published, confirmed (acked+nacked), nacked, connection blocked, throttle waits
        self.pub = ctx.RawArray("q", 5)
        #: basic.deliver frames received, per queue
        self.delivered = ctx.RawArray("q", max(queues, 1))
        self.status = ctx.RawArray("i", workers)


@dataclass
class PublisherConfig:
    url: str
    exchange: str
    routing_key: str
    body_size: int
    #: messages per pre-encoded buffer (one sendall)
    batch: int
    #: most unconfirmed messages in flight; 0 = no publisher confirms (TCP backpressure only)
    window: int
    #: most messages published but not yet delivered from the slowest of ``backlog_queues``
    max_backlog: int = 0
    backlog_queues: list[int] = field(default_factory=list)
    #: delivery-mode 2 (stored on disk by a durable queue)
    persistent: bool = False


@dataclass
class ConsumerConfig:
    url: str
    #: one list per connection: (queue index, queue name), one channel each
    connections: list[list[tuple[int, str]]]


def _fail(shared: Shared, slot: int, role: str) -> None:
    shared.status[slot] = FAILED
    print(f"bench {role} failed:", file=sys.stderr)
    traceback.print_exc()


def _check_others(others: list[tuple[int, bytes]], role: str) -> list[tuple[bool, int, bool]]:
    """Handle the non-deliver method frames; returns the confirms among them."""
    confirms = []
    for channel, payload in others:
        confirm = frames.confirm_of(payload)
        if confirm is not None:
            confirms.append(confirm)
            continue
        ids = payload[:4]
        if ids in (b"\x00\x0a\x00\x32", b"\x00\x14\x00\x28"):  # connection.close, channel.close
            method = frames.decode_method(payload)
            raise ServerClosed(
                f"{role}: server closed channel {channel}: {method.reply_code} {method.reply_text}"
            )
    return confirms


# -- publisher ------------------------------------------------------------------------


class _Confirms:
    """Publisher-confirm bookkeeping: how many sequence numbers are settled."""

    def __init__(self) -> None:
        self.upto = 0  # every tag <= upto is settled
        self.singles: set[int] = set()
        self.nacked = 0

    def settle(self, is_ack: bool, tag: int, multiple: bool) -> None:
        if multiple:
            if tag > self.upto:
                if not is_ack:
                    # tags (upto, tag] not already settled one by one are all nacked
                    self.nacked += tag - self.upto - sum(1 for t in self.singles if t <= tag)
                self.upto = tag
                self.singles = {t for t in self.singles if t > tag}
        elif tag > self.upto and tag not in self.singles:
            self.singles.add(tag)
            if not is_ack:
                self.nacked += 1
        while self.upto + 1 in self.singles:
            self.upto += 1
            self.singles.discard(self.upto)

    @property
    def settled(self) -> int:
        return self.upto + len(self.singles)


def run_publisher(cfg: PublisherConfig, shared: Shared, slot: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator stops us through ``stop``
    try:
        _publisher(cfg, shared, slot)
    except BaseException:
        if not shared.stop.value:
            _fail(shared, slot, "publisher")
            raise SystemExit(1) from None
    shared.status[slot] = DONE


def _publisher(cfg: PublisherConfig, shared: Shared, slot: int) -> None:
    client = Client(AMQPURL(cfg.url), name="bench-publisher").connect()
    channel = client.open_channel()
    confirm = cfg.window > 0
    if confirm:
        client.confirm_select(channel)
    body = frames.make_body(cfg.body_size)
    batch_size = cfg.batch
    batch = frames.publish_batch(
        channel,
        cfg.exchange,
        cfg.routing_key,
        body,
        batch_size,
        client.frame_max,
        cfg.persistent,
    )
    sock = client.sock
    assert sock is not None
    sock.settimeout(None)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    tls = isinstance(sock, ssl.SSLSocket)
    buf, view, have = frames.read_buffer(RECV_BUFFER, client.frame_max, client.buf)
    counts = [0] * (client.channel_max + 2)
    others: list[tuple[int, bytes]] = []
    state = _Confirms()
    pub = shared.pub
    delivered = shared.delivered
    stop = shared.stop
    window = cfg.window
    max_backlog = cfg.max_backlog
    backlog_queues = cfg.backlog_queues if max_backlog else []
    published = 0
    throttled = 0
    shared.status[slot] = READY
    try:
        while not stop.value:
            wait_ms = 0
            if confirm and published - state.settled + batch_size > window:
                wait_ms = 50
            elif backlog_queues and (
                published - min(delivered[i] for i in backlog_queues) + batch_size > max_backlog
            ):
                wait_ms = 1
                throttled += 1
                pub[THROTTLED] = throttled
            else:
                sock.sendall(batch)
                published += batch_size
                pub[PUBLISHED] = published
                if not confirm:
                    continue
            # over TLS, bytes already decrypted wait in the SSL object, not the socket
            if not (tls and sock.pending()) and not poller.poll(wait_ms):  # type: ignore[attr-defined]
                continue
            n = sock.recv_into(view[have:])
            if not n:
                raise ServerClosed("publisher: server closed the connection")
            have += n
            pos = frames.scan_frames(buf, 0, have, counts, others)
            have = frames.keep_tail(buf, view, pos, have)
            if others:
                for is_ack, tag, multiple in _check_others(others, "publisher"):
                    state.settle(is_ack, tag, multiple)
                blocked = any(p[:4] == b"\x00\x0a\x00\x3c" for _, p in others)
                unblocked = any(p[:4] == b"\x00\x0a\x00\x3d" for _, p in others)
                if blocked or unblocked:
                    pub[BLOCKED] = int(blocked and not unblocked)
                others.clear()
                pub[CONFIRMED] = state.settled
                pub[NACKED] = state.nacked
    finally:
        client.buf = bytearray(view[:have])
        view.release()
        client.close()


# -- consumer -----------------------------------------------------------------------------


class _ConsumerConn:
    def __init__(self, client: Client, channel_queue: dict[int, int]) -> None:
        assert client.sock is not None
        self.client = client
        self.sock: socket.socket = client.sock
        self.buf = bytearray(max(RECV_BUFFER, 4 * client.frame_max))
        self.view = memoryview(self.buf)
        self.have = len(client.buf)
        self.buf[: self.have] = client.buf
        self.counter = frames.DeliveryCounter(max(channel_queue))
        self.counts = self.counter.counts
        self.others = self.counter.others
        self.channel_queue = list(channel_queue.items())


def run_consumer(cfg: ConsumerConfig, shared: Shared, slot: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _consumer(cfg, shared, slot)
    except BaseException:
        if not shared.stop.value:
            _fail(shared, slot, "consumer")
            raise SystemExit(1) from None
    shared.status[slot] = DONE


def _consumer(cfg: ConsumerConfig, shared: Shared, slot: int) -> None:
    url = AMQPURL(cfg.url)
    conns: list[_ConsumerConn] = []
    selector = selectors.DefaultSelector()
    try:
        for group in cfg.connections:
            client = Client(url, name="bench-consumer").connect()
            channel_queue = {}
            for index, queue in group:
                channel = client.open_channel()
                client.basic_consume(channel, queue, f"bench-{index}", no_ack=True)
                channel_queue[channel] = index
            client.sock.setblocking(False)  # type: ignore[union-attr]
            conn = _ConsumerConn(client, channel_queue)
            conns.append(conn)
            selector.register(conn.sock, selectors.EVENT_READ, conn)
        shared.status[slot] = READY
        delivered = shared.delivered
        stop = shared.stop
        while not stop.value:
            # over TLS, bytes already decrypted wait in the SSL object, not the socket
            ready = [c for c in conns if isinstance(c.sock, ssl.SSLSocket) and c.sock.pending()]
            for conn in ready or [key.data for key, _mask in selector.select(0.2)]:
                buf, have = conn.buf, conn.have
                try:
                    n = conn.sock.recv_into(conn.view[have:])
                except (BlockingIOError, ssl.SSLWantReadError):
                    continue
                if not n:
                    raise ServerClosed("consumer: server closed the connection")
                have += n
                counts = conn.counts
                pos = conn.counter.scan(buf, 0, have)
                have = frames.keep_tail(buf, conn.view, pos, have)
                conn.have = have
                for channel, index in conn.channel_queue:
                    delivered[index] = counts[channel]
                if conn.others:
                    _check_others(conn.others, "consumer")
                    conn.others.clear()
    finally:
        for conn in conns:
            with contextlib.suppress(OSError, KeyError, ValueError):
                selector.unregister(conn.sock)
            conn.sock.setblocking(True)
            conn.client.buf = bytearray(conn.view[: conn.have])
            conn.view.release()
            conn.client.close()
        selector.close()


__all__ = [
    "ConsumerConfig",
    "FrameError",
    "PublisherConfig",
    "Shared",
    "run_consumer",
    "run_publisher",
]
