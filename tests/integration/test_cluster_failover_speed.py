"""How fast the cluster gets past a fault, with real processes (issue 13).

- kill -9 of the root: the survivors see its connections close and its port
  refuse, so they elect the next root in a few round trips. The heartbeat
  timeout is set to 10 s here, and a client must publish with confirms again
  within 5 s: the failover cannot have waited for the timeout.
- SIGSTOP of the root for less than the timeout: the followers never notice,
  no second root appears, a publish made meanwhile is confirmed after SIGCONT.
- a link cut between one follower and the root: that follower sends its
  clients away (320) and refuses new ones; once healed it serves again.
- SIGTERM of the root: it hands root over before it stops listening, so the
  others have a root at once, not after the timeout.

Bounds are generous (a loaded two-core CI machine); the benchmark
``python -m brokerd.bench.failover`` measures the real figures.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pika.adapters.blocking_connection import BlockingConnection
from pika.exceptions import AMQPConnectionError, AMQPError, ConnectionClosedByBroker

from tests.cluster_harness import Cluster
from tests.conftest import uid
from tests.support.clients import connect as client
from tests.support.sampler import Sampler

# serial: its timing is measured against the heartbeat, so it runs alone
pytestmark = [
    pytest.mark.integration,
    pytest.mark.serial,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

LONG_TIMEOUT = 10.0


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[list[Cluster]]:
    """Clusters a test makes; every process is resumed and stopped at the end."""
    made: list[Cluster] = []
    try:
        yield made
    except BaseException:
        for cluster in made:
            print(cluster.describe())
        raise
    finally:
        for cluster in made:
            cluster.close()


def formed(clusters: list[Cluster], base: Path, **timing: float) -> Cluster:
    cluster = Cluster(base / f"c{len(clusters)}", 3, 0, **timing)  # type: ignore[arg-type]
    clusters.append(cluster)
    cluster.start_all()
    # a server abstains for one timeout after it starts: formation takes that long
    root = cluster.wait_until(cluster.settled_root, timeout=3 * cluster.timeout + 10)
    assert root == cluster.spid(0)
    return cluster


def connect(cluster: Cluster, index: int) -> BlockingConnection:
    return client(cluster.ports[index], blocked_timeout=30)


def publish_confirmed(cluster: Cluster, index: int, queue: str, body: bytes) -> None:
    """One mandatory publish on a new connection, confirmed (raises otherwise)."""
    conn = connect(cluster, index)
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, body, mandatory=True)
    finally:
        if conn.is_open:
            conn.close()


def publish_until_confirmed(
    cluster: Cluster, queue: str, since: float, bound: float, pause: float
) -> tuple[float, list[str]]:
    """Publish ``after`` through server 2 until it is confirmed (no root yet: refused,
    nacked or closed; try again); the seconds since ``since`` and the failures."""
    failures: list[str] = []
    while True:
        try:
            publish_confirmed(cluster, 2, queue, b"after")
            return time.monotonic() - since, failures
        except AMQPError as exc:
            failures.append(repr(exc))
            assert time.monotonic() - since < bound, failures
            time.sleep(pause)


def declare(cluster: Cluster, index: int, queue: str) -> None:
    conn = connect(cluster, index)
    try:
        conn.channel().queue_declare(queue, durable=True)
    finally:
        conn.close()


def test_kill_9_of_the_root_fails_over_long_before_the_heartbeat_timeout(
    clusters: list[Cluster], tmp_path: Path
) -> None:
    cluster = formed(clusters, tmp_path, interval=0.5, timeout=LONG_TIMEOUT, open_timeout=20.0)
    queue = uid("failover")
    declare(cluster, 2, queue)
    publish_confirmed(cluster, 2, queue, b"before")
    # both survivors hold all the root has: the next senior is then the choice
    cluster.wait_until(cluster.quiet_root, timeout=10, what="every copy caught up")

    killed = cluster.kill(0)
    took, failures = publish_until_confirmed(cluster, queue, killed, LONG_TIMEOUT, 0.02)
    print(f"kill -9 to a confirmed publish: {took:.3f}s")

    assert took < LONG_TIMEOUT / 2, f"publishing again took {took:.2f}s: {failures}"
    assert cluster.wait_until(lambda: cluster.agreed_root([1, 2]), timeout=5) == cluster.spid(1)
    for index in (1, 2):
        log = cluster.nodes[index].process.log_text()  # type: ignore[union-attr]
        assert f"peer gone spid={cluster.spid(0)}" in log
    assert b"after" in drain(cluster, 1, queue)  # confirmed: the new root has it
    assert cluster.root_overlaps() == []


def drain(cluster: Cluster, index: int, queue: str) -> list[bytes]:
    conn = connect(cluster, index)
    bodies = []
    try:
        channel = conn.channel()
        while True:
            method, _, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return bodies
            bodies.append(body)
    finally:
        conn.close()


def test_a_sigstop_of_the_root_shorter_than_the_timeout_causes_no_outage(
    clusters: list[Cluster], tmp_path: Path
) -> None:
    cluster = formed(clusters, tmp_path, interval=0.5, timeout=3.0, open_timeout=10.0)
    root = cluster.spid(0)
    queue = uid("paused")
    declare(cluster, 1, queue)
    client = connect(cluster, 1)
    events: list[str] = []
    client.add_on_connection_blocked_callback(lambda *_: events.append("blocked"))
    try:
        channel = client.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"before", mandatory=True)
        with Sampler(cluster, indexes=[1, 2]) as sampler:
            time.sleep(0.2)
            paused = cluster.pause(0)
            # well under timeout - interval/2 (the longest pause the followers cannot see)
            resumer = threading.Timer(1.5, cluster.resume, args=(0,))
            resumer.start()
            # owned by server 1 (declared there): the root is not on its path, and a
            # replica left (server 2) confirms it (issue 23)
            channel.basic_publish("", queue, b"during", mandatory=True)
            confirmed = time.monotonic() - paused
            resumer.join()
            time.sleep(2 * cluster.timeout)  # let any late consequence show
        channel.basic_publish("", queue, b"after", mandatory=True)
    finally:
        if client.is_open:
            client.close()
    print(f"publish during a 1.5 s pause confirmed after {confirmed:.3f}s")
    assert confirmed < 1.0, confirmed
    assert events == [], "the follower's publisher was blocked"
    assert sampler.double_roots == [] and cluster.root_overlaps() == []
    assert sampler.samples
    for sample in sampler.samples:
        for index, view in sample.views.items():
            assert view["root"] == root and view["ready"], (index, view)
    for index in (1, 2):
        log = cluster.nodes[index].process.log_text()  # type: ignore[union-attr]
        changes = [line for line in log.splitlines() if "root changed" in line]
        assert len(changes) == 1, changes  # formation only
    assert cluster.agreed_root() == root


def test_a_follower_cut_from_the_root_sends_its_clients_away_until_healed(
    clusters: list[Cluster], tmp_path: Path
) -> None:
    cluster = formed(clusters, tmp_path)  # interval 0.3 s, timeout 1 s
    root = cluster.spid(0)
    client = connect(cluster, 2)
    cluster.ctl(2, "fault", "cut-link", root)
    cluster.ctl(0, "fault", "cut-link", cluster.spid(2))
    cut = time.monotonic()
    with pytest.raises(ConnectionClosedByBroker) as closed:
        while time.monotonic() - cut < 10:
            client.process_data_events(time_limit=0.05)
    took = time.monotonic() - cut
    print(f"cut to the client's 320: {took:.3f}s")
    assert closed.value.reply_code == 320, closed.value
    assert f"cannot reach root {root}" in closed.value.reply_text
    assert took < 3 * cluster.timeout, took
    with pytest.raises((ConnectionClosedByBroker, AMQPConnectionError)) as refused:
        connect(cluster, 2)
    assert "320" in repr(refused.value) and "another server" in repr(refused.value)
    assert cluster.agreed_root([0, 1]) == root  # the others carry on

    for index in (0, 2):
        cluster.ctl(index, "fault", "heal")
    cluster.wait_until(cluster.agreed_root, timeout=3 * cluster.timeout, what="rejoined")
    queue = uid("rejoined")
    declare(cluster, 2, queue)
    publish_confirmed(cluster, 2, queue, b"back")
    assert cluster.root_overlaps() == []


def test_a_stopping_root_hands_over_before_it_stops_listening(
    clusters: list[Cluster], tmp_path: Path
) -> None:
    cluster = formed(clusters, tmp_path, interval=0.5, timeout=LONG_TIMEOUT, open_timeout=20.0)
    queue = uid("handover")
    declare(cluster, 1, queue)
    cluster.wait_until(cluster.quiet_root, timeout=10, what="every copy caught up")
    on_root = connect(cluster, 0)
    node = cluster.nodes[0]
    assert node.process is not None and node.process.proc is not None
    stopping = time.monotonic()
    node.process.proc.terminate()
    with pytest.raises(ConnectionClosedByBroker) as closed:
        while time.monotonic() - stopping < 10:
            on_root.process_data_events(time_limit=0.05)
    assert closed.value.reply_code == 320
    # its client reconnects elsewhere and finds a root there at once
    publish_confirmed(cluster, 2, queue, b"moved")
    took = time.monotonic() - stopping
    print(f"SIGTERM of the root to a confirmed publish elsewhere: {took:.3f}s")
    assert took < LONG_TIMEOUT / 3, took
    assert node.process.proc.wait(10) == 0
    assert cluster.wait_until(lambda: cluster.agreed_root([1, 2]), timeout=5) == cluster.spid(1)
    log = node.process.log_text()
    assert "handed over" in log, log[-2000:]
    # the successor took root on the release, not because it found the old one gone
    successor = cluster.nodes[1].process.log_text()  # type: ignore[union-attr]
    taken = successor.index(f"root taken spid={cluster.spid(1)}")
    gone = successor.find(f"peer gone spid={cluster.spid(0)}")
    assert gone == -1 or taken < gone
    assert b"moved" in drain(cluster, 1, queue)
    assert cluster.root_overlaps() == []


def test_kill_9_of_the_root_right_after_a_primary_rejoined_fails_over_at_once(
    clusters: list[Cluster], tmp_path: Path
) -> None:
    """The rejoined primary counts towards the majority as soon as it has found the
    root and synced: no start window, no abstention for a timeout (issue 21)."""
    cluster = formed(clusters, tmp_path)
    queue = uid("rejoin")
    declare(cluster, 2, queue)
    cluster.kill(1)
    cluster.start(1)
    cluster.wait_until(
        lambda: (
            (cluster.status(1) or {}).get("ready")
            and (cluster.status(1) or {}).get("copies", {}).get("complete")
        ),
        timeout=20,
        what="the restarted primary ready and in sync",
    )
    killed = cluster.kill(0)
    took, failures = publish_until_confirmed(cluster, queue, killed, 10, 0.01)
    print(f"kill -9 of the root right after a rejoin to a confirmed publish: {took:.3f}s")
    assert took < 1.0, f"failover after a rejoin took {took:.2f}s: {failures[-3:]}"
    assert cluster.wait_until(lambda: cluster.agreed_root([1, 2]), timeout=5)
    assert b"after" in drain(cluster, 2, queue)  # confirmed: the new root has it


def test_a_rolling_restart_followed_literally_costs_at_most_a_failover_per_step(
    clusters: list[Cluster], tmp_path: Path
) -> None:
    """deploy/runbooks/cluster-root.md: stop one primary at a time (SIGTERM), start
    it, wait for ready everywhere, go on; the root last but one. A confirmed
    publisher (reconnecting elsewhere when its server stops, as applications do)
    never waits more than a failover and a reconnection."""
    cluster = formed(clusters, tmp_path)
    queue = uid("rolling")
    declare(cluster, 0, queue)
    gaps: list[float] = []
    stop = threading.Event()
    errors: list[str] = []

    def publish() -> None:
        index = 2
        last = time.monotonic()
        while not stop.is_set():
            try:
                conn = connect(cluster, index)
                channel = conn.channel()
                channel.confirm_delivery()
                while not stop.is_set():
                    channel.basic_publish("", queue, b"r", mandatory=True)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now
                conn.close()
            except AMQPError as exc:  # its server stopped (320), or no root yet
                errors.append(repr(exc))
                index = (index + 1) % 3
                time.sleep(0.01)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        for index in (1, 2, 0):  # the root (0) last, as any order may have it
            time.sleep(0.5)
            steps_before = len(gaps)
            assert cluster.stop(index) == 0
            cluster.start(index)
            cluster.wait_until(lambda: cluster.agreed_root(), timeout=15, what="ready everywhere")
            worst = max(gaps[steps_before:], default=0.0)
            print(f"restart of {index}: worst gap between confirms {worst * 1000:.0f} ms")
            assert worst < 1.0, (index, worst, errors[-3:])
    finally:
        stop.set()
        publisher.join(15)
    assert len(gaps) > 100
