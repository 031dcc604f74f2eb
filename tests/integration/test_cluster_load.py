"""The cluster under load (issue 21): a publish flood loses nothing and unseats nobody.

Real brokerd primaries on loopback (``brokerd.bench.cluster``), real client
processes (the flood benchmark's workers, scaled to fit the suite). Each test
asserts on what was delivered and on the failure lines of every broker log;
a failure prints the first occurrence of each line, with its context.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from brokerd.bench.flood.plan import FloodOptions
from brokerd.bench.flood.run import run_flood
from brokerd.bench.flood.targets import Target, start_cluster
from brokerd.server.control import request

# serial: its timing is measured against the heartbeat, so it runs alone
pytestmark = [pytest.mark.integration, pytest.mark.serial]

#: the lines that must never appear under load without a fault
SIGNATURES = (
    "root_released",
    "lease_lost",
    "no_quorum",
    "replica_dropped",
    "session_voided",
    "forwards_failed",
    "close_320",
    "root_moved",
    "root_changed",
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Target]:
    target = start_cluster(tmp_path / "cluster")
    try:
        yield target
    finally:
        target.stop()


def _failures(result: dict[str, Any]) -> dict[str, int]:
    found: dict[str, int] = {}
    for entry in result["logs"]:
        for key, count in entry["signatures"].items():
            if key in SIGNATURES and count["during"] + count["after"]:
                found[f"{entry['server']} {key}"] = count["during"] + count["after"]
    return found


def _explain(result: dict[str, Any]) -> str:
    lines = [
        f"delivered {result['delivered']} of {result['published']}, lost {result['lost']}",
        f"failures: {_failures(result)}",
    ]
    for entry in result["logs"]:
        for key, count in (entry.get("signatures") or {}).items():
            first = count.get("first")
            if key in SIGNATURES and first:
                lines.append(f"--- {entry['server']} {key}:")
                lines += first.get("lines", [])
    return "\n".join(lines)


def _flood(cluster: Target, **kwargs: Any) -> dict[str, Any]:
    """The flood into durable queues: replicated, mastered on the root, the path these
    tests are about (transient ones would be classic, each on its own server)."""
    opts = FloodOptions(
        messages=kwargs.pop("messages", 12_000),
        quiet=3.0,
        timeout=90.0,
        after=2.0,
        durable_queues=True,
        **kwargs,
    )
    return run_flood(cluster, opts)


def test_a_publish_flood_is_delivered_whole_without_a_role_change(cluster: Target) -> None:
    result = _flood(cluster)
    assert result["lost"] == 0 and result["delivered"] == result["published"], _explain(result)
    assert _failures(result) == {}, _explain(result)


def test_a_flood_while_a_replica_is_paused_slows_down_and_loses_nothing(
    cluster: Target,
) -> None:
    replica = cluster.nodes[2]  # not the root (index 0 is the most senior)
    assert replica.proc is not None
    pid = replica.proc.pid

    def pause() -> None:
        time.sleep(1.0)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(1.5)  # under the 3 s timeout: slow, not dead
        os.kill(pid, signal.SIGCONT)

    pauser = threading.Thread(target=pause)
    pauser.start()
    try:
        result = _flood(cluster)
    finally:
        pauser.join()
        os.kill(pid, signal.SIGCONT)
    assert result["lost"] == 0 and result["delivered"] == result["published"], _explain(result)
    assert _failures(result) == {}, _explain(result)


def test_a_paused_non_root_primary_does_not_stall_confirms(cluster: Target) -> None:
    """Confirms need the master and a majority: the root and the other primary."""
    root, _other, paused = cluster.nodes
    connection = pika.BlockingConnection(pika.URLParameters(root.url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("confirmed", durable=True)
        assert paused.proc is not None
        latencies: list[float] = []
        stopped_at = resumed_at = 0.0
        start = time.monotonic()
        while time.monotonic() - start < 4.0:
            elapsed = time.monotonic() - start
            if not stopped_at and elapsed > 1.0:
                os.kill(paused.proc.pid, signal.SIGSTOP)
                stopped_at = time.monotonic()
            if stopped_at and not resumed_at and time.monotonic() - stopped_at > 2.0:
                os.kill(paused.proc.pid, signal.SIGCONT)
                resumed_at = time.monotonic()
            t0 = time.monotonic()
            channel.basic_publish("", "confirmed", b"x" * 250)  # waits for the confirm
            latencies.append(time.monotonic() - t0)
        assert resumed_at, "the pause did not end within the run"
    finally:
        if paused.proc is not None:
            os.kill(paused.proc.pid, signal.SIGCONT)
        connection.close()
    worst = max(latencies)
    print(f"{len(latencies)} confirms, worst {worst * 1000:.0f} ms across a 2 s pause")
    assert worst < 1.0, f"a confirm waited {worst:.2f}s: the paused replica stalled it"
    log = Path(cluster.logs[0] or "").read_text()
    assert "left the set" not in log and "root released" not in log, log[-3000:]


def test_sigterm_ends_each_server_within_two_seconds_when_nothing_is_in_flight(
    cluster: Target,
) -> None:
    """A non-root, then the root (it hands over first), then the last one (no
    successor possible: it does not wait for one)."""
    clients = [pika.BlockingConnection(pika.URLParameters(node.url)) for node in cluster.nodes]
    try:
        for order in (2, 0, 1):
            node = cluster.nodes[order]
            assert node.proc is not None
            start = time.monotonic()
            node.proc.send_signal(signal.SIGTERM)
            code = node.proc.wait(10)
            took = time.monotonic() - start
            assert code == 0 and took < 2.0, f"server {order} took {took:.2f}s (exit {code})"
    finally:
        for client in clients:
            if client.is_open:
                with contextlib.suppress(Exception):  # closed by the server's shutdown
                    client.close()


def _dump_lines(node: Any, product: str) -> list[str]:
    """The dump's connection lines of the clients that call themselves ``product``."""
    reply = request(node.data_dir, "dump", timeout=5)
    return [line for line in reply["result"]["dump"].splitlines() if f"client={product} " in line]


