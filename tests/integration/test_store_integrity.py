"""Journal compaction under a real brokerd must never change a message (issue 20).

Compaction (``DiskStore.compact``) copies a sparse segment's live records to the
head of the journal. Before the fix, a paged-out message moved that way was read
back from its new place before the committer had written it, and was delivered as
zeros of the right length. These tests make compaction run every 0.1 s on 64 KiB
segments of a deep durable queue that pages to disk, and check every delivered body
byte for byte; the last one also kills the broker (SIGKILL) while compaction runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection
from pika.exceptions import AMQPError

from brokerd.store.disk import queue_key
from tests.brokerd_process import BrokerProcess, log_tail

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

PERSISTENT = pika.BasicProperties(delivery_mode=2)
BODY_SIZE = 1024
#: messages per queue drained at each rate: ~165 segments of 61 messages, all but the
#: first ~250 messages paged out. Compaction moves records at most ~2.5 times a second
#: (a pass every 0.1 s finds the segment being emptied sparse about one time in four),
#: so the depth sets how often the pre-fix store was caught: with 10,000 every rate
#: failed in every run tried (a dozen or so zero-filled bodies, or a 541 short read)
DRAIN_DEPTH = 10_000
#: messages in the queue the kill test consumes over ``KILLS`` + 1 broker lives
KILL_DEPTH = 5_000
KILLS = 5
#: compaction every 0.1 s on the smallest segments: a consumer crosses a sparse
#: segment many times per second, so moved records are read back while fresh
STORE_CONFIG = """\
[store]
queue_memory_limit = "256KiB"
segment_size = "64KiB"
compact_interval = 0.1
"""
#: what the fixed store logs when a record fails its check on the way out
CORRUPT_LINE = "is corrupt on disk"


def expected_body(seq: int) -> bytes:
    """Message ``seq``'s body: its number, then bytes derived from it, so any
    corruption (zeros, another message's bytes, a torn tail) shows."""
    head = seq.to_bytes(8, "big")
    return head + hashlib.shake_256(head).digest(BODY_SIZE - len(head))


def describe_body(body: bytes) -> str:
    """What a wrong body looks like, for a failure message."""
    if not body.strip(b"\0"):
        return f"zero-filled ({len(body)} bytes)"
    seq = int.from_bytes(body[:8], "big")
    if len(body) == BODY_SIZE and body == expected_body(seq):
        return f"message {seq}'s body"
    return f"{len(body)} bytes, {body.count(0)} zeros, starting {body[:16].hex()}"


def start_broker(tmp_path: Path) -> BrokerProcess:
    config = tmp_path / "brokerd.toml"
    config.write_text(STORE_CONFIG)
    return BrokerProcess(tmp_path / "data", extra_args=["--config", str(config)]).start()


def connect(proc: BrokerProcess) -> BlockingConnection:
    return BlockingConnection(pika.ConnectionParameters("127.0.0.1", proc.port))


def publish(proc: BrokerProcess, exchange: str, queues: list[str], count: int) -> None:
    """``count`` persistent messages, each confirmed (a nack or an unroutable return
    raises), to durable queues bound to a fanout exchange: every queue gets the same
    deep backlog for the price of one publish loop."""
    with connect(proc) as conn:
        ch = conn.channel()
        ch.exchange_declare(exchange, "fanout", durable=True)
        for queue in queues:
            ch.queue_declare(queue, durable=True)
            ch.queue_bind(queue, exchange)
        ch.confirm_delivery()
        for seq in range(count):
            ch.basic_publish(exchange, "", expected_body(seq), PERSISTENT, mandatory=True)
        for queue in queues:
            assert ch.queue_declare(queue, passive=True).method.message_count == count


# -- a clean drain at several rates ----------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """How the consumer drains: its prefetch, and a pause every ``every`` messages.

    The prefetch stays below the ~15 live records a sparse segment keeps (a 64 KiB
    segment holds 61), so compaction moves messages not yet delivered: those are the
    ones read back from disk after the move. (With a larger prefetch every live record
    of a sparse segment is already delivered and in memory, and nothing is read back
    from a moved record; a consumer that outruns compaction's 8 segments a pass never
    meets a sparse segment at all.)"""

    prefetch: int
    every: int = 0
    pause: float = 0.0


RATES = {
    "flat-out-prefetch-1": Rate(prefetch=1),
    "paced-prefetch-4": Rate(prefetch=4, every=4, pause=0.001),
    "bursts-prefetch-2": Rate(prefetch=2, every=10, pause=0.002),
}


@pytest.fixture(scope="module")
def deep_queues(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One brokerd holding one deep queue per rate (the same confirmed messages in each:
    one publish loop fills them all)."""
    proc = start_broker(tmp_path_factory.mktemp("integrity"))
    try:
        publish(proc, "deep.fanout", [f"deep.{name}" for name in RATES], DRAIN_DEPTH)
        yield proc
    finally:
        code = proc.stop()
        if code not in (0, None):
            print(f"brokerd exited with {code}; its log ends:\n{log_tail(proc.log_path)}")


@dataclass
class Drain:
    """What one consumer saw, message by message, against what it should have seen."""

    count: int = 0
    zero_filled: list[int] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    redelivered: list[int] = field(default_factory=list)

    def problems(self, expected: int) -> list[str]:
        out = []
        if self.zero_filled:
            out.append(
                f"{len(self.zero_filled)} zero-filled bodies (positions {self.zero_filled[:10]})"
            )
        if self.wrong:
            out.append(f"{len(self.wrong)} other problems: {self.wrong[:5]}")
        if self.redelivered:
            out.append(f"{len(self.redelivered)} flagged redelivered: {self.redelivered[:5]}")
        if self.count != expected:
            out.append(f"{self.count} of {expected} messages delivered")
        return out


def drain(proc: BrokerProcess, queue: str, count: int, rate: Rate) -> Drain:
    """Consume ``count`` messages with manual acks at ``rate``; the i-th delivery must
    be message i, intact and not redelivered. Stops early after 3 s without a delivery
    (a message the broker dropped would otherwise hang the drain)."""
    seen = Drain()

    def on_message(ch: BlockingChannel, method: object, _props: object, body: bytes) -> None:
        position = seen.count
        seen.count += 1
        if body != expected_body(position):
            if not body.strip(b"\0"):
                seen.zero_filled.append(position)
            else:
                seen.wrong.append(f"#{position}: {describe_body(body)}")
        if method.redelivered:  # type: ignore[attr-defined]
            seen.redelivered.append(position)
        ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]
        if rate.every and seen.count % rate.every == 0:
            time.sleep(rate.pause)

    conn = connect(proc)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=rate.prefetch)
        ch.basic_consume(queue, on_message)
        last, progress = time.monotonic(), 0
        while seen.count < count and time.monotonic() - last < 3.0:
            conn.process_data_events(time_limit=0.05)
            if seen.count != progress:
                last, progress = time.monotonic(), seen.count
        ch.cancel()
        left = ch.queue_declare(queue, passive=True).method.message_count
        if left:
            seen.wrong.append(f"{left} messages still ready after the drain")
    except AMQPError as exc:  # the old store's short read closed the connection (541)
        seen.wrong.append(f"the broker closed the connection: {exc!r}")
    finally:
        if conn.is_open:
            conn.close()
    return seen


