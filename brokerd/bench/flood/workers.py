"""The flood's worker processes: shared counters, the publisher and the consumer.

Workers speak AMQP over sockets only (``brokerd.bench.client``/``frames``) and
never load a broker module; they run in spawned processes, so this module is
what each of them imports.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from dataclasses import dataclass
from multiprocessing.context import BaseContext

from brokerd.bench import frames
from brokerd.bench.client import Client, ServerClosed
from brokerd.bench.frames import AMQPURL, FrameError
from brokerd.bench.workers import DONE, FAILED, READY, RECV_BUFFER, _check_others, _Confirms

#: characters kept of a worker's first and last error
ERROR_TEXT = 240


class FloodShared:
    """Counters shared by the coordinator and the flood's workers (one writer each).

    Times are ``time.monotonic()``, one clock for every process on Linux.
    Slots: consumers first (one per queue), then publishers.
    """

    def __init__(self, ctx: BaseContext, queues: int, publishers: int) -> None:
        workers = queues + publishers
        self.go = ctx.RawValue("b", 0)
        self.stop = ctx.RawValue("b", 0)
        self.status = ctx.RawArray("i", workers)
        #: server closes / lost connections per worker
        self.closes = ctx.RawArray("q", workers)
        self.first_error = [ctx.RawArray("c", ERROR_TEXT) for _ in range(workers)]
        self.last_error = [ctx.RawArray("c", ERROR_TEXT) for _ in range(workers)]
        self.published = ctx.RawArray("q", publishers)
        self.acked = ctx.RawArray("q", publishers)
        self.nacked = ctx.RawArray("q", publishers)
        self.blocked = ctx.RawArray("q", publishers)
        self.pub_start = ctx.RawArray("d", publishers)
        #: the last publish written to the socket / close-ok received (every publish read)
        self.pub_written = ctx.RawArray("d", publishers)
        self.pub_taken = ctx.RawArray("d", publishers)
        self.delivered = ctx.RawArray("q", queues)
        self.first_delivery = ctx.RawArray("d", queues)
        self.last_delivery = ctx.RawArray("d", queues)


def _note(shared: FloodShared, slot: int, text: str) -> None:
    data = text.encode(errors="replace")[: ERROR_TEXT - 1]
    if not shared.first_error[slot].value:
        shared.first_error[slot].value = data
    shared.last_error[slot].value = data


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Stopped(Exception):
    """The coordinator asked to stop, or the run's deadline passed."""


def _check(shared: FloodShared, deadline: float, parent: int) -> None:
    if shared.stop.value or time.monotonic() > deadline or os.getppid() != parent:
        raise _Stopped


def _connect(url: str, name: str, shared: FloodShared, deadline: float, parent: int) -> Client:
    """Connect, retrying refusals (a cluster that is not ready) until the deadline."""
    for _attempt in range(10_000):
        _check(shared, deadline, parent)
        client = Client(AMQPURL(url), timeout=10.0, name=name)
        try:
            return client.connect()
        except (OSError, ServerClosed, FrameError):
            if client.sock is not None:
                client.sock.close()
                client.sock = None
            time.sleep(0.2)
    raise _Stopped


def drop(client: Client) -> None:
    """Close a failed connection's socket without a handshake."""
    if client.sock is not None:
        with contextlib.suppress(OSError):
            client.sock.close()
        client.sock = None


def _server_frames(others: list[tuple[int, bytes]], role: str) -> list[tuple[bool, int, bool]]:
    """Confirms among the rare method frames; raises on a close or a consumer cancel."""
    for channel, payload in others:
        if payload[:4] == b"\x00\x3c\x00\x1e":  # basic.cancel from the server
            raise ServerClosed(f"{role}: server cancelled the consumer on channel {channel}")
    return _check_others(others, role)


# -- publisher --------------------------------------------------------------------------------


@dataclass
class PublisherJob:
    url: str
    queue: str
    #: this publisher's index (its counters)
    index: int
    messages: int
    body_size: int
    batch: int
    #: most unconfirmed in flight; 0 = no confirms (TCP backpressure only)
    window: int
    #: monotonic time after which everything gives up
    deadline: float
    parent: int