def _stop_for(pid: int, seconds: float) -> None:
    """SIGSTOP ``pid`` for ``seconds``: a server that is slow, not dead."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_hot_queue_paces_its_own_publisher_not_a_light_one_to_another_queue(
    cluster: Target,
) -> None:
    """Pacing by share: on a server that is not the root, one client floods a queue
    and another publishes a trickle with confirms to another queue. Flow control
    pauses the flood's connection, never the trickle's, and both arrive whole."""
    node = cluster.nodes[1]

    def connect(product: str) -> pika.BlockingConnection:
        params = pika.URLParameters(node.url)
        params.client_properties = {"product": product}
        return pika.BlockingConnection(params)

    with pika.BlockingConnection(pika.URLParameters(cluster.nodes[0].url)) as owner:
        declaring = owner.channel()  # owned by the root (client-local): forwarded there
        declaring.queue_declare("hot", durable=True)
        declaring.queue_declare("cool", durable=True)
    hot, cool = connect("hot"), connect("cool")
    flood, trickle = hot.channel(), cool.channel()
    trickle.confirm_delivery()
    stop = threading.Event()
    confirmed: list[float] = []

    def publish_trickle() -> None:
        while not stop.is_set():
            began = time.monotonic()
            trickle.basic_publish("", "cool", b"c" * 100)
            confirmed.append(time.monotonic() - began)
            time.sleep(0.02)

    thread = threading.Thread(target=publish_trickle)
    thread.start()
    body = b"h" * 16_384
    sent = 0
    # the owner (the root) is made slow for a moment, well under the 3 s timeout: on a
    # fast machine the link kept up with 20,000 messages and nothing fell behind
    owner_pid = cluster.nodes[0].proc.pid  # type: ignore[union-attr]
    slowed = threading.Timer(0.3, _stop_for, args=(owner_pid, 1.2))
    slowed.start()
    try:
        # until its connection is paused
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sent < 20_000:
            for _ in range(250):
                flood.basic_publish("", "hot", body)
            sent += 250
            if any("flow_pauses=" in line for line in _dump_lines(node, "hot")):
                break
        time.sleep(0.5)  # the trickle goes on while the flood's backlog drains
    finally:
        slowed.join()
        os.kill(owner_pid, signal.SIGCONT)
        stop.set()
        thread.join(10)
    hot_lines, cool_lines = _dump_lines(node, "hot"), _dump_lines(node, "cool")
    hot.close()
    assert any("flow_pauses=" in line for line in hot_lines), (sent, hot_lines)
    assert cool_lines and not any("flow" in line for line in cool_lines), cool_lines
    deadline = time.monotonic() + 30 + sent / 1000
    while trickle.queue_declare("hot", passive=True).method.message_count < sent:
        assert time.monotonic() < deadline, "the flood did not arrive whole"
        time.sleep(0.1)
    assert trickle.queue_declare("cool", passive=True).method.message_count == len(confirmed)
    print(
        f"flood of {sent} x 16 KiB: the flood's connection paused, the trickle's not; "
        f"trickle confirms {len(confirmed)}, worst {max(confirmed) * 1000:.0f} ms"
    )
    cool.close()


def _confirm_latencies(channel: Any, seconds: float, stop: Any = None) -> list[float]:
    latencies: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and not (stop and stop()):
        t0 = time.monotonic()
        channel.basic_publish("", "live", b"y" * 250)  # waits for the confirm
        latencies.append(time.monotonic() - t0)
    return latencies


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def test_a_restarted_primary_catches_up_a_deep_queue_without_stalling_confirms(
    cluster: Target,
) -> None:
    """Seed 001's live updates: the snapshot goes while the live stream and its
    confirms go on (the quorum is the root and the other primary)."""
    root, _other, restarted = cluster.nodes
    deep = pika.BlockingConnection(pika.URLParameters(root.url))
    channel = deep.channel()
    channel.queue_declare("deep", durable=True)
    body = b"d" * 250
    for _ in range(60_000):
        channel.basic_publish("", "deep", body)
    deadline = time.monotonic() + 30
    while channel.queue_declare("deep", passive=True).method.message_count < 60_000:
        assert time.monotonic() < deadline, "the deep queue did not fill"
        time.sleep(0.1)
    deep.close()
    live = pika.BlockingConnection(pika.URLParameters(root.url))
    try:
        confirmed = live.channel()
        confirmed.confirm_delivery()
        confirmed.queue_declare("live", durable=True)
        before = _confirm_latencies(confirmed, 2.0)
        root_log = Path(cluster.logs[0] or "")
        offset = root_log.stat().st_size  # filling the deep queue may pace; catch-up not
        restarted.kill()
        restarted.start()
        began = time.monotonic()

        def synced() -> bool:
            view = restarted.status() or {}
            return bool(view.get("ready") and (view.get("copies") or {}).get("complete"))

        # polled beside the publisher, not between its publishes: a busy server's
        # control socket may answer slowly, which would thin out the sample
        done = threading.Event()
        caught_up: list[float] = []

        def watch() -> None:
            deadline = began + 30.0
            while time.monotonic() < deadline and not synced():
                time.sleep(0.02)
            caught_up.append(time.monotonic() - began)
            done.set()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        during = _confirm_latencies(confirmed, 31.0, stop=done.is_set)
        watcher.join()
        catch_up = caught_up[0]
        assert synced(), "the restarted primary did not catch up within 30 s"
    finally:
        live.close()
    p95_before, p95_during = _percentile(before, 0.95), _percentile(during, 0.95)
    p99_before, p99_during = _percentile(before, 0.99), _percentile(during, 0.99)
    print(
        f"catch-up of 60,000 messages: {catch_up:.2f}s; confirm p95/p99 before "
        f"{p95_before * 1000:.1f}/{p99_before * 1000:.1f} ms, during {p95_during * 1000:.1f}/"
        f"{p99_during * 1000:.1f} ms ({len(during)} confirms)"
    )
    # A snapshot that held the loop would delay most confirms while it runs, by as
    # long as it holds it (seconds for 60,000 messages). Another test process sharing
    # the two cores delays some here and there: enough to move the p99 of a short
    # sample by 10 ms or more, and the p95 by 10 ms once (12.7 against 2.6 ms, in CI).
    # So the median, 2x with a floor for scheduling noise, and the p95 within 50 ms.
    p50_before, p50_during = _percentile(before, 0.5), _percentile(during, 0.5)
    assert p50_during <= max(2 * p50_before, p50_before + 0.01), (p50_before, p50_during)
    assert p95_during <= p95_before + 0.05, (p95_before, p95_during)
    with root_log.open() as fh:
        fh.seek(offset)
        log = fh.read()
    assert "flow on cause=replication" not in log, log[-3000:]  # publishers never paced
