"""``brokerd --workers 2``: one port, two worker processes, one broker for clients.

Real processes: the supervising parent and its workers, pika clients on the one
port. Which worker a connection reaches is the kernel's choice (SO_REUSEPORT),
so the tests open connections until they hold one on each worker (the spid in
the server properties says which), then check that what one worker's client
does is seen whole through the other's.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.brokerd_process import BrokerProcess, log_tail, process_running
from tests.integration.test_ctl import ctl
from tests.support.clients import confirmed_publishers, drain_queues

pytestmark = pytest.mark.integration

WORKERS = 2
#: connections tried before giving up on reaching every worker (once both listen,
#: missing one in 200 is a 2^-199 chance)
MAX_TRIES = 400


def state(host: BrokerProcess) -> dict:
    return json.loads((host.data_dir / "host" / "state.json").read_text())


def worker_pids(host: BrokerProcess) -> list[int | None]:
    return [w["pid"] for w in state(host)["workers"]]


def gone(pid: int) -> bool:
    """The process is dead (a zombie waiting for a reaper counts as dead)."""
    return not process_running(pid)


def spid_of(conn: pika.BlockingConnection) -> str:
    spid = conn._impl.server_properties["spid"]
    return spid.decode() if isinstance(spid, bytes) else str(spid)


def connect(host: BrokerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(host.url + "?heartbeat=0"))


def one_per_worker(host: BrokerProcess, timeout: float = 20.0) -> list[pika.BlockingConnection]:
    """A connection on each worker (the others opened on the way are closed)."""
    found: dict[str, pika.BlockingConnection] = {}
    deadline = time.monotonic() + timeout
    tries = 0
    while len(found) < WORKERS:
        assert host.alive(), f"the host exited; its log ends:\n{log_tail(host.log_path)}"
        assert time.monotonic() < deadline and tries < MAX_TRIES, (
            f"reached {len(found)} of {WORKERS} workers in {tries} connections; "
            f"log:\n{log_tail(host.log_path)}"
        )
        tries += 1
        try:
            conn = connect(host)
        except pika.exceptions.AMQPConnectionError:
            time.sleep(0.2)  # a worker still electing its local root (541) or starting
            continue
        spid = spid_of(conn)
        if spid in found:
            conn.close()
            time.sleep(0.05)  # the other worker may not be listening yet
        else:
            found[spid] = conn
    return list(found.values())


def get_all(
    conn: pika.BlockingConnection, queue: str, count: int, timeout: float = 15.0
) -> list[str]:
    """Up to ``count`` bodies got from ``queue``, asking again while its worker is
    still recovering it (404: its home node is down)."""
    ch = conn.channel()
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        try:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
        except pika.exceptions.ChannelClosedByBroker:
            ch = conn.channel()
            time.sleep(0.2)
            continue
        if method is None:
            time.sleep(0.05)
            continue
        got.append(body.decode())
    return got


@pytest.fixture
def host(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp_path / "host", extra_args=["--workers", str(WORKERS)])
    try:
        broker.start()
        yield broker
    finally:
        pids = [p for p in _pids_or_empty(broker) if p]
        broker.stop(timeout=20)
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


def _pids_or_empty(host: BrokerProcess) -> list[int | None]:
    try:
        return worker_pids(host)
    except (OSError, ValueError, KeyError):
        return []


def test_clients_on_two_workers_see_one_broker(host: BrokerProcess) -> None:
    a, b = one_per_worker(host)
    try:
        cha, chb = a.channel(), b.channel()
        chb.confirm_delivery()
        # a queue declared through one worker takes publishes and gets through the other
        cha.queue_declare("wk-q")
        for i in range(50):
            chb.basic_publish("", "wk-q", f"m{i}".encode(), mandatory=True)
        got = []
        for _ in range(50):
            method, _props, body = cha.basic_get("wk-q", auto_ack=True)
            assert method is not None, f"only {len(got)} of 50 messages came back"
            got.append(body.decode())
        assert got == [f"m{i}" for i in range(50)]
        # an exchange and a binding made through different workers route together
        chb.exchange_declare("wk-x", "topic")
        cha.queue_declare("wk-bound")
        chb.queue_bind("wk-bound", "wk-x", "orders.#")
        cha.basic_publish("wk-x", "orders.eu", b"routed")
        for _ in range(50):
            method, _props, body = chb.basic_get("wk-bound", auto_ack=True)
            if method is not None:
                break
            time.sleep(0.05)
        assert body == b"routed"
        # a server-named queue of one worker is reachable by name through the other
        named = cha.queue_declare("", exclusive=True).method.queue
        # the other worker learns a private queue's name from the local root, a moment
        # after the declare-ok (as a meta-binding)
        deadline = time.monotonic() + 2.0
        while True:
            try:
                chb.basic_publish("", named, b"to-a-server-named-queue", mandatory=True)
                break
            except pika.exceptions.UnroutableError:
                assert time.monotonic() < deadline, "the private queue's name never arrived"
                time.sleep(0.01)
        method, _props, body = cha.basic_get(named, auto_ack=True)
        assert body == b"to-a-server-named-queue"
        # ...and it is exclusive to its connection whichever worker asks
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            b.channel().basic_consume(named, lambda *_: None)
        assert refused.value.reply_code == 405
        # a publish to no queue through the other worker is returned, as on one broker
        chb.basic_publish("", "no-such-queue-wk", b"x", mandatory=False)
        with pytest.raises(pika.exceptions.UnroutableError):
            chb.basic_publish("", "no-such-queue-wk", b"x", mandatory=True)
    finally:
        for conn in (a, b):
            if conn.is_open:
                conn.close()


def test_workers_link_over_unix_sockets_and_share_the_port(host: BrokerProcess) -> None:
    a, b = one_per_worker(host)
    a.close()
    b.close()
    sockets = sorted(p.name for p in (host.data_dir / "host").glob("worker-*.sock"))
    assert sockets == ["worker-0.sock", "worker-1.sock"]
    for name in sockets:
        assert (host.data_dir / "host" / name).stat().st_mode & 0o777 == 0o600
    cluster = (host.data_dir / "host" / "cluster.toml").stat()
    assert cluster.st_mode & 0o777 == 0o600
    assert all(p for p in worker_pids(host))


def test_a_killed_worker_is_restarted_with_its_durable_queue(host: BrokerProcess) -> None:
    a, b = one_per_worker(host)
    ch = b.channel()
    ch.confirm_delivery()
    ch.queue_declare("wk-durable", durable=True)
    persistent = pika.BasicProperties(delivery_mode=2)
    for i in range(200):
        ch.basic_publish("", "wk-durable", f"d{i}".encode(), persistent, mandatory=True)
    a.close()
    b.close()
    before = worker_pids(host)
    victim = before[0]
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        now = worker_pids(host)
        if now[0] not in (None, victim):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"worker 0 not restarted within 2 s: {state(host)}")
    assert state(host)["workers"][0]["restarts"] == 1
    assert now[1] == before[1], "the other worker was not touched"
    # every confirmed message is there, in order, whichever worker owned the queue
    conns = one_per_worker(host)
    try:
        got = get_all(conns[0], "wk-durable", 200)
        assert got == [f"d{i}" for i in range(200)]
    finally:
        for conn in conns:
            conn.close()


def test_sigterm_stops_every_worker_and_keeps_durable_messages(host: BrokerProcess) -> None:
    conns = one_per_worker(host)
    ch = conns[1].channel()
    ch.confirm_delivery()
    ch.queue_declare("wk-kept", durable=True)
    for i in range(100):
        ch.basic_publish("", "wk-kept", f"k{i}".encode(), pika.BasicProperties(delivery_mode=2))
    for conn in conns:
        conn.close()
    pids = worker_pids(host)
    assert host.stop(timeout=30) == 0, log_tail(host.log_path)
    for pid in pids:
        assert pid is not None and gone(pid)
    host.start()
    conns = one_per_worker(host)
    try:
        got = get_all(conns[0], "wk-kept", 100)
        assert got == [f"k{i}" for i in range(100)]
    finally:
        for conn in conns:
            conn.close()


def test_killing_the_parent_leaves_no_worker(host: BrokerProcess) -> None:
    one = one_per_worker(host)
    for conn in one:
        conn.close()
    pids = worker_pids(host)
    assert all(pids)
    host.signal(signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and not all(gone(p) for p in pids if p):
        time.sleep(0.05)
    assert all(gone(p) for p in pids if p), f"workers outlived their parent: {pids}"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "at least 1"),
        ("-1", "not a number"),
        ("two", "not a number"),
        ("257", "at most 256"),
    ],
)
def test_bad_worker_counts_are_refused_at_startup(tmp_path: Path, value: str, message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "brokerd", "--workers", value, "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert message in done.stderr, done.stderr


def test_a_workers_kill_under_confirmed_load_loses_no_confirmed_message(
    host: BrokerProcess,
) -> None:
    queues = [f"wk-load-{i}" for i in range(4)]
    setup = connect(host)
    for name in queues:
        setup.channel().queue_declare(name, durable=True)  # balanced: two per worker
    setup.close()
    with confirmed_publishers([functools.partial(connect, host)] * 2, queues, 30) as confirmed:
        time.sleep(1.5)
        assert all(confirmed), "no publisher got a confirm before the kill"
        victim = worker_pids(host)[0]
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        at_kill = sum(len(out) for out in confirmed)
        time.sleep(2.5)  # the worker restarts meanwhile; publishers go on
    sent = set().union(*confirmed)
    assert len(sent) > at_kill, "no publish was confirmed after the kill"
    conn = connect(host)
    try:
        got = drain_queues(conn, queues, 20)  # a restarted worker may still recover one
    finally:
        conn.close()
    lost = sent - set(got)
    duplicated = len(got) - len(set(got))
    assert not lost, f"{len(lost)} of {len(sent)} confirmed messages lost: {sorted(lost)[:5]}"
    assert duplicated == 0, f"{duplicated} messages came back twice"
    assert state(host)["workers"][0]["restarts"] == 1


def host_ctl(host: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """``brokerd ctl`` against the host (a queue move waits for its hand-over)."""
    return ctl(host, *args, timeout=90)


def test_brokerd_ctl_answers_for_every_worker_of_a_host(host: BrokerProcess) -> None:
    conns = one_per_worker(host)
    ch = conns[0].channel()
    for i in range(4):
        ch.queue_declare(f"wk-ctl-{i}")
    client_spids = [spid_of(c) for c in conns]

    ctl = functools.partial(host_ctl, host)

    status = ctl("status", "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["host"]["pid"] == host.proc.pid  # type: ignore[union-attr]
    spids = {w["spid"] for w in doc["workers"]}
    assert len(spids) == WORKERS and all(w["ready"] for w in doc["workers"])
    roots = {w["root"] for w in doc["workers"]}
    assert len(roots) == 1 and roots <= spids  # one local root, a worker of this host
    text = ctl("status").stdout
    assert "== worker-0: pid" in text and "== worker-1: pid" in text
    queues = ctl("queues", "--json")
    assert queues.returncode == 0, queues.stderr
    listed = {q["name"]: q for q in json.loads(queues.stdout)["queues"]}
    placed = [listed[f"wk-ctl-{i}"]["owner"] for i in range(4)]
    assert set(placed) == spids, f"balanced placement put them on {placed}"
    by_spid = {w["spid"]: f"worker-{k}" for k, w in enumerate(doc["workers"])}
    for i in range(4):  # each queue's worker, by name
        q = listed[f"wk-ctl-{i}"]
        assert q["owner_address"] == by_spid[q["owner"]], q
    assert "(worker-0)" in ctl("queues").stdout

    connections = ctl("connections", "--json")
    assert connections.returncode == 0, connections.stderr
    rows = json.loads(connections.stdout)["connections"]
    clients = [r for r in rows if not r["link"]]
    assert sorted(r["worker"] for r in clients) == sorted(by_spid[s] for s in client_spids)
    assert all(r["user"] == "guest" and r["vhost"] == "/" for r in clients), clients
    assert any(r["link"] for r in rows)  # the workers' links to each other
    table = ctl("connections").stdout
    assert "worker-0" in table and "worker-1" in table and "2 connections" in table
    for conn in conns:
        conn.close()


def test_brokerd_ctl_moves_a_quorum_queue_to_a_worker_by_name(host: BrokerProcess) -> None:
    conns = one_per_worker(host)
    ch = conns[0].channel()
    ch.confirm_delivery()
    ch.queue_declare("wk-move", durable=True, arguments={"x-queue-type": "quorum"})
    for i in range(20):
        ch.basic_publish("", "wk-move", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))

    ctl = functools.partial(host_ctl, host)

    def owner() -> str:
        listed = json.loads(ctl("queues", "--json").stdout)["queues"]
        return next(q["owner_address"] for q in listed if q["name"] == "wk-move")

    before = owner()
    target = "worker-1" if before == "worker-0" else "worker-0"
    moved = ctl("queue", "move", "wk-move", target)
    assert moved.returncode == 0, moved.stderr
    assert "wk-move moved" in moved.stdout
    assert owner() == target
    got = get_all(conns[1], "wk-move", 20)
    assert got == [f"m{i}" for i in range(20)]
    refused = ctl("queue", "move", "wk-move", "worker-7")
    assert refused.returncode == 1 and "worker-7" in refused.stderr
    for conn in conns:
        conn.close()


def test_clients_move_to_their_queues_worker_and_lose_nothing(host: BrokerProcess) -> None:
    """Each consumer and publisher, wherever the kernel put it, ends on the worker that
    owns its queue (its first consume or publish moved it), and every confirmed
    message arrives once, in order."""
    declarer = connect(host)
    ch = declarer.channel()
    names = [f"wk-mv-{i}" for i in range(4)]
    for name in names:
        ch.queue_declare(name)

    def named(name: str) -> pika.BlockingConnection:
        params = pika.URLParameters(host.url + "?heartbeat=0")
        params.client_properties = {"connection_name": name}
        return pika.BlockingConnection(params)

    got: dict[str, list[bytes]] = {n: [] for n in names}
    consumers = []
    for name in names:
        conn = named(f"consumer {name}")
        cch = conn.channel()
        cch.basic_qos(prefetch_count=20)
        cch.basic_consume(
            name,
            lambda c, m, _p, body, name=name: (got[name].append(body), c.basic_ack(m.delivery_tag)),
        )
        consumers.append(conn)
    publishers = []
    for name in names:
        conn = named(f"publisher {name}")
        pch = conn.channel()
        pch.confirm_delivery()
        for k in range(100):
            pch.basic_publish("", name, f"{name}/{k}".encode())  # confirmed, one by one
        publishers.append(conn)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and sum(map(len, got.values())) < 400:
        for conn in consumers:
            conn.process_data_events(0.02)
    for name in names:
        assert got[name] == [f"{name}/{k}".encode() for k in range(100)], name

    listed = json.loads(host_ctl(host, "queues", "--json").stdout)["queues"]
    owner = {q["name"]: q["owner_address"] for q in listed if q["name"] in names}
    assert sorted(set(owner.values())) == ["worker-0", "worker-1"]  # balanced
    rows = json.loads(host_ctl(host, "connections", "--json").stdout)["connections"]
    where = {r["connection_name"]: r["worker"] for r in rows if r.get("connection_name")}
    for name in names:
        assert where[f"consumer {name}"] == owner[name], (name, where, owner)
        assert where[f"publisher {name}"] == owner[name], (name, where, owner)
    # (without the moves, all 8 on their queue's worker by chance: 1 run in 256)
    print("connections moved:", host.log_text().count("moved in conn="))
    for conn in [declarer, *consumers, *publishers]:
        conn.close()


@pytest.mark.parametrize("sibling", ["refuses", "silent"])
def test_a_connection_its_sibling_does_not_take_stays_and_works(
    host: BrokerProcess, sibling: str
) -> None:
    """Each worker's hand-over socket replaced by one that answers N (refuses) or
    never answers (a paused worker): a client whose queue is on the other worker stays
    where it landed, after at most the hand-over's timeout, and loses nothing."""
    import socket as sock_mod

    conns = one_per_worker(host)
    ch = conns[0].channel()
    for i in range(4):
        ch.queue_declare(f"wk-stay-{i}")
    listeners = []
    for k in range(WORKERS):
        path = host.data_dir / "host" / f"worker-{k}.handoff"
        path.unlink()
        listener = sock_mod.socket(sock_mod.AF_UNIX, sock_mod.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(16)
        listeners.append(listener)
    stop = threading.Event()
    held: list[sock_mod.socket] = []

    def answer(listener: sock_mod.socket) -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)
            if sibling == "refuses":
                conn.sendall(b"N")

    threads = [threading.Thread(target=answer, args=(lst,), daemon=True) for lst in listeners]
    for thread in threads:
        thread.start()
    try:
        for conn in conns:  # one per worker: half the queues are on the other one
            cch = conn.channel()
            cch.confirm_delivery()
            for i in range(4):
                started = time.monotonic()
                for k in range(20):
                    cch.basic_publish("", f"wk-stay-{i}", f"{k}".encode())
                assert time.monotonic() - started < 5
        for i in range(4):
            got = get_all(conns[1], f"wk-stay-{i}", 40)
            assert sorted(got, key=int) == sorted([f"{k}" for k in range(20)] * 2, key=int)
        assert "stays:" in host.log_text()
        assert "moved in conn=" not in host.log_text()
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        for s in [*held, *listeners]:
            s.close()
        for conn in conns:
            conn.close()


