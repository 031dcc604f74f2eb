"""The workload: confirmed publishers, flood publishers and acking consumers,
one thread each.

Each client holds a pika BlockingConnection to one server and, when that
server dies, refuses or stalls past the client heartbeat, moves on to the
next server in the list (all of them, secondaries included), as an
application with a host list would. A publisher sends one message at a time
and waits for its confirm, so its publish order is the order it records; a
publish that is nacked, returned or left unanswered is recorded as such and
never sent again with the same sequence number. A flood publisher
(``Flooder``) publishes without confirms, as many applications do, as fast
as its rate and the broker's flow control allow. A consumer records every
delivery before acking it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import AMQPError, NackError, UnroutableError

from tests.faults.history import (
    ACK,
    FLOOD_PREFIX,
    NACK,
    RETURNED,
    UNKNOWN,
    Delivery,
    Publish,
    Recorder,
    body,
    parse,
)

#: client heartbeat (s): a stopped server is left after about two of these
CLIENT_HEARTBEAT = 2
#: a connection blocked this long (no root) is given up for another server
BLOCKED_TIMEOUT = 10.0
#: connection.open may wait for a root (open_timeout in the cluster file) before 541
OPEN_WAIT = 8.0
BACKOFF = 0.1
#: a flood publisher ahead of its rate by less than this publishes on rather than
#: sleep (a sleep shorter than a millisecond or two costs more than it paces)
FLOOD_SLACK = 0.002

# pika narrates every reconnect at INFO: thousands of lines per run, hiding the report
logging.getLogger("pika").setLevel(logging.WARNING)


#: where a server is: its port on loopback, or (host, port) on a network test bed
Endpoint = int | tuple[str, int]


def connect(endpoint: Endpoint) -> BlockingConnection:
    host, port = ("127.0.0.1", endpoint) if isinstance(endpoint, int) else endpoint
    return BlockingConnection(
        pika.ConnectionParameters(
            host,
            port,
            heartbeat=CLIENT_HEARTBEAT,
            blocked_connection_timeout=BLOCKED_TIMEOUT,
            socket_timeout=2.0,
            stack_timeout=OPEN_WAIT,
            connection_attempts=1,
        )
    )


def close_quietly(conn: BlockingConnection | None) -> None:
    if conn is not None and conn.is_open:
        with contextlib.suppress(Exception):
            conn.close()


class Client(threading.Thread):
    """Reconnects through ``ports`` in turn, from ``home``; ``server`` is where it is now."""

    def __init__(self, name: str, ports: Sequence[Endpoint], home: int, recorder: Recorder) -> None:
        super().__init__(name=name, daemon=True)
        self.ports = list(ports)
        self.next = home % len(self.ports)
        self.recorder = recorder
        self.stop = threading.Event()
        self.server: int | None = None
        self.sessions = 0
        #: why connections ended or failed, by exception type (diagnostics only)
        self.errors: Counter[str] = Counter()
        self.conn: BlockingConnection | None = None

    def connect(self) -> BlockingConnection | None:
        """The next server that lets us in, or None once stopped."""
        while not self.stop.is_set():
            index = self.next
            self.next = (index + 1) % len(self.ports)
            try:
                conn = connect(self.ports[index])
            # pika raises ValueError ("Expected connected socket, but getpeername()
            # failed") when the server resets the connection as it is made (killed then)
            except (AMQPError, OSError, ValueError) as exc:
                self.errors[f"connect {type(exc).__name__}"] += 1
                self.stop.wait(BACKOFF)
                continue
            self.server = index
            self.next = index  # stay here next time unless it fails
            self.sessions += 1
            self.conn = conn
            return conn
        return None

    def lost(self, exc: BaseException) -> None:
        """The connection ended under us: try the next server first."""
        self.errors[type(exc).__name__] += 1
        if self.server is not None:
            self.next = (self.server + 1) % len(self.ports)
        self.server = None

    def halt(self) -> None:
        """Ask the thread to end; a wait for a confirm is cut short by closing."""
        self.stop.set()
        conn = self.conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.add_callback_threadsafe(lambda: close_quietly(conn))

    def run(self) -> None:
        while not self.stop.is_set():
            conn = self.connect()
            if conn is None:
                break
            try:
                self.work(conn, conn.channel())
            except (AMQPError, OSError) as exc:
                self.lost(exc)
            except Exception as exc:
                self.lost(exc)
                self.stop.wait(BACKOFF)
            finally:
                self.conn = None
                close_quietly(conn)

    def work(self, conn: BlockingConnection, channel: BlockingChannel) -> None:
        raise NotImplementedError


class Publisher(Client):
    """Confirmed publishes at ``rate`` per second, each queue in turn."""

    def __init__(
        self,
        name: str,
        ports: Sequence[Endpoint],
        home: int,
        recorder: Recorder,
        queues: Sequence[str],
        *,
        rate: float,
        durable: bool = False,
        pad: int = 0,
    ) -> None:
        super().__init__(name, ports, home, recorder)
        self.queues = list(queues)
        self.period = 1.0 / rate
        self.properties = pika.BasicProperties(delivery_mode=2 if durable else 1)
        self.pad = pad
        self.seq = 0
        self.slowest = 0.0  # the longest wait for a confirm (s)
        #: while a publish waits for its confirm: since when (wall clock), and its queue
        self.waiting_since: float | None = None
        self.waiting_for = ""

    def work(self, conn: BlockingConnection, channel: BlockingChannel) -> None:
        channel.confirm_delivery()
        server = self.server if self.server is not None else -1
        due = time.monotonic()
        while not self.stop.is_set():
            self.seq += 1
            queue = self.queues[self.seq % len(self.queues)]
            sent = time.time()
            outcome = UNKNOWN
            self.waiting_for, self.waiting_since = queue, sent
            try:
                channel.basic_publish(
                    "",
                    queue,
                    body(self.name, self.seq, self.pad),
                    self.properties,
                    mandatory=True,
                )
                outcome = ACK
            except NackError:
                outcome = NACK
            except UnroutableError:
                outcome = RETURNED
            finally:  # UNKNOWN when the connection failed under the publish
                self.waiting_since = None
                done = time.time()
                self.slowest = max(self.slowest, done - sent)
                self.recorder.publish(
                    Publish(self.name, self.seq, queue, server, sent, done, outcome)
                )
            due = max(due + self.period, time.monotonic())
            conn.sleep(max(0.0, due - time.monotonic()))


class Flooder(Client):
    """Unconfirmed publishes (a plain basic_publish) at up to ``rate`` per second,
    each queue in turn, bodies of ``size`` bytes starting ``name:seq:``.

    A message counts as published once basic_publish returned (written to the
    socket); one whose connection failed under it counts as ``cut``. Everything is
    recorded in the arrays of ``history.FloodSession``. Closes (320 included) are
    handled by ``Client.run`` as for the confirmed publishers: on to the next server.
    The stop is checked before every publish; a publish waits at most while the
    broker does not read (its flow control), until the heartbeat (a dead or paused
    server) or the blocked timeout (connection.blocked) ends the connection.
    """

    def __init__(
        self,
        name: str,
        ports: Sequence[Endpoint],
        home: int,
        recorder: Recorder,
        queues: Sequence[str],
        *,
        rate: float,
        size: int = 128,
        durable: bool = False,
    ) -> None:
        if not name.startswith(FLOOD_PREFIX):
            raise ValueError(f"a flood publisher's name starts with {FLOOD_PREFIX!r}: {name!r}")
        super().__init__(name, ports, home, recorder)
        self.queues = list(queues)
        self.period = 1.0 / rate
        self.size = size
        self.filler = b"x" * size
        self.properties = pika.BasicProperties(delivery_mode=2 if durable else 1)
        self.record = recorder.flood_publisher(name, self.queues)
        self.seq = 0

    def work(self, conn: BlockingConnection, channel: BlockingChannel) -> None:
        server = self.server if self.server is not None else -1
        session = self.recorder.flood_session(self.record, server, self.seq + 1, time.time())
        sent = session.sent
        prefix = f"{self.name}:".encode()
        due = time.monotonic()
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                if due - now > FLOOD_SLACK:
                    conn.sleep(due - now)  # also where halt's close callback runs
                    continue
                self.seq += 1
                head = prefix + b"%d:" % self.seq
                try:
                    channel.basic_publish(
                        "",
                        self.queues[self.seq % len(self.queues)],
                        head + self.filler[: max(0, self.size - len(head))],
                        self.properties,
                    )
                except BaseException:
                    session.cut += 1
                    raise
                sent.append(time.time())
                due = max(due + self.period, now)
        except BaseException as exc:
            if not self.stop.is_set():  # else our own close at the stop: not an error
                session.error = f"{type(exc).__name__}: {exc}"[:200]
            raise
        finally:
            session.closed = time.time()


class Consumer(Client):
    """Manual acks with a prefetch window on one queue, at most ``rate`` messages a
    second (None: as fast as they come). A message is recorded when the
    application takes it from the client's buffer, then acked: one still in
    the buffer when the connection dies was never seen, and must come again.
    A consumer slower than the publishers keeps a backlog in the queue, which
    is what a fault can destroy; the drain lifts the limit (``rate = None``).
    """

    def __init__(
        self,
        name: str,
        ports: Sequence[Endpoint],
        home: int,
        recorder: Recorder,
        queue: str,
        *,
        prefetch: int,
        rate: float | None = None,
    ) -> None:
        super().__init__(name, ports, home, recorder)
        self.queue = queue
        self.prefetch = prefetch
        self.rate = rate
        self.consuming = False  # attached (consume-ok received) on the current connection

    def work(self, conn: BlockingConnection, channel: BlockingChannel) -> None:
        server = self.server if self.server is not None else -1
        session = self.sessions
        buffer: deque[tuple[int, bool, bytes]] = deque()

        def on_message(ch: BlockingChannel, method: Any, properties: Any, payload: bytes) -> None:
            buffer.append((method.delivery_tag, bool(method.redelivered), payload))

        cancelled: list[Any] = []
        # a classic queue whose owner died: RabbitMQ and brokerd cancel its consumers;
        # like a real client, this one consumes again (after a back-off)
        channel.add_on_cancel_callback(cancelled.append)
        channel.basic_qos(prefetch_count=self.prefetch)
        channel.basic_consume(self.queue, on_message)
        self.consuming = True
        due = time.monotonic()
        try:
            while not self.stop.is_set():
                if cancelled and not buffer:
                    raise RuntimeError(f"consumer of {self.queue} cancelled by the server")
                now = time.monotonic()
                rate = self.rate
                if not buffer or (rate is not None and now < due):
                    wait = 0.1 if not buffer else due - now
                    conn.process_data_events(time_limit=max(0.0, min(0.1, wait)))
                    continue
                tag, redelivered, payload = buffer.popleft()
                try:
                    publisher, seq = parse(payload)
                except ValueError:
                    publisher, seq = "?", -1
                self.recorder.delivery(
                    Delivery(self.name, session, server, publisher, seq, redelivered, time.time())
                )
                channel.basic_ack(tag)
                due = max(due + 1.0 / rate, now) if rate is not None else now
        finally:
            self.consuming = False


def sweep(ports: Sequence[Endpoint], queues: Sequence[str], recorder: Recorder) -> int:
    """Take whatever is left in ``queues`` with basic.get, through the first server
    that serves; returns how many. Recorded as consumer ``sweep``, one session per
    queue (order holds per queue, not across them)."""
    taken = 0
    for index, port in enumerate(ports):
        try:
            conn = connect(port)
        except (AMQPError, OSError):
            continue
        try:
            channel = conn.channel()
            for session, queue in enumerate(queues, 1):
                while True:
                    method, _props, payload = channel.basic_get(queue)
                    if method is None:
                        break
                    try:
                        publisher, seq = parse(payload)
                    except ValueError:
                        publisher, seq = "?", -1
                    recorder.delivery(
                        Delivery(
                            "sweep",
                            session,
                            index,
                            publisher,
                            seq,
                            bool(method.redelivered),
                            time.time(),
                        )
                    )
                    channel.basic_ack(method.delivery_tag)
                    taken += 1
            return taken
        except (AMQPError, OSError):
            continue
        finally:
            close_quietly(conn)
    raise RuntimeError("no server answered the sweep")


def depths(ports: Sequence[Endpoint], queues: Sequence[str]) -> dict[str, int] | None:
    """Each queue's ready count as the root has it, asked of the first server that answers."""
    for port in ports:
        try:
            conn = connect(port)
        except (AMQPError, OSError):
            continue
        try:
            channel = conn.channel()
            return {q: channel.queue_declare(q, passive=True).method.message_count for q in queues}
        except (AMQPError, OSError):
            continue
        finally:
            close_quietly(conn)
    return None


def declare(
    ports: Sequence[Endpoint], queues: Sequence[str], queue_type: str = "", group_size: int = 0
) -> None:
    """The shared queues. They are durable, so replicated, whether the messages are
    persistent or not: a transient shared queue is classic, lost with its owner, and
    the checker holds the cluster to losing no confirmed message. Queue *i* is
    declared through server *i* and owned there (client-local), so the owners are
    spread and every kind of fault hits one. With ``queue_type`` classic, durable
    classic queues with persistent messages wait for a dead owner's return and must
    then hold every confirmed message. With quorum and ``group_size``, each queue's
    copies are on that many primaries (its owner's and the others')."""
    for i, queue in enumerate(queues):
        conn = connect(ports[i % len(ports)])
        try:
            arguments: dict[str, object] | None = (
                {"x-queue-type": queue_type} if queue_type else None
            )
            if arguments is not None and group_size:
                arguments["x-quorum-initial-group-size"] = group_size
            conn.channel().queue_declare(queue, durable=True, arguments=arguments)
        finally:
            close_quietly(conn)