@pytest.mark.parametrize("name", list(RATES))
def test_a_deep_queue_drains_intact_while_compaction_runs(
    deep_queues: BrokerProcess, name: str
) -> None:
    """Every confirmed persistent message of a queue paged out to 64 KiB segments
    comes back once, in order, byte for byte and not redelivered, while compaction
    copies the live records of the segments the consumer is emptying; and the store
    finds nothing corrupt on the way (a quarantined message would be missing too)."""
    rate = RATES[name]
    logged = len(deep_queues.log_text())
    started = time.monotonic()
    seen = drain(deep_queues, f"deep.{name}", DRAIN_DEPTH, rate)
    took = time.monotonic() - started
    problems = seen.problems(DRAIN_DEPTH)
    assert not problems, (
        f"drain at {rate} over {took:.1f}s: " + "; ".join(problems) + "\n"
        f"brokerd log ends:\n{log_tail(deep_queues.log_path)}"
    )
    log = deep_queues.log_text()[logged:]
    corrupt = [line for line in log.splitlines() if "corrupt" in line.lower()]
    assert not corrupt, f"the store found corrupt records: {corrupt[:5]}"


# -- kill -9 while compaction runs ------------------------------------------------------------


@dataclass
class Ledger:
    """What the client knows across broker lives. Acks go in delivery order and
    delivery is in publish order, so every message below ``acked`` had its ack sent
    (it may come back: the ack may not have reached the disk) and none above it did
    (it must come back, exactly once)."""

    acked: int = 0
    lives: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Kill:
    """When to kill one broker life: ``delay`` seconds into consuming, then at the next
    segment the journal loses (a compaction pass is running: it deletes a segment and
    then copies the next sparse one's live records), ``jitter`` seconds later."""

    delay: float
    jitter: float