def run_flood_publisher(job: PublisherJob, shared: FloodShared, slot: int) -> None:
    """Process entry: publish, note how it ended; the coordinator stops us through ``stop``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _publish(job, shared, slot)
        shared.status[slot] = DONE
    except _Stopped:
        shared.status[slot] = DONE if shared.pub_taken[job.index] else FAILED
        if not shared.pub_taken[job.index]:
            _note(shared, slot, "stopped before the server took every publish")
    except BaseException as exc:
        shared.closes[slot] += 1
        _note(shared, slot, error_text(exc))
        shared.status[slot] = FAILED


def _publish(job: PublisherJob, shared: FloodShared, slot: int) -> None:
    client = _connect(job.url, f"flood-publisher-{job.index}", shared, job.deadline, job.parent)
    try:
        channel = client.open_channel()
        confirm = job.window > 0
        if confirm:
            client.confirm_select(channel)
        batch = min(job.batch, job.window) if confirm else job.batch
        body = frames.make_body(job.body_size)
        full = frames.publish_batch(channel, "", job.queue, body, batch, client.frame_max)
        per_message = len(full) // batch
        shared.status[slot] = READY
        while not shared.go.value:
            _check(shared, job.deadline, job.parent)
            time.sleep(0.002)
        shared.pub_start[job.index] = time.monotonic()
        _flood(client, job, shared, full, per_message, batch, confirm)
        shared.pub_written[job.index] = time.monotonic()
        _close_patiently(client, job, shared)
        shared.pub_taken[job.index] = time.monotonic()
    except BaseException:
        drop(client)
        raise


def _flood(
    client: Client,
    job: PublisherJob,
    shared: FloodShared,
    full: bytes,
    per_message: int,
    batch: int,
    confirm: bool,
) -> None:
    """Write ``job.messages`` publishes with non-blocking sends (so ``stop`` and the
    deadline are seen even while TCP holds us), reading confirms and closes."""
    sock = client.sock
    assert sock is not None
    sock.setblocking(False)
    poller = select.poll()
    buf, view, have = frames.read_buffer(RECV_BUFFER, client.frame_max, client.buf)
    counts = [0] * (client.channel_max + 2)
    others: list[tuple[int, bytes]] = []
    state = _Confirms()
    index = job.index
    published = 0
    pending = memoryview(b"")
    pending_count = 0
    poller.register(sock, select.POLLIN)
    writing = False
    try:
        # bound: every turn either sends, reads, or waits up to 0.2 s for the deadline
        while True:
            _check(shared, job.deadline, job.parent)
            if not pending and published < job.messages:
                n = min(batch, job.messages - published)
                if not confirm or published + n - state.settled <= job.window:
                    pending = memoryview(full if n == batch else full[: n * per_message])
                    pending_count = n
            sent = 0
            if pending:
                try:
                    sent = sock.send(pending)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                pending = pending[sent:]
                if not pending:
                    published += pending_count
                    shared.published[index] = published
            elif published >= job.messages and (not confirm or state.settled >= published):
                return
            if bool(pending) != writing:
                writing = bool(pending)
                poller.modify(sock, select.POLLIN | (select.POLLOUT if writing else 0))
            events = poller.poll(0 if sent else 200)
            if not any(mask & ~select.POLLOUT for _fd, mask in events):
                continue
            try:
                n = sock.recv_into(view[have:])
            except (BlockingIOError, InterruptedError):
                continue
            if not n:
                raise ServerClosed("publisher: server closed the connection")
            have += n
            pos = frames.scan_frames(buf, 0, have, counts, others)
            have = frames.keep_tail(buf, view, pos, have)
            if others:
                for is_ack, tag, multiple in _server_frames(others, "publisher"):
                    state.settle(is_ack, tag, multiple)
                if any(p[:4] == b"\x00\x0a\x00\x3c" for _, p in others):  # connection.blocked
                    shared.blocked[index] += 1
                others.clear()
                shared.acked[index] = state.settled - state.nacked
                shared.nacked[index] = state.nacked
    finally:
        client.buf = bytearray(view[:have])
        view.release()
        sock.setblocking(True)


def _close_patiently(client: Client, job: PublisherJob, shared: FloodShared) -> None:
    """connection.close, then wait for close-ok until the deadline (not Client.close's
    5 s): dropping the socket earlier would throw away publishes the server has not
    read yet, and count a server's slowness as loss."""
    from pamqp import commands

    client.send(
        0,
        commands.Connection.Close(reply_code=200, reply_text="flood done", class_id=0, method_id=0),
    )
    for _turn in range(1_000_000):
        _check(shared, job.deadline, job.parent)
        if client.drain_until_close_ok(0.5):
            break
    drop(client)


