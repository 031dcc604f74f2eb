"""Cluster membership with real processes: formation, failover, partitions, refusals."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from pika.exceptions import AMQPConnectionError, ConnectionClosedByBroker

from tests.brokerd_process import BrokerProcess
from tests.cluster_support import HEARTBEAT, Cluster, cluster_file, roots_with_quorum

pytestmark = pytest.mark.integration
TIMEOUT = HEARTBEAT["timeout"]


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator:
    made: list[Cluster] = []

    def factory(primaries: int = 3, secondaries: int = 0, **kw) -> Cluster:
        cluster = Cluster(tmp_path / f"c{len(made)}", primaries, secondaries, **kw)
        cluster.root.mkdir(parents=True, exist_ok=True)
        made.append(cluster)
        return cluster

    # Cluster writes its file in __init__, so the directory must exist first
    original = Cluster.__init__

    def init(self: Cluster, root: Path, *a, **kw) -> None:
        root.mkdir(parents=True, exist_ok=True)
        original(self, root, *a, **kw)

    Cluster.__init__ = init  # type: ignore[method-assign]
    try:
        yield factory
    finally:
        Cluster.__init__ = original  # type: ignore[method-assign]
        for cluster in made:
            cluster.stop()


class Sampler(threading.Thread):
    """Samples every answering server's view until stopped; records double roots."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.halt = threading.Event()
        self.samples = 0
        self.double_roots: list[list[str]] = []

    def run(self) -> None:
        while not self.halt.is_set():
            roots = roots_with_quorum(self.cluster.sample())
            self.samples += 1
            if len(roots) > 1:
                self.double_roots.append(roots)
            time.sleep(0.05)

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


def test_primaries_and_secondaries_agree_on_the_most_senior_primary(make_cluster) -> None:
    cluster = make_cluster(3, 2)
    for index in range(4):  # the second secondary joins later
        cluster.start(index)
        time.sleep(0.15)
    eldest = cluster.status(0)["spid"]
    assert cluster.wait(cluster.agreed_root) == eldest
    views = cluster.sample()
    assert all(v["checksum"] == views[0]["checksum"] for v in views.values())
    assert not any(v["is_root"] for i, v in views.items() if i >= 3)
    # the late secondary joins without anyone restarting
    late = cluster.start(4)
    assert cluster.wait(cluster.agreed_root) == eldest
    late_spid = cluster.status(4)["spid"]
    for index in range(3):
        peers = {p["spid"]: p for p in cluster.status(index)["peers"]}
        assert peers[late_spid]["active"] and peers[late_spid]["type"] == "secondary"
        assert len([p for p in peers.values() if p["active"]]) == 4
    status = cluster.status(4)
    assert status["type"] == "secondary" and not status["is_root"] and status["ready"]
    assert late.alive()


def test_kill_9_of_the_root_elects_the_next_senior_within_three_timeouts(make_cluster) -> None:
    cluster = make_cluster(3, 1)
    cluster.start_all()
    first = cluster.wait(cluster.agreed_root)
    assert first == cluster.status(0)["spid"]
    second = cluster.status(1)["spid"]
    cluster.servers[0].proc.kill()
    killed = time.monotonic()
    survivors = [1, 2, 3]
    new_root = cluster.wait(
        lambda: (r := cluster.agreed_root(survivors)) not in (None, first) and r, timeout=10
    )
    elapsed = time.monotonic() - killed
    assert new_root == second
    assert elapsed < 3 * TIMEOUT, f"failover took {elapsed:.2f}s"


def test_sigstop_of_the_root_never_gives_two_roots(make_cluster) -> None:
    cluster = make_cluster(3, 0)
    cluster.start_all()
    old = cluster.wait(cluster.agreed_root)
    sampler = Sampler(cluster)
    sampler.start()
    try:
        cluster.servers[0].signal(signal.SIGSTOP)
        cluster.wait(lambda: (r := cluster.agreed_root([1, 2])) not in (None, old) and r)
        time.sleep(2 * TIMEOUT)
        cluster.servers[0].signal(signal.SIGCONT)
        # one root again, and the old root knows it is not root
        new = cluster.wait(cluster.agreed_root)
        assert new != old
        time.sleep(1.0)
    finally:
        cluster.servers[0].signal(signal.SIGCONT)
        sampler.stop()
    assert sampler.samples > 20
    assert sampler.double_roots == []
    assert cluster.agreed_root() == new


def test_partition_two_against_three(make_cluster) -> None:
    cluster = make_cluster(5, 0)
    cluster.start_all(stagger=0.1)
    cluster.wait(cluster.agreed_root)
    spids = {i: cluster.status(i)["spid"] for i in range(5)}
    minority, majority = [0, 1], [2, 3, 4]
    sampler = Sampler(cluster)
    sampler.start()
    try:
        for a in minority:
            for b in majority:
                assert cluster.ctl(a, "fault", "cut-link", spids[b])["ok"]
                assert cluster.ctl(b, "fault", "cut-link", spids[a])["ok"]
        new = cluster.wait(lambda: cluster.agreed_root(majority))
        assert new in {spids[i] for i in majority}
        cluster.wait(lambda: not any(v["ready"] for v in cluster.sample(minority).values()))
        for index in range(5):
            assert cluster.ctl(index, "fault", "heal")["ok"]
        assert cluster.wait(cluster.agreed_root) == new  # healing does not move root
    finally:
        sampler.stop()
    assert sampler.double_roots == []


