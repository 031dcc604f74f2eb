"""The store soak (issue 20): confirmed persistent messages of mixed sizes through
one deep durable queue, drained at varying rates while compaction runs, with
kill -9 restarts in between; every body is checked byte for byte.

    python -m tests.faults.store_soak --messages 2000000 --kills 8 --json soak.json

One standalone brokerd (small segments, frequent compaction, a small queue memory
limit so the queue pages) and two aio-pika clients in this process: a publisher
with confirms (a bounded window) and a consumer (manual ack) whose rate changes
every few seconds, from paused to unthrottled. At random moments the broker is
killed with SIGKILL and started again on the same data directory; both clients
reconnect, the publisher publishes again what was not confirmed.

The verdict: ``lost`` (confirmed, never delivered intact) and ``corrupt``
(a delivered body that is not the one published) must be 0. Duplicates are
counted: a message delivered again after a kill is allowed (its ack, or its
delivery record, may not have reached the disk), flagged redelivered or not.
Exits 1 if a must-be-zero count is not 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import signal
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from brokerd.server.control import request
from tests.brokerd_process import BrokerProcess, log_tail, wait_for_port

QUEUE = "soak"
HEAD = struct.Struct("!QI")  # sequence number, body size
#: random bytes the bodies are cut from (a body is regenerated from its seq alone)
POOL = random.Random(20).randbytes(1 << 17)


def body_size(seq: int, low: int, high: int) -> int:
    """Log-uniform between ``low`` and ``high``: mostly small, some large."""
    r = random.Random(seq * 2654435761 % (1 << 32)).random()
    return int(math.exp(math.log(low) + r * (math.log(high) - math.log(low))))


def make_body(seq: int, size: int) -> bytes:
    start = (seq * 7919) % (len(POOL) - size)
    return HEAD.pack(seq, size) + POOL[start : start + size - HEAD.size]


@dataclass
class Tally:
    published: int = 0
    republished: int = 0
    confirmed: set[int] = field(default_factory=set)
    #: confirmed and not yet delivered intact (the soak ends when it is empty)
    waiting: set[int] = field(default_factory=set)
    nacked: int = 0
    delivered: dict[int, int] = field(default_factory=dict)
    redelivered_flags: int = 0
    corrupt: list[str] = field(default_factory=list)
    kills: list[float] = field(default_factory=list)
    restarts_s: list[float] = field(default_factory=list)
    #: compaction in broker lives that ended, and the latest reading of this one
    compaction_done: dict[str, int] = field(default_factory=dict)
    compaction_now: dict[str, int] = field(default_factory=dict)

    def compaction(self) -> dict[str, int]:
        keys = set(self.compaction_done) | set(self.compaction_now)
        return {k: self.compaction_done.get(k, 0) + self.compaction_now.get(k, 0) for k in keys}


@dataclass
class Soak:
    proc: BrokerProcess
    messages: int
    low: int
    high: int
    window: int
    kills: int
    rng: random.Random
    tally: Tally = field(default_factory=Tally)
    #: seqs published and not yet confirmed (published again after a kill)
    unconfirmed: set[int] = field(default_factory=set)
    next_seq: int = 0
    up: asyncio.Event = field(default_factory=asyncio.Event)
    done_publishing: bool = False
    consume_rate: float | None = None  # None: unthrottled; 0: paused

    async def connect(self) -> aio_pika.abc.AbstractRobustConnection | None:
        await self.up.wait()
        try:
            return await aio_pika.connect(self.proc.url, timeout=10)  # type: ignore[return-value]
        except (TimeoutError, OSError, aio_pika.exceptions.AMQPError):
            await asyncio.sleep(0.2)
            return None

    # -- the publisher -------------------------------------------------------------

    async def publisher(self) -> None:
        while len(self.tally.confirmed) < self.messages:
            connection = await self.connect()
            if connection is None:
                continue
            try:
                channel = await connection.channel(publisher_confirms=True)
                await channel.declare_queue(QUEUE, durable=True)
                while len(self.tally.confirmed) < self.messages:
                    await self._publish_window(channel)
            except (TimeoutError, aio_pika.exceptions.AMQPError, OSError, RuntimeError):
                await asyncio.sleep(0.1)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 5)
        self.done_publishing = True
        print(f"published and confirmed all {self.messages}", file=sys.stderr, flush=True)

    async def _publish_window(self, channel: aio_pika.abc.AbstractChannel) -> None:
        """One window of publishes awaited together: what was unconfirmed first."""
        batch = sorted(self.unconfirmed)[: self.window]
        again = len(batch)
        while len(batch) < self.window and self.next_seq < self.messages:
            batch.append(self.next_seq)
            self.unconfirmed.add(self.next_seq)
            self.next_seq += 1
        if not batch:
            await asyncio.sleep(0.05)
            return
        exchange = channel.default_exchange

        async def one(seq: int) -> None:
            body = make_body(seq, body_size(seq, self.low, self.high))
            message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            try:
                await exchange.publish(message, QUEUE, timeout=30)
            except aio_pika.exceptions.DeliveryError:
                self.tally.nacked += 1
                return
            self.unconfirmed.discard(seq)
            self.tally.confirmed.add(seq)
            if seq not in self.tally.delivered:  # (a copy may arrive before its confirm)
                self.tally.waiting.add(seq)

        self.tally.published += len(batch)
        self.tally.republished += again
        # a publish on a connection that died may wait for ever: the window has a deadline
        results = await asyncio.wait_for(
            asyncio.gather(*(one(s) for s in batch), return_exceptions=True), 15
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    # -- the consumer --------------------------------------------------------------

    def finished(self) -> bool:
        return self.done_publishing and not self.tally.waiting

    async def consumer(self) -> None:
        while not self.finished():
            connection = await self.connect()
            if connection is None:
                continue
            try:
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=500)
                queue = await channel.declare_queue(QUEUE, durable=True)
                async with queue.iterator() as messages:
                    while not self.finished():
                        # an iterator on a connection that died may wait forever
                        try:
                            message = await asyncio.wait_for(messages.__anext__(), 2)
                        except TimeoutError:
                            if connection.is_closed or not self.up.is_set():
                                break
                            continue
                        await self._take(message)
            except StopAsyncIteration:  # the iterator was closed with its channel
                await asyncio.sleep(0.1)
            except (TimeoutError, aio_pika.exceptions.AMQPError, OSError, RuntimeError):
                await asyncio.sleep(0.1)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 5)

    async def _take(self, message: AbstractIncomingMessage) -> None:
        body = message.body
        tally = self.tally
        if len(body) < HEAD.size:
            tally.corrupt.append(f"a body of {len(body)} bytes")
        else:
            seq, size = HEAD.unpack_from(body)
            if size != len(body) or seq >= self.messages or body != make_body(seq, size):
                zeros = body.count(0) == len(body)
                tally.corrupt.append(
                    f"seq {seq} size {size} len {len(body)}{' all zeros' if zeros else ''}"
                )
            else:
                tally.delivered[seq] = tally.delivered.get(seq, 0) + 1
                tally.waiting.discard(seq)
        if message.redelivered:
            tally.redelivered_flags += 1
        await message.ack()
        while self.consume_rate == 0 and not self.done_publishing:
            await asyncio.sleep(0.05)
        if self.consume_rate:
            await asyncio.sleep(1 / self.consume_rate)

    # -- the rate changer, the compaction reader and the killer --------------------

    async def compaction_reader(self) -> None:
        """Read the broker's compaction counters (``ctl status``) every second, so the
        result says how much compaction ran under the consumer."""
        while True:
            await asyncio.sleep(1.0)
            if not self.up.is_set():
                continue
            try:
                reply = await asyncio.to_thread(request, self.proc.data_dir, "status", [], 2.0)
            except OSError:
                continue
            store = reply.get("result", {}).get("store", {}) if reply.get("ok") else {}
            if self.up.is_set() and store:
                self.tally.compaction_now = {
                    k: int(store.get(k, 0)) for k in ("segments_freed", "records_copied")
                }

    async def pacer(self) -> None:
        """Change the consumer's rate every few seconds; after publishing, unthrottled."""
        while not self.done_publishing:
            self.consume_rate = self.rng.choice([None, None, 0, 200, 1000, 3000])
            await asyncio.sleep(self.rng.uniform(2, 6))
        self.consume_rate = None

    async def killer(self, duration_hint: float) -> None:
        """Kill -9 the broker at random moments while there is traffic."""
        for _ in range(self.kills):
            await asyncio.sleep(self.rng.uniform(0.3, 1.0) * duration_hint / self.kills)
            if self.finished():
                return
            self.up.clear()
            assert self.proc.proc is not None
            for key, value in self.tally.compaction_now.items():
                self.tally.compaction_done[key] = self.tally.compaction_done.get(key, 0) + value
            self.tally.compaction_now = {}
            self.proc.proc.send_signal(signal.SIGKILL)
            self.proc.proc.wait(10)
            self.tally.kills.append(time.monotonic())
            started = time.monotonic()
            await asyncio.to_thread(self._restart)
            self.tally.restarts_s.append(round(time.monotonic() - started, 2))
            self.up.set()

    def _restart(self) -> None:
        self.proc.proc = None
        try:
            self.proc.start()
        except TimeoutError:  # a deep queue's recovery may take longer than the default
            wait_for_port(self.proc.port, 300, self.proc.proc, self.proc.log_path)