# -- consumer ---------------------------------------------------------------------------------


@dataclass
class ConsumerJob:
    url: str
    queue: str
    index: int
    deadline: float
    parent: int
    #: most reconnections after the server closed us
    max_reconnects: int = 1000


def run_flood_consumer(job: ConsumerJob, shared: FloodShared, slot: int) -> None:
    """Process entry: count deliveries of one queue, reconnecting after server closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _consume(job, shared, slot)
        shared.status[slot] = DONE
    except _Stopped:
        shared.status[slot] = DONE
    except BaseException as exc:
        _note(shared, slot, error_text(exc))
        shared.status[slot] = FAILED


def _consume(job: ConsumerJob, shared: FloodShared, slot: int) -> None:
    base = 0  # deliveries counted on earlier connections
    for _connection in range(job.max_reconnects + 1):
        client = _connect(job.url, f"flood-consumer-{job.index}", shared, job.deadline, job.parent)
        try:
            channel = client.open_channel()
            client.basic_consume(channel, job.queue, f"flood-{job.index}", no_ack=True)
            base += client.early_deliveries
            shared.status[slot] = READY
            base += _count(client, channel, job, shared, base)
            client.close()  # stopped: a clean close
            return
        except (OSError, ServerClosed, FrameError) as exc:
            if isinstance(exc, _CountedClose):
                base += exc.counted
            shared.closes[slot] += 1
            _note(shared, slot, error_text(exc))
            drop(client)
            time.sleep(0.1)
    raise ServerClosed(f"consumer: closed more than {job.max_reconnects} times")


def _count(client: Client, channel: int, job: ConsumerJob, shared: FloodShared, base: int) -> int:
    """Count this connection's deliveries into ``shared`` until stopped or closed.

    Returns the count once stopped; when the server closes us, raises
    ``_CountedClose`` carrying it (deliveries read with the close count too).
    """
    sock = client.sock
    assert sock is not None
    sock.setblocking(False)
    buf, view, have = frames.read_buffer(RECV_BUFFER, client.frame_max, client.buf)
    counter = frames.DeliveryCounter(channel)
    counts = counter.counts
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    index = job.index
    delivered, first, last = shared.delivered, shared.first_delivery, shared.last_delivery
    seen = 0
    try:
        while True:
            try:
                _check(shared, job.deadline, job.parent)
            except _Stopped:
                return seen
            if not poller.poll(200):
                continue
            try:
                n = sock.recv_into(view[have:])
            except (BlockingIOError, InterruptedError):
                continue
            if not n:
                raise ServerClosed("consumer: server closed the connection")
            have += n
            pos = counter.scan(buf, 0, have)
            have = frames.keep_tail(buf, view, pos, have)
            if counts[channel] != seen:
                seen = counts[channel]
                now = time.monotonic()
                if not first[index]:
                    first[index] = now
                last[index] = now
                delivered[index] = base + seen
            if counter.others:
                try:
                    _server_frames(counter.others, "consumer")
                finally:
                    counter.others.clear()
    except (OSError, ServerClosed, FrameError) as exc:
        raise _CountedClose(seen, exc) from exc
    finally:
        client.buf = bytearray(view[:have])
        view.release()
        with contextlib.suppress(OSError):
            sock.setblocking(True)


class _CountedClose(ServerClosed):
    """A consumer connection ended by the server, with what it had counted."""

    def __init__(self, counted: int, cause: BaseException) -> None:
        super().__init__(error_text(cause))
        self.counted = counted
