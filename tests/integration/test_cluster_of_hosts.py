"""A cluster of hosts: three ``brokerd --workers 2 --cluster FILE`` hosts, one cluster.

Real processes on loopback: each host's parent and its two workers, pika clients
on the hosts' ports. Every worker is a member (six), but the known hosts name
hosts, the quorum counts hosts (H x W), Connection.OpenOk names hosts, and a
quorum queue's group takes a worker on each host. Faults: a worker's kill -9
under confirmed load, and a host's parent killed with -9 (its workers die with
it, the others keep the root and every confirmed message; it comes back at the
same link addresses).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from brokerd.server.control import request
from tests.brokerd_process import BrokerProcess, free_port, log_tail, process_running
from tests.cluster_harness import write_cluster_file
from tests.integration.test_ctl import ctl
from tests.support.clients import confirmed_publishers, drain_flagged, drain_queues

pytestmark = pytest.mark.integration

HOSTS = 3
WORKERS = 2


class Hosts:
    """Three hosts of two workers, one cluster file."""

    def __init__(self, base: Path, workers: tuple[int, ...] = (WORKERS,) * HOSTS) -> None:
        ports = [free_port() for _ in workers]
        self.cluster_file = write_cluster_file(base / "cluster.toml", ports, timeout=2.0)
        self.hosts = [
            BrokerProcess(
                base / f"h{i}",
                port=port,
                extra_args=[
                    "--workers",
                    str(count),
                    "--cluster",
                    str(self.cluster_file),
                    "--enable-fault-injection",
                ],
            )
            for i, (port, count) in enumerate(zip(ports, workers, strict=True))
        ]
        self.workers = workers

    def start(self) -> None:
        for host in self.hosts:
            host.spawn()
        for host in self.hosts:
            host.wait_listening(30)

    def logs(self) -> str:
        return "\n".join(f"--- h{i}\n{log_tail(h.log_path)}" for i, h in enumerate(self.hosts))

    def view(self, host: int, worker: int) -> dict | None:
        try:
            reply = request(self.hosts[host].data_dir / f"worker-{worker}", "status", timeout=1.0)
        except (OSError, ValueError):
            return None
        return reply.get("result") if reply.get("ok") else None

    def views(self, hosts: list[int] | None = None) -> list[dict | None]:
        return [
            self.view(h, w)
            for h in (range(len(self.hosts)) if hosts is None else hosts)
            for w in range(self.workers[h])
        ]

    def settled(self, hosts: list[int] | None = None, timeout: float = 60.0) -> list[dict]:
        """Every worker of ``hosts`` ready under one root; their views."""
        deadline = time.monotonic() + timeout
        while True:
            views = self.views(hosts)
            if all(v is not None and v.get("ready") for v in views):
                roots = {v["root"] for v in views if v}
                if len(roots) == 1 and None not in roots:
                    return [v for v in views if v]
            for host in self.hosts if hosts is None else [self.hosts[h] for h in hosts]:
                assert host.alive(), f"a host exited:\n{self.logs()}"
            assert time.monotonic() < deadline, f"not settled: {views}\n{self.logs()}"
            time.sleep(0.2)

    def pids(self, host: int) -> list[int]:
        state = json.loads((self.hosts[host].data_dir / "host" / "state.json").read_text())
        return [w["pid"] for w in state["workers"] if w["pid"]]

    def link_ports(self, host: int) -> list[int]:
        return json.loads((self.hosts[host].data_dir / "host" / "links.json").read_text())["ports"]

    def connect(self, host: int) -> pika.BlockingConnection:
        url = f"{self.hosts[host].url}?heartbeat=0&connection_attempts=20&retry_delay=0.5"
        return pika.BlockingConnection(pika.URLParameters(url))

    def close(self) -> None:
        for index in range(len(self.hosts)):
            pids = []
            with contextlib.suppress(OSError, ValueError, KeyError):
                pids = self.pids(index)
            self.hosts[index].stop(timeout=30)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    made = Hosts(tmp_path_factory.mktemp("hosts"))
    try:
        made.start()
        made.settled()
        yield made
    finally:
        made.close()


def test_every_worker_of_every_host_follows_one_root_and_counts_hosts(hosts: Hosts) -> None:
    views = hosts.settled()
    assert len(views) == HOSTS * WORKERS
    assert len({v["spid"] for v in views}) == HOSTS * WORKERS
    assert sum(v["is_root"] for v in views) == 1
    for view in views:
        # three known hosts of two workers each: a majority is four workers, two hosts' worth
        assert view["known_primaries"] == HOSTS * WORKERS, view
        assert sum(p["active"] for p in view["peers"]) == HOSTS * WORKERS - 1, view
    # each worker's link address is its own port, kept for the next start
    ports = [p for h in range(HOSTS) for p in hosts.link_ports(h)]
    assert len(set(ports)) == HOSTS * WORKERS


def test_open_ok_names_the_hosts_never_a_worker(hosts: Hosts) -> None:
    expected = sorted(f"127.0.0.1:{h.port}" for h in hosts.hosts)
    for index in range(HOSTS):
        conn = hosts.connect(index)
        try:
            assert sorted(conn._impl.known_hosts.split(",")) == expected
        finally:
            conn.close()


def _owner_and_group(hosts: Hosts, queue: str) -> tuple[str, list[str]]:
    """A quorum queue's group, by link address, as a worker's queue table has it."""
    reply = request(hosts.hosts[0].data_dir / "worker-0", "queues", timeout=5.0)
    for row in reply["result"]["queues"]:
        if row["name"] == queue:
            return row.get("owner") or "", list(row.get("group") or [])
    raise AssertionError(f"{queue} not in {reply}")


def _declare_and_publish(hosts: Hosts, host: int, queue: str, count: int) -> None:
    """A quorum queue declared through ``host`` and ``count`` confirmed messages in it."""
    conn = hosts.connect(host)
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", queue, f"m{i}".encode(), mandatory=True)
    finally:
        conn.close()


def test_a_quorum_queue_keeps_a_copy_on_each_host_and_serves_every_host(hosts: Hosts) -> None:
    _declare_and_publish(hosts, 0, "hq-one", 100)
    c = hosts.connect(2)
    try:
        _owner, group = _owner_and_group(hosts, "hq-one")
        host_of = {f"127.0.0.1:{port}": h for h in range(HOSTS) for port in hosts.link_ports(h)}
        assert len(group) == 3, group
        assert sorted(host_of[address] for address in group) == [0, 1, 2], group
        # all of them, in order, through another host than the one they were sent to
        assert drain_queues(c, ["hq-one"], 15) == [f"m{i}" for i in range(100)]
    finally:
        c.close()


def test_ctl_names_workers_by_host_and_moves_a_queue_to_another_host(hosts: Hosts) -> None:
    _declare_and_publish(hosts, 0, "hq-move", 20)
    table = ctl(hosts.hosts[0], "queues")
    assert table.returncode == 0, table.stderr
    line = next(row for row in table.stdout.splitlines() if " hq-move " in row)
    # declared through host 0: owned by one of its workers, named by the host
    assert f"@127.0.0.1:{hosts.hosts[0].port}" in line, line
    target = f"127.0.0.1:{hosts.hosts[2].port}"
    moved = ctl(hosts.hosts[0], "queue", "move", "hq-move", target, timeout=90)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    table = ctl(hosts.hosts[1], "queues")
    line = next(row for row in table.stdout.splitlines() if " hq-move " in row)
    assert f"@{target}" in line, line
    got = _drain(hosts, 1, ["hq-move"])
    assert got == [f"m{i}" for i in range(20)]


def _drain(hosts: Hosts, host: int, queues: list[str], timeout: float = 60.0) -> list[str]:
    """Every body left, in order; a message that comes twice (a publish forwarded
    again after its owner's worker died: at least once) must carry the redelivered
    flag the second time."""
    conn = hosts.connect(host)
    try:
        got = drain_flagged(conn, queues, timeout)
    finally:
        conn.close()
    seen: set[str] = set()
    for body, redelivered in got:
        assert body not in seen or redelivered, f"{body} came twice, unflagged"
        seen.add(body)
    return [body for body, _flag in got]


def _under_load(hosts: Hosts, queues: list[str], fault: callable) -> tuple[set[str], int]:  # type: ignore[valid-type]
    setup = hosts.connect(0)
    for name in queues:
        setup.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    setup.close()
    connects = [functools.partial(hosts.connect, i) for i in range(2)]
    with confirmed_publishers(connects, queues) as confirmed:
        time.sleep(1.5)
        assert all(confirmed), f"no publisher got a confirm before the fault\n{hosts.logs()}"
        fault()
        at_fault = sum(len(out) for out in confirmed)
        time.sleep(3.0)
    return set().union(*confirmed), at_fault


def test_a_workers_kill_under_confirmed_load_loses_no_confirmed_message(hosts: Hosts) -> None:
    queues = [f"hq-load-{i}" for i in range(4)]
    root_host = next(
        h for h in range(HOSTS) for w in range(WORKERS) if (hosts.view(h, w) or {}).get("is_root")
    )
    victim = hosts.pids(root_host)[0]

    sent, at_kill = _under_load(hosts, queues, lambda: os.kill(victim, signal.SIGKILL))
    assert len(sent) > at_kill, "no publish was confirmed after the kill"
    hosts.settled()
    got = _drain(hosts, 1, queues)
    lost = sent - set(got)
    assert not lost, f"{len(lost)} of {len(sent)} confirmed messages lost: {sorted(lost)[:5]}"


def test_a_hosts_parent_killed_takes_its_workers_and_the_rest_go_on(hosts: Hosts) -> None:
    queues = [f"hq-host-{i}" for i in range(4)]
    victim = hosts.hosts[2]
    pids = hosts.pids(2)
    ports = hosts.link_ports(2)

    def kill_host() -> None:
        victim.signal(signal.SIGKILL)
        assert victim.proc is not None
        victim.proc.wait(10)

    sent, at_kill = _under_load(hosts, queues, kill_host)
    deadline = time.monotonic() + 10
    while any(process_running(pid) for pid in pids):
        assert time.monotonic() < deadline, f"workers {pids} outlived their parent"
        time.sleep(0.05)
    # two hosts of three (four workers of six) keep a root
    views = hosts.settled([0, 1])
    assert sum(v["is_root"] for v in views) == 1
    assert len(sent) > at_kill, "no publish was confirmed after the host died"
    victim.start()
    hosts.settled()
    assert hosts.link_ports(2) == ports  # the same link addresses: its groups find it
    got = _drain(hosts, 0, queues)
    lost = sent - set(got)
    assert not lost, f"{len(lost)} of {len(sent)} confirmed messages lost: {sorted(lost)[:5]}"


def test_a_host_with_another_worker_count_is_refused(tmp_path: Path) -> None:
    """Three workers against two would weigh more: the checksum differs, the link is
    refused and both sides raise config-mismatch."""
    made = Hosts(tmp_path, workers=(2, 3))
    try:
        made.start()
        deadline = time.monotonic() + 30
        while True:
            views = [v for v in made.views() if v is not None]
            alarms = [a for v in views for a in v.get("alarms", [])]
            mismatch = [a for a in alarms if "config-mismatch" in json.dumps(a)]
            if mismatch and len(views) == sum(made.workers):
                break
            assert time.monotonic() < deadline, f"no config-mismatch: {views}\n{made.logs()}"
            time.sleep(0.2)
        for host in range(2):
            for worker in range(made.workers[host]):
                view = made.view(host, worker)
                assert view is not None
                heard = sum(p["active"] for p in view["peers"])
                # its siblings at most, never the other host's workers
                assert heard <= made.workers[host] - 1, view
                # neither host is a majority of two hosts: no root on either side
                assert not view["is_root"], view
    finally:
        made.close()
