"""The scenarios and the coordinator that runs one of them against one broker.

The coordinator (the main process) holds a control connection: it declares
the topology, starts the consumer process(es) and then the publisher, waits
out the warm-up, samples the shared counters once a second through the
measurement window, and finally stops the workers and deletes what it
declared. Nothing here imports the broker: any AMQP 0-9-1 server will do.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from brokerd.bench.client import Client, ServerClosed
from brokerd.bench.frames import AMQPURL, FrameError
from brokerd.bench.workers import (
    BLOCKED,
    CONFIRMED,
    DONE,
    FAILED,
    NACKED,
    PUBLISHED,
    READY,
    THROTTLED,
    ConsumerConfig,
    PublisherConfig,
    Shared,
    run_consumer,
    run_publisher,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    body_size: int
    #: publish through a fanout exchange bound to --queues queues
    fanout: bool
    #: one no-ack consumer per queue
    consumers: bool
    metric: str
    description: str
    #: durable queue, persistent messages (the store's disk path)
    persistent: bool = False
    #: publish into a queue with this x-message-ttl (ms) and no consumer, whose
    #: dead-letter exchange routes every expired message to a second queue; the
    #: consumer reads that one (the expiry and dead-letter path under load)
    dead_letter_ttl: int | None = None


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "queue-250",
            250,
            fanout=False,
            consumers=True,
            metric="deliveries/s",
            description="one queue, 250-byte bodies, one no-ack consumer",
        ),
        Scenario(
            "queue-1000",
            1000,
            fanout=False,
            consumers=True,
            metric="deliveries/s",
            description="one queue, 1000-byte bodies, one no-ack consumer",
        ),
        Scenario(
            "fanout-isr",
            250,
            fanout=True,
            consumers=False,
            metric="routed/s",
            description="fanout exchange into Q queues, no consumers: internal switching "
            "rate = messages routed into queues per second (publish rate x Q)",
        ),
        Scenario(
            "fanout-consumers",
            250,
            fanout=True,
            consumers=True,
            metric="deliveries/s",
            description="fanout exchange into Q queues, one no-ack consumer per queue: "
            "total deliveries per second",
        ),
        Scenario(
            "durable-250",
            250,
            fanout=False,
            consumers=False,
            metric="stored/s",
            description="one durable queue, persistent 250-byte messages, no consumer: "
            "messages confirmed (on disk) per second",
            persistent=True,
        ),
        Scenario(
            "durable-4k",
            4096,
            fanout=False,
            consumers=False,
            metric="stored/s",
            description="one durable queue, persistent 4 KiB messages, no consumer: "
            "messages confirmed (on disk) per second",
            persistent=True,
        ),
        Scenario(
            "ttl-dlx",
            250,
            fanout=False,
            consumers=True,
            metric="dead-lettered/s",
            description="one queue with x-message-ttl 100 ms and a dead-letter exchange, no "
            "consumer; a no-ack consumer on the dead-letter queue: deliveries of expired, "
            "dead-lettered messages per second",
            dead_letter_ttl=100,
        ),
    )
}


@dataclass
class Options:
    duration: float = 8.0
    warmup: float = 2.0
    queues: int = 16
    #: messages per pre-encoded publish buffer
    batch: int = 200
    #: unconfirmed messages in flight; 0 disables confirms (--pacing tcp)
    confirm_window: int = 8000
    #: published-but-not-delivered cap per queue (consumer scenarios)
    max_backlog: int = 100_000
    #: fanout-isr: purge the queues when one holds more than this many messages
    max_depth: int = 250_000
    #: fanout-consumers: "connections" (one per consumer) or "channels" (one connection)
    fanout_layout: str = "connections"
    consumer_procs: int = 1
    body_size: int | None = None
    setup_timeout: float = 15.0
    #: publish and consume through other servers of the same cluster than the
    #: control connection (which declares the queues): cluster scenarios
    publish_url: str | None = None
    consume_url: str | None = None
    #: arguments of the declared queues (e.g. {"x-queue-type": "quorum"})
    queue_arguments: dict[str, Any] | None = None
    #: durable queues and persistent (delivery-mode 2) messages: the disk path
    persistent: bool = False
    #: durable queues with transient messages (a cluster replicates a durable queue
    #: declared without a type, and keeps a transient one on its owner alone)
    durable_queues: bool = False


class BenchError(Exception):
    """The scenario could not run (a worker failed, the server closed, a timeout)."""


@dataclass
class Sample:
    t: float
    published: int
    confirmed: int
    delivered: list[int]
    #: fanout-isr only: per-queue routed-message counts (depth + everything purged so far)
    routed: list[int] = field(default_factory=list)


def _rate(a: float, b: float, dt: float) -> float:
    return (b - a) / dt if dt > 0 else 0.0


#: numbers the runs of this process, for their queue names
_RUN_NUMBERS = itertools.count()


class Run:
    """One scenario against one broker."""

    def __init__(self, url: str, scenario: Scenario, options: Options) -> None:
        self.url = AMQPURL(url)
        self.scenario = scenario
        self.opts = options
        self.nqueues = options.queues if scenario.fanout else 1
        # the run number keeps apart runs built in one millisecond (the spread benchmark
        # builds six at once): with the same names they would share one queue
        stamp = f"{os.getpid()}-{int(time.time() * 1000) % 100000}-{next(_RUN_NUMBERS)}"
        tag = f"rookery-bench-{stamp}-{scenario.name}"
        self.queue_names = [f"{tag}-q{i}" for i in range(self.nqueues)]
        #: ttl-dlx: the TTL queue published to (the consumer reads queue_names[0])
        self.expiring = f"{tag}-ttl" if scenario.dead_letter_ttl is not None else None
        self.exchange = f"{tag}-fanout" if scenario.fanout else ""
        self.persistent = options.persistent or scenario.persistent
        self.control: Client | None = None
        self.channel = 0
        self.procs: list[Any] = []
        self.shared: Shared | None = None
        self.declared_queues: list[str] = []
        self.declared_exchange = False
        self.purged = [0] * self.nqueues
        self.purges = 0
        self.poll_rtt_max = 0.0

    # -- topology ----------------------------------------------------------------------------

    def _connect_control(self) -> None:
        self.control = Client(self.url, name="bench-control").connect()
        self.channel = self.control.open_channel()

    def _declare(self) -> None:
        c, ch = self.control, self.channel
        assert c is not None
        if self.scenario.fanout:
            c.exchange_declare(ch, self.exchange, "fanout")
            self.declared_exchange = True
        for name in self.queue_names:
            c.queue_declare(
                ch,
                name,
                arguments=self.opts.queue_arguments,
                durable=self.persistent or self.opts.durable_queues,
            )
            self.declared_queues.append(name)
            if self.scenario.fanout:
                c.queue_bind(ch, name, self.exchange)
        if self.expiring is not None:
            # expired messages go through the default exchange to the consumed queue
            arguments = {
                **(self.opts.queue_arguments or {}),
                "x-message-ttl": self.scenario.dead_letter_ttl,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": self.queue_names[0],
            }
            c.queue_declare(ch, self.expiring, arguments=arguments, durable=self.persistent)
            self.declared_queues.insert(0, self.expiring)  # deleted first: no more expiries

    def _cleanup(self) -> None:
        if not self.declared_queues and not self.declared_exchange:
            return
        for attempt in range(2):
            try:
                if self.control is None or self.control.sock is None:
                    self._connect_control()
                c, ch = self.control, self.channel
                assert c is not None
                while self.declared_queues:
                    c.queue_delete(ch, self.declared_queues[0])
                    self.declared_queues.pop(0)
                if self.declared_exchange:
                    c.exchange_delete(ch, self.exchange)
                    self.declared_exchange = False
                return
            except (OSError, ServerClosed, FrameError):
                if self.control is not None:
                    with contextlib.suppress(OSError):
                        self.control.close()
                self.control = None
                if attempt:
                    raise

    # -- workers -------------------------------------------------------------------------------

    def _consumer_groups(self) -> list[list[list[tuple[int, str]]]]:
        """Per consumer process: its connections, each a list of (queue index, name)."""
        queues = list(enumerate(self.queue_names))
        if self.scenario.fanout and self.opts.fanout_layout == "channels":
            conns = [queues]
        else:
            conns = [[q] for q in queues]
        procs = max(1, min(self.opts.consumer_procs, len(conns)))
        groups: list[list[list[tuple[int, str]]]] = [[] for _ in range(procs)]
        for i, conn in enumerate(conns):
            groups[i % procs].append(conn)
        return groups

    def _start_workers(self) -> None:
        ctx = mp.get_context("spawn")
        groups = self._consumer_groups() if self.scenario.consumers else []
        shared = self.shared = Shared(ctx, self.nqueues, len(groups) + 1)
        for slot, conns in enumerate(groups):
            cfg = ConsumerConfig(self.opts.consume_url or self.url.url, conns)
            proc = ctx.Process(
                target=run_consumer, args=(cfg, shared, slot), name=f"bench-consumer-{slot}"
            )
            proc.start()
            self.procs.append(proc)
        self._wait_ready()
        body_size = self.opts.body_size or self.scenario.body_size
        pcfg = PublisherConfig(
            url=self.opts.publish_url or self.url.url,
            exchange=self.exchange,
            routing_key="" if self.scenario.fanout else self.expiring or self.queue_names[0],
            body_size=body_size,
            batch=self.opts.batch,
            window=self.opts.confirm_window,
            max_backlog=self.opts.max_backlog if self.scenario.consumers else 0,
            backlog_queues=list(range(self.nqueues)) if self.scenario.consumers else [],
            persistent=self.persistent,
        )
        slot = len(groups)
        proc = ctx.Process(target=run_publisher, args=(pcfg, shared, slot), name="bench-publisher")
        proc.start()
        self.procs.append(proc)
        self._wait_ready()

    def _check_workers(self) -> None:
        assert self.shared is not None
        for slot, proc in enumerate(self.procs):
            if self.shared.status[slot] == FAILED or (
                not proc.is_alive() and self.shared.status[slot] != DONE
            ):
                raise BenchError(
                    f"{proc.name} failed (exit code {proc.exitcode}); see its traceback above"
                )

    def _wait_ready(self) -> None:
        assert self.shared is not None
        deadline = time.monotonic() + self.opts.setup_timeout
        while True:
            self._check_workers()
            if all(self.shared.status[slot] == READY for slot in range(len(self.procs))):
                return
            if time.monotonic() > deadline:
                raise BenchError("workers did not connect in time")
            time.sleep(0.02)

    def _stop_workers(self) -> None:
        if self.shared is not None:
            self.shared.stop.value = 1
        # the publisher is last in the list: stop it first so that consumers drain
        for proc in reversed(self.procs):
            proc.join(10.0)
            if proc.is_alive():
                proc.terminate()
                proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.procs.clear()

    # -- sampling ----------------------------------------------------------------------------

    def _poll_depths(self) -> tuple[Sample, Sample | None]:
        """Per-queue routed counts (depth + purged), purging when a queue is too deep.

        The publisher's counters are read right after the depths arrive (before
        any purge), so that both describe the same moment. After a purge a
        second sample is taken: the purge itself (a stall that is the
        benchmark's doing, not the switching under test) falls between the two
        and is left out of the window.
        """
        c, ch, shared = self.control, self.channel, self.shared
        assert c is not None and shared is not None
        t0 = time.monotonic()
        depths = c.queue_depths(ch, self.queue_names)
        # the broker answers as soon as it gets to the request, so the moment the
        # answers arrive is when the depths held (a busy broker delays the answer)
        t = time.monotonic()
        self.poll_rtt_max = max(self.poll_rtt_max, t - t0)
        pub = shared.pub
        sample = Sample(t, pub[PUBLISHED], pub[CONFIRMED], [], [])
        sample.routed = [d + p for d, p in zip(depths, self.purged, strict=True)]
        if max(depths) <= self.opts.max_depth:
            return sample, None
        self.purges += 1
        for i, count in enumerate(c.queue_purges(ch, self.queue_names)):
            self.purged[i] += count
        after, _ = self._poll_depths()
        return sample, after

    def _sample(self) -> tuple[Sample, Sample | None]:
        assert self.shared is not None
        if not self.scenario.consumers:
            return self._poll_depths()
        pub = self.shared.pub
        sample = Sample(
            time.monotonic(), pub[PUBLISHED], pub[CONFIRMED], list(self.shared.delivered)
        )
        return sample, None

    def _sleep_until(self, deadline: float) -> None:
        while True:
            self._check_workers()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.1))

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        try:
            self._connect_control()
            assert self.control is not None
            server = self.control.server_properties
            self._declare()
            self._start_workers()
            start = time.monotonic()
            # warm-up (fanout-isr polls depths meanwhile, to purge when needed)
            while time.monotonic() < start + self.opts.warmup:
                self._sleep_until(min(start + self.opts.warmup, time.monotonic() + 1.0))
                if not self.scenario.consumers:
                    self._poll_depths()
            sample, after = self._sample()
            prev = after or sample
            t0 = prev.t
            ticks = max(1, round(self.opts.duration))
            step = self.opts.duration / ticks
            intervals: list[tuple[Sample, Sample]] = []
            for i in range(1, ticks + 1):
                self._sleep_until(t0 + i * step)
                sample, after = self._sample()
                intervals.append((prev, sample))
                prev = after or sample
            excluded = prev.t - t0 - sum(b.t - a.t for a, b in intervals)
            assert self.shared is not None
            pub = list(self.shared.pub)
            return self._result(server, intervals, pub, excluded)
        finally:
            try:
                self._stop_workers()
            finally:
                try:
                    self._cleanup()
                finally:
                    if self.control is not None:
                        self.control.close()

    def _result(
        self,
        server: dict[str, Any],
        intervals: list[tuple[Sample, Sample]],
        pub: list[int],
        excluded: float,
    ) -> dict[str, Any]:
        dt = sum(b.t - a.t for a, b in intervals)
        q = self.nqueues
        confirm = self.opts.confirm_window > 0
        published = sum(b.published - a.published for a, b in intervals) / dt
        confirmed = sum(b.confirmed - a.confirmed for a, b in intervals) / dt
        result: dict[str, Any] = {
            "scenario": self.scenario.name,
            "metric": self.scenario.metric,
            "url": self.url.redacted,
            "server": {
                "product": _text(server.get("product")),
                "version": _text(server.get("version")),
            },
            "queues": q,
            "body_size": self.opts.body_size or self.scenario.body_size,
            "window_s": round(dt, 3),
            "publish_rate": round(confirmed if confirm else published, 1),
            "publish_rate_written": round(published, 1),
            "nacked": pub[NACKED],
            "connection_blocked": bool(pub[BLOCKED]),
            "backlog_throttle_waits": pub[THROTTLED],
        }
        if self.scenario.consumers:
            per_queue = [
                sum(b.delivered[i] - a.delivered[i] for a, b in intervals) / dt for i in range(q)
            ]
            per_second = [(sum(b.delivered) - sum(a.delivered)) / (b.t - a.t) for a, b in intervals]
            value = sum(per_queue)
            result["deliver_rate"] = round(value, 1)
            if q > 1:
                result["per_queue_rate"] = {
                    "mean": round(statistics.fmean(per_queue), 1),
                    "min": round(min(per_queue), 1),
                    "max": round(max(per_queue), 1),
                }
            last = intervals[-1][1]
            sent = last.confirmed if confirm else last.published
            result["backlog_end"] = sent - min(last.delivered)
        else:
            value = sum(sum(b.routed) - sum(a.routed) for a, b in intervals) / dt
            per_second = [(sum(b.routed) - sum(a.routed)) / (b.t - a.t) for a, b in intervals]
            result["routed_rate"] = round(value, 1)
            result["routed_rate_from_confirms"] = round(confirmed * q, 1) if confirm else None
            result["purges"] = self.purges
            result["purge_pause_s"] = round(excluded, 3)
            result["depth_poll_max_s"] = round(self.poll_rtt_max, 3)
        result["value"] = round(value, 1)
        result["per_second"] = [round(v, 1) for v in per_second]
        return result


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return None if value is None else str(value)


def run_scenario(url: str, name: str, options: Options) -> dict[str, Any]:
    """Run one scenario against the broker at ``url``; the result as a JSON-able dict."""
    return Run(url, SCENARIOS[name], options).run()


def options_dict(options: Options) -> dict[str, Any]:
    return asdict(options)