@pytest.mark.parametrize(
    ("option", "hosts", "message"),
    [
        (["--type", "secondary"], '"127.0.0.1:5672"', "--type secondary is not supported"),
        ([], '"unix:/tmp/w.sock"', "names its hosts by host:port"),
    ],
)
def test_options_a_host_of_workers_does_not_take_yet_are_refused(
    tmp_path: Path, option: list[str], hosts: str, message: str
) -> None:
    cluster = tmp_path / "cluster.toml"
    cluster.write_text(f'name = "c"\nsecret = "a-long-enough-secret"\nknown_hosts = [{hosts}]\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "brokerd",
            "--workers",
            "2",
            "--data-dir",
            str(tmp_path / "d"),
            "--cluster",
            str(cluster),
            *option,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert message in done.stderr, done.stderr


def test_one_metrics_endpoint_answers_for_every_worker(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.brokerd_process import free_port, wait_workers_ready

    port = free_port()
    host = BrokerProcess(
        tmp_path / "host", extra_args=["--workers", "2", "--metrics-port", str(port)]
    )
    try:
        host.start()
        wait_workers_ready(host.data_dir, WORKERS)
        for conn in one_per_worker(host):
            conn.channel().queue_declare(f"wk-metrics-{spid_of(conn)[-4:]}")
            conn.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            assert reply.status == 200
            text = reply.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}  # parses: valid
        workers = {s.labels.get("worker") for f in families.values() for s in f.samples}
        assert {"0", "1"} <= workers, sorted(w for w in workers if w)
        assert families["rookery_host_workers_unreachable"].samples[0].value == 0
        for name in ("worker-0.metrics", "worker-1.metrics"):
            assert (host.data_dir / "host" / name).stat().st_mode & 0o777 == 0o600
    finally:
        host.stop(timeout=20)


HOST_LIMITS = """
[[vhosts]]
name = "/"
limits = { max_connections = 3 }
"""


def test_connection_limits_and_the_login_throttle_count_the_whole_host(tmp_path: Path) -> None:
    """A vhost's ``max_connections`` and the failed-login throttle are the host's, not
    each worker's: with a limit of 3, one connection on each worker and a third,
    every further one is refused whichever worker it reaches (each worker counting
    alone would take 3 of its own); five wrong passwords, spread over the workers by
    the kernel, earn the fifth refusal the delay of five failures, not of two or three."""
    config = tmp_path / "brokerd.toml"
    config.write_text(HOST_LIMITS)
    host = BrokerProcess(
        tmp_path / "host", extra_args=["--workers", str(WORKERS), "--config", str(config)]
    )
    host.start()
    held: list[pika.BlockingConnection] = []
    try:
        held += one_per_worker(host)
        held.append(connect(host))
        admitted = 0
        for _ in range(10):
            try:
                held.append(connect(host))
                admitted += 1
            except pika.exceptions.ProbableAccessDeniedError as refused:
                assert "connection limit (3) is reached" in str(refused)
        assert admitted == 0, f"{admitted} connections past the host's limit of 3"
        held.pop().close()  # one place is free again, on whichever worker
        held.append(connect(host))

        wrong = pika.URLParameters(f"amqp://guest:wrong@127.0.0.1:{host.port}/?heartbeat=0")
        took = []
        for _ in range(5):
            started = time.monotonic()
            with pytest.raises(pika.exceptions.ProbableAuthenticationError):
                pika.BlockingConnection(wrong)
            took.append(time.monotonic() - started)
        assert took[-1] >= 1.5, f"refusals took {took}: failures were not counted host-wide"
    finally:
        for conn in held:
            with contextlib.suppress(Exception):
                conn.close()
        pids = [p for p in _pids_or_empty(host) if p]
        host.stop(timeout=20)
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