async def soak(args: argparse.Namespace, work: Path) -> dict[str, object]:
    config = work / "brokerd.toml"
    config.write_text(
        f'[store]\nqueue_memory_limit = "{args.memory_limit}"\n'
        f'segment_size = "{args.segment_size}"\ncompact_interval = {args.compact_interval}\n'
    )
    proc = BrokerProcess(work / "data", extra_args=["--config", str(config)])
    proc.start()
    rng = random.Random(args.seed)
    run = Soak(proc, args.messages, args.low, args.high, args.window, args.kills, rng)
    run.up.set()
    started = time.monotonic()
    try:
        tasks = [
            asyncio.create_task(run.publisher()),
            asyncio.create_task(run.consumer()),
            asyncio.create_task(run.pacer()),
            asyncio.create_task(run.killer(args.kill_window)),
            asyncio.create_task(run.compaction_reader()),
        ]
        deadline = started + args.timeout
        last_report = started
        while not run.finished() and time.monotonic() < deadline:
            if time.monotonic() - last_report >= 10:
                last_report = time.monotonic()
                if args.verbose:
                    for task in tasks:
                        task.print_stack(limit=3, file=sys.stderr)
                print(
                    f"{last_report - started:7.1f}s confirmed={len(run.tally.confirmed)} "
                    f"delivered={len(run.tally.delivered)} kills={len(run.tally.kills)} "
                    f"corrupt={len(run.tally.corrupt)} rate={run.consume_rate}",
                    file=sys.stderr,
                    flush=True,
                )
            if proc.proc is not None and proc.proc.poll() is not None and run.up.is_set():
                raise RuntimeError(f"brokerd exited by itself:\n{log_tail(proc.log_path)}")
            await asyncio.sleep(0.5)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        log = proc.log_text()
        proc.stop()
    tally = run.tally
    lost = sorted(set(tally.confirmed) - set(tally.delivered))
    duplicates = sum(n - 1 for n in tally.delivered.values() if n > 1)
    return {
        "seed": args.seed,
        "messages": args.messages,
        "sizes": [args.low, args.high],
        "seconds": round(time.monotonic() - started, 1),
        "published": tally.published,
        "published_again": tally.republished,
        "confirmed": len(tally.confirmed),
        "nacked": tally.nacked,
        "delivered_distinct": len(tally.delivered),
        "deliveries": sum(tally.delivered.values()),
        "duplicates": duplicates,
        "redelivered_flags": tally.redelivered_flags,
        "kills": len(tally.kills),
        "compaction": tally.compaction(),
        "restart_seconds": tally.restarts_s,
        "lost": len(lost),
        "lost_first": lost[:10],
        "corrupt": len(tally.corrupt),
        "corrupt_first": tally.corrupt[:10],
        "corrupt_log_lines": sum(1 for line in log.splitlines() if "corrupt on disk" in line),
        "finished": run.finished(),
        "config": {
            "queue_memory_limit": args.memory_limit,
            "segment_size": args.segment_size,
            "compact_interval": args.compact_interval,
            "window": args.window,
        },
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.store_soak", description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--low", type=int, default=250, help="smallest body (bytes)")
    parser.add_argument("--high", type=int, default=64 * 1024, help="largest body (bytes)")
    parser.add_argument("--window", type=int, default=500, help="publishes awaited together")
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument(
        "--kill-window", type=float, default=120.0, help="seconds over which kills are spread"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--memory-limit", default="16MiB")
    parser.add_argument("--segment-size", default="4MiB")
    parser.add_argument("--compact-interval", type=float, default=0.5)
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--verbose", action="store_true", help="print the tasks' stacks")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="store-soak-") as work:
        result = asyncio.run(soak(args, Path(work)))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    bad = result["lost"] or result["corrupt"] or not result["finished"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