class Killer(threading.Thread):
    """SIGKILLs the broker at the moment a ``Kill`` names, watching its journal
    directory for a deleted segment (for at most 1 s; then it kills anyway)."""

    def __init__(self, proc: BrokerProcess, journal: Path, kill: Kill) -> None:
        super().__init__(daemon=True)
        self.proc, self.journal, self.kill = proc, journal, kill
        self.fired = threading.Event()
        self.cancelled = threading.Event()
        self.saw_removal = False

    def segments(self) -> set[str]:
        try:
            return {name for name in os.listdir(self.journal) if name.endswith(".seg")}
        except FileNotFoundError:
            return set()

    def run(self) -> None:
        if self.cancelled.wait(self.kill.delay):
            return
        before = self.segments()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not self.cancelled.is_set():
            now = self.segments()
            if before - now:
                self.saw_removal = True
                break
            before = now
            time.sleep(0.0005)
        time.sleep(self.kill.jitter)
        self.fire()

    def fire(self) -> None:
        if not self.cancelled.is_set() and not self.fired.is_set():
            self.fired.set()
            assert self.proc.proc is not None
            self.proc.proc.kill()


def consume_one_life(
    proc: BrokerProcess, ledger: Ledger, *, kill: Kill | None, prefetch: int
) -> int:
    """Consume and ack in order until the broker is SIGKILLed as ``kill`` says (or, with
    None, until the queue is empty). Checks each delivery against the ledger: in
    increasing order, the messages from ``acked`` on contiguous, every body intact.
    Returns how many were delivered in this life."""
    delivered: list[int] = []
    previous = -1
    killer: Killer | None = None
    if kill is not None:
        killer = Killer(proc, proc.data_dir / "store" / "queues" / queue_key("/", "deep"), kill)

    def on_message(ch: BlockingChannel, method: object, _props: object, body: bytes) -> None:
        nonlocal previous
        seq = int.from_bytes(body[:8], "big")
        position = f"life {len(ledger.lives)}, delivery {len(delivered)}"
        if seq >= KILL_DEPTH or body != expected_body(seq):
            due = max(ledger.acked, previous + 1)
            ledger.errors.append(f"{position}: {describe_body(body)} where {due} was due")
            seq = due  # so one damaged body is reported once, not as a gap too
        elif seq <= previous:
            ledger.errors.append(f"{position}: message {seq} after {previous} (a duplicate?)")
        elif seq >= ledger.acked and seq != max(ledger.acked, previous + 1):
            due = max(ledger.acked, previous + 1)
            ledger.errors.append(
                f"{position}: message {seq}, but {due} to {seq - 1} were never acked: lost"
            )
        previous = max(previous, seq)
        delivered.append(seq)
        # counted as acked before it is sent: an ack that may have gone may come back
        ledger.acked = max(ledger.acked, seq + 1)
        ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]
        if len(delivered) % 5 == 0:
            time.sleep(0.003)  # ~1,000 a second: the queue stays deep for every kill

    conn = connect(proc)
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=prefetch)
        ch.basic_consume("deep", on_message)
        if killer is not None:
            killer.start()
            while proc.alive():
                conn.process_data_events(time_limit=0.05)
        else:
            last = time.monotonic()
            while time.monotonic() - last < 2.0 and ledger.acked < KILL_DEPTH:
                before = len(delivered)
                conn.process_data_events(time_limit=0.05)
                if len(delivered) != before:
                    last = time.monotonic()
    except (AMQPError, OSError) as exc:
        if killer is None or not killer.fired.is_set():  # the broker dropped us itself
            ledger.errors.append(f"life {len(ledger.lives)}: connection lost: {exc!r}")
            if killer is not None:
                killer.fire()  # the life ends now; the caller reports the error
    finally:
        if killer is not None:
            if proc.alive():  # died on its own: the kill must not hit the next life
                killer.fire()
            killer.cancelled.set()
            killer.join(5)
            ledger.lives.append(
                f"killed {killer.kill.delay:.3f}s in, {killer.kill.jitter * 1000:.1f} ms after "
                + ("a segment was removed" if killer.saw_removal else "(no segment removed)")
                + f", prefetch {prefetch}: {len(delivered)} delivered"
            )
        else:
            ledger.lives.append(f"drained: {len(delivered)} delivered")
        if conn.is_open:
            with contextlib.suppress(AMQPError, OSError):
                conn.close()
    return len(delivered)