def test_disable_hands_over_and_enable_does_not_steal(make_cluster) -> None:
    cluster = make_cluster(3, 0)
    cluster.start_all()
    eldest = cluster.wait(cluster.agreed_root)
    assert cluster.ctl(0, "root", "disable")["ok"]
    second = cluster.status(1)["spid"]
    cluster.wait(lambda: cluster.agreed_root() == second)
    assert cluster.status(0)["root_enabled"] is False
    assert cluster.ctl(0, "root", "enable")["ok"]
    time.sleep(3 * HEARTBEAT["interval"] + TIMEOUT)
    assert cluster.agreed_root() == second != eldest
    assert cluster.status(0)["root_enabled"] is True


def test_mismatched_checksum_is_refused_with_alarms_on_both_sides(make_cluster) -> None:
    cluster = make_cluster(2, 0)
    cluster.start(0)
    odd_file = cluster_file(cluster.root / "odd.toml", [*cluster.ports, 1])  # one extra host
    cluster.start(1, file=odd_file)

    def alarms(index: int) -> set[str]:
        return {a["kind"] for a in cluster.status(index)["alarms"]}

    cluster.wait(lambda: "config-mismatch" in alarms(0) and "config-mismatch" in alarms(1))
    assert not any(p["active"] for p in cluster.status(0)["peers"])
    assert "checksum mismatch" in cluster.servers[0].log_text()


def test_wrong_secret_is_refused_with_alarms_on_both_sides(make_cluster) -> None:
    cluster = make_cluster(2, 0)
    cluster.start(0)
    bad = cluster_file(cluster.root / "bad.toml", cluster.ports, secret="not-the-secret")
    cluster.start(1, file=bad)

    def kinds(index: int) -> list[str]:
        return [a["kind"] for a in cluster.status(index)["alarms"]]

    cluster.wait(lambda: any(k.startswith("inbound-auth") for k in kinds(0)))
    cluster.wait(lambda: any(k.startswith("link:") for k in kinds(1)))
    assert not any(p["active"] for p in cluster.status(0)["peers"])


def test_connection_open_waits_for_a_root_then_541_or_admits(make_cluster) -> None:
    # formation takes a start grace plus one abstention window (2 timeouts): wait longer
    cluster = make_cluster(3, 0, heartbeat={"open_timeout": 4})
    cluster.start(0)
    params = pika.ConnectionParameters("127.0.0.1", cluster.ports[0], socket_timeout=10)
    started = time.monotonic()
    with pytest.raises((ConnectionClosedByBroker, AMQPConnectionError)) as info:
        pika.BlockingConnection(params)
    waited = time.monotonic() - started
    assert 3.5 < waited < 10
    assert "not ready" in str(info.value) and "541" in str(info.value)
    # a client that connects while the root appears is admitted once it exists
    result: dict[str, object] = {}

    def connect() -> None:
        try:
            conn = pika.BlockingConnection(
                pika.ConnectionParameters("127.0.0.1", cluster.ports[0], socket_timeout=15)
            )
            result["open"] = conn.is_open
            conn.close()
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=connect)
    cluster.start(1)
    thread.start()
    thread.join(20)
    assert result.get("open") is True, result
    with pytest.raises((ConnectionClosedByBroker, AMQPConnectionError)) as info:
        pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", cluster.ports[0], virtual_host="/other")
        )
    assert "530" in str(info.value) or "NOT_ALLOWED" in str(info.value)


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ('known_hosts = ["127.0.0.1:1"]\n', [], "secret"),
        ('secret = "long-enough"\nknown_hosts = []\n', [], "known_hosts"),
        (None, ["--type", "secondary"], "need --cluster"),
    ],
)
def test_bad_cluster_file_or_option_exits_2(tmp_path: Path, content, args, message) -> None:
    cmd = [sys.executable, "-m", "brokerd", "--port", "0", "--data-dir", str(tmp_path)]
    if content is not None:
        path = tmp_path / "cluster.toml"
        path.write_text(content)
        cmd += ["--cluster", str(path)]
    result = subprocess.run(cmd + args, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert message in result.stderr


def test_standalone_broker_ignores_cluster_commands(tmp_path: Path) -> None:
    proc = BrokerProcess(tmp_path / "solo").start()
    try:
        from brokerd.server.control import request

        reply = request(proc.data_dir, "fault", ["heal"])
        assert not reply["ok"] and "clustered broker" in reply["error"]
    finally:
        proc.stop()


def test_aliases_collapse_by_spid_and_dumps_show_the_cluster_view(make_cluster) -> None:
    cluster = make_cluster(3, 0)
    # the first server is listed twice, under two names
    text = cluster.file.read_text().replace(
        "known_hosts = [", f'known_hosts = ["localhost:{cluster.ports[0]}", '
    )
    cluster.file.write_text(text)
    cluster.start_all()
    root = cluster.wait(cluster.agreed_root)
    first = cluster.status(0)
    assert root == first["spid"]
    # on the first server both names led to itself: one is kept as 'self'
    assert "self" in first["links"].values()
    peer = next(p for p in cluster.status(1)["peers"] if p["spid"] == first["spid"])
    assert {f"127.0.0.1:{cluster.ports[0]}", f"localhost:{cluster.ports[0]}"} <= set(
        peer["aliases"]
    )
    assert "duplicate" in cluster.status(1)["links"].values()
    assert len(cluster.status(1)["peers"]) == 2  # two peers, not three
    server = cluster.servers[1]
    server.signal(signal.SIGUSR2)
    server.signal(signal.SIGUSR1)
    cluster.wait(lambda: "=== end of dump ===" in server.log_text())
    log = server.log_text()
    line = next(x for x in log.splitlines() if " status spid=" in x)
    assert f"root={root}" in line and "peers=2/2" in line and "role=primary" in line
    assert f"checksum={first['checksum']}" in line
    assert "cluster: {" in log and "'peers_active': 2" in log