def test_kill_9_during_compaction_loses_and_damages_nothing(tmp_path: Path) -> None:
    """SIGKILL while a consumer empties 64 KiB segments and compaction (every 0.1 s)
    copies their live records, at a random moment just after a pass deleted a segment:
    after each restart every confirmed message not acked is there exactly once, in
    order and intact (an acked one may come back: its ack may not have been on disk).
    Seeded: the seed is printed, and ROOKERY_KILL_SEED replays the schedule."""
    seed = int(os.environ.get("ROOKERY_KILL_SEED") or random.randrange(1 << 32))
    print(f"kill seed {seed} (ROOKERY_KILL_SEED={seed} replays it)")
    rng = random.Random(seed)
    proc = start_broker(tmp_path)
    ledger = Ledger()
    try:
        publish(proc, "deep.fanout", ["deep"], KILL_DEPTH)
        for _life in range(KILLS):
            kill = Kill(delay=rng.uniform(0.1, 0.5), jitter=rng.uniform(0.0, 0.0015))
            consume_one_life(proc, ledger, kill=kill, prefetch=rng.choice([1, 8, 50]))
            assert proc.proc is not None
            code = proc.proc.wait(10)
            assert code == -9, f"brokerd exited with {code}, not by the kill\n" + _report(
                seed, ledger, proc
            )
            assert not ledger.errors, _report(seed, ledger, proc)
            proc.start()
        consume_one_life(proc, ledger, kill=None, prefetch=50)
        assert not ledger.errors, _report(seed, ledger, proc)
        assert ledger.acked == KILL_DEPTH, (
            f"messages {ledger.acked} and on never came back\n" + _report(seed, ledger, proc)
        )
        with connect(proc) as conn:
            left = conn.channel().queue_declare("deep", passive=True).method.message_count
        assert left == 0, f"{left} messages left after the drain\n" + _report(seed, ledger, proc)
        damaged = [line for line in proc.log_text().splitlines() if CORRUPT_LINE in line]
        assert not damaged, f"records found corrupt: {damaged[:5]}\n" + _report(seed, ledger, proc)
    finally:
        print("lives:", *ledger.lives, sep="\n  ")
        code = proc.stop()
        if code not in (0, None, -9):
            print(f"brokerd exited with {code}; its log ends:\n{log_tail(proc.log_path)}")


def _report(seed: int, ledger: Ledger, proc: BrokerProcess) -> str:
    return (
        f"seed {seed}; lives: {ledger.lives}; acked below {ledger.acked}\n"
        + "\n".join(ledger.errors[:10])
        + f"\nbrokerd log ends:\n{log_tail(proc.log_path)}"
    )
