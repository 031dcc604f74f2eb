"""Worker faults on one host, or on a cluster of hosts:
``python -m tests.faults.host_soak --faults 40 --seed 1`` (one host),
``python -m tests.faults.host_soak --hosts 3 --faults 40 --seed 1`` (a cluster).

A ``brokerd --workers N`` host (issue 40) under the fault harness's workload:
confirmed publishers of persistent messages and consumers with manual acks,
every client on the host's one port (the kernel picks each connection's
worker), durable queues placed over the workers (``--queue-type``: classic
by default on one host).

With ``--hosts H`` (H > 1), H such hosts are started as one cluster
(``brokerd --workers N --cluster FILE --enable-fault-injection``, one cluster
file in the temp base listing every host's port): each worker of each host is
a cluster member (H*N of them). Every client is given every host's port and
fails over from one to the next; the queues are quorum queues by default.
Hosts are named h0, h1, ... and workers w0, w1, ...: a fault's target is
``h2/w1`` (one worker) or ``h2/all`` (the whole host).

The nemesis picks, seeded, a host (with ``--hosts`` above 1) and then among

- ``kill-worker``: kill -9 of one worker (the parent starts it again; its
  durable queues come back from its journal);
- ``pause-worker``: SIGSTOP of one worker for 0.5-4 s, then SIGCONT;
- ``term-worker``: SIGTERM to one worker (a planned stop of one; the parent
  starts it again);
- ``kill-parent``: kill -9 of the parent (every worker dies with it), then the
  host is started again on the same data directory;
- ``restart-host``: SIGTERM to the parent, and the host started again;
- ``pause-host``: SIGSTOP of every worker of the host for 0.5-4 s, then
  SIGCONT (a server pause; a default kind only with ``--hosts`` above 1).

A fault's role is ``root`` when it hit the root (a host fault: the root was
one of its workers), else ``worker`` or ``host`` (on one host a host fault is
always ``host``). Each fault is held until every worker of every host answers
ready and all follow one root again. The checker is the harness's
(``tests.faults.checker``): 0 lost confirmed messages, 0 duplicates without
the redelivered flag, 0 order violations. Exits 1 if one of those is not 0,
the drain did not finish or a fault never settled (the faults stop there, and
the drain runs all the same: its report tells the messages still delivered
from those that are not). ``--json`` writes the report, ``--history`` the
history (``python -m tests.faults --check`` does not read it: load it with
``History.load``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tests.brokerd_process import BrokerProcess, free_port, log_tail, process_running
from tests.cluster_harness import write_cluster_file
from tests.faults.checker import check
from tests.faults.history import Fault, Recorder
from tests.faults.run import RunConfig, drain
from tests.faults.workload import Client, Consumer, Publisher, declare, sweep

#: the kinds of one host (and the default there)
KINDS = ("kill-worker", "pause-worker", "term-worker", "kill-parent", "restart-host")
#: every kind (the default with more than one host)
ALL_KINDS = (*KINDS, "pause-host")
#: the faults that take the whole host
HOST_KINDS = ("kill-parent", "restart-host", "pause-host")
#: how long a fault may take to settle (every worker ready under one root)
SETTLE_TIMEOUT = 60.0


class Host:
    """One host under test: its process tree, and what its state file says."""

    def __init__(
        self,
        home: Path,
        workers: int,
        *,
        name: str = "",
        port: int | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.workers = workers
        self.name = name
        args = ["--workers", str(workers), *(extra or [])]
        self.broker = (
            BrokerProcess(home, extra_args=args)
            if port is None
            else BrokerProcess(home, port=port, extra_args=args)
        )

    @property
    def port(self) -> int:
        return self.broker.port

    def state(self) -> dict:
        return json.loads((self.broker.data_dir / "host" / "state.json").read_text())

    def pid(self, index: int) -> int | None:
        return self.state()["workers"][index]["pid"]

    def views(self) -> list[dict | None]:
        from brokerd.server.control import request

        views: list[dict | None] = []
        for index in range(self.workers):
            try:
                reply = request(self.broker.data_dir / f"worker-{index}", "status", timeout=1.0)
                views.append(reply.get("result") if reply.get("ok") else None)
            except (OSError, ValueError):
                views.append(None)
        return views

    def restarted(self, index: int, old: int | None) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while self.pid(index) in (None, old):
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {index} not restarted; state {self.state()}")
            time.sleep(0.05)


class Hosts:
    """Every host under test: one, or ``count`` of them as one cluster."""

    def __init__(self, base: Path, count: int, workers: int) -> None:
        self.workers = workers
        self.file: Path | None = None
        if count == 1:
            self.hosts = [Host(base / "host", workers)]
            return
        ports = [free_port() for _ in range(count)]
        self.file = write_cluster_file(base / "cluster.toml", ports, name="host-soak")
        extra = ["--cluster", str(self.file), "--enable-fault-injection"]
        self.hosts = [
            Host(base / f"h{i}", workers, name=f"h{i}", port=ports[i], extra=extra)
            for i in range(count)
        ]

    @property
    def clustered(self) -> bool:
        return self.file is not None

    @property
    def ports(self) -> list[int]:
        return [h.port for h in self.hosts]

    def start(self) -> None:
        for host in self.hosts:
            host.broker.spawn()
        for host in self.hosts:
            host.broker.wait_listening(60)

    def stop(self) -> None:
        for host in self.hosts:
            host.broker.stop(timeout=60)

    def where(self, host: Host, index: int | None) -> str:
        worker = "all" if index is None else f"w{index}"
        return f"{host.name}/{worker}" if host.name else worker

    def views(self) -> dict[str, dict | None]:
        """Every worker's status by ``h1/w0``."""
        return {self.where(h, k): view for h in self.hosts for k, view in enumerate(h.views())}

    def settled(self) -> bool:
        views = list(self.views().values())
        if any(v is None or not v.get("ready") for v in views):
            return False
        return len({v["root"] for v in views if v}) == 1

    def root(self) -> str | None:
        """Where the root is (``h1/w0``), if a worker says it is the root."""
        return next((w for w, v in self.views().items() if v and v.get("is_root")), None)

    def describe(self) -> str:
        """Every worker's view in a line, for a failure message."""
        lines = []
        for where, v in self.views().items():
            if v is None:
                lines.append(f"  {where}: no answer")
                continue
            keys = ("spid", "ready", "is_root", "root", "known_primaries", "reason", "alarms")
            down = {a: s for a, s in (v.get("links") or {}).items() if s != "up"}
            lines.append(
                f"  {where}: " + " ".join(f"{k}={v.get(k)}" for k in keys) + f" links_not_up={down}"
            )
        return "\n".join(lines)

    def failure(self, message: str) -> RuntimeError:
        logs = "\n".join(
            f"{h.name or 'host'} ({h.broker.log_path}):\n{log_tail(h.broker.log_path)}"
            for h in self.hosts
        )
        return RuntimeError(f"{message}; views:\n{self.describe()}\nlogs:\n{logs}")

    def wait_settled(self, what: str) -> float:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while not self.settled():
            if dead := [h.name or "host" for h in self.hosts if not h.broker.alive()]:
                raise self.failure(f"host {', '.join(dead)} exited ({what})")
            if time.monotonic() > deadline:
                raise self.failure(f"not settled after {what}")
            time.sleep(0.1)
        return time.time()

    def known(self) -> set[int]:
        """The members each worker counts (every one: H*N when settled)."""
        return {v.get("known_primaries", 0) for v in self.views().values() if v}


def apply(hosts: Hosts, host: Host, kind: str, rng: random.Random, recorder: Recorder) -> Fault:
    """Inject one fault, undo it, wait until every host has settled; recorded."""
    index = rng.randrange(host.workers)
    root = hosts.root() if hosts.clustered else None
    on_host = root is not None and root.startswith(f"{host.name}/")
    if kind in HOST_KINDS:
        role = "root" if on_host else "host"
    else:
        view = host.views()[index]
        role = "root" if view is not None and view.get("is_root") else "worker"
    target: int | str = index
    if hosts.clustered:
        target = hosts.where(host, None if kind in HOST_KINDS else index)
    fault = recorder.fault(Fault(kind, target, role, time.time()))  # type: ignore[arg-type]
    if kind in ("kill-worker", "term-worker"):
        old = host.pid(index)
        os.kill(old, signal.SIGKILL if kind == "kill-worker" else signal.SIGTERM)  # type: ignore[arg-type]
        host.restarted(index, old)
    elif kind in ("pause-worker", "pause-host"):
        pids = [host.pid(k) for k in (range(host.workers) if kind == "pause-host" else [index])]
        held = rng.uniform(0.5, 4.0)
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
            time.sleep(held)
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]
        fault.note = f"paused {held:.1f}s"
    elif kind == "kill-parent":
        pids = [host.pid(k) for k in range(host.workers)]
        host.broker.signal(signal.SIGKILL)
        assert host.broker.proc is not None
        host.broker.proc.wait(10)
        _gone(pids)
        host.broker.start()
    elif kind == "restart-host":
        assert host.broker.stop(timeout=60) == 0, log_tail(host.broker.log_path)
        host.broker.start()
    fault.end = time.time()
    fault.recovered = hosts.wait_settled(f"{kind} of {target}")
    if hosts.clustered:
        fault.note = " ".join(filter(None, [fault.note, f"root {root} -> {hosts.root()}"]))
        if (known := hosts.known()) != {len(hosts.hosts) * hosts.workers}:
            fault.note += f" known_primaries {sorted(known)}"
    return fault


def _gone(pids: list[int | None], timeout: float = 5.0) -> None:
    """The workers of a parent killed with -9 are gone (they die with it); a zombie
    waiting for its reaper counts as gone."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if p is not None and process_running(p)]
        if not alive:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers {alive} outlived their parent")
        time.sleep(0.05)


def _summary(exc: BaseException) -> str:
    """An error's first line, without the views and logs it carries."""
    return f"{type(exc).__name__}: {str(exc).split('; views:')[0].splitlines()[0]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.host_soak", description=__doc__)
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hosts", type=int, default=1, help="hosts, one cluster if above 1")
    parser.add_argument("--workers", type=int, default=2, help="workers per host")
    parser.add_argument(
        "--kinds", help=f"of {','.join(ALL_KINDS)} (default: all; all but pause-host on one host)"
    )
    parser.add_argument(
        "--queue-type",
        choices=("classic", "quorum"),
        help="default: quorum with --hosts above 1, else classic",
    )
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=40.0, help="messages/s per publisher")
    parser.add_argument("--json", metavar="OUT.json", help="write the report here")
    parser.add_argument("--history", metavar="OUT.json", help="write the history here")
    args = parser.parse_args(argv)
    if args.hosts < 1:
        parser.error("--hosts must be 1 or more")
    clustered = args.hosts > 1
    args.kinds = args.kinds or ",".join(ALL_KINDS if clustered else KINDS)
    args.queue_type = args.queue_type or ("quorum" if clustered else "classic")
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(ALL_KINDS):
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    config = RunConfig(
        seed=args.seed,
        faults=args.faults,
        durable=True,
        queue_type=args.queue_type,
        # a cluster's quorum queues drain slower, after a longer run: generous
        drain_timeout=300.0 if clustered else 45.0,
    )
    base = Path(tempfile.mkdtemp(prefix="rookery-host-soak-"))
    hosts = Hosts(base, args.hosts, args.workers)
    recorder = Recorder()
    history = recorder.history
    queues = [f"host-soak-{i}" for i in range(args.queues)]
    ports = hosts.ports
    publishers = [
        Publisher(f"p{i}", ports, i, recorder, queues, rate=args.rate, durable=True, pad=64)
        for i in range(args.publishers)
    ]
    # consumers start one host further on than the publishers of the same number
    consumers = [
        Consumer(f"c{i}", ports, i + 1, recorder, queues[i % len(queues)], prefetch=32, rate=25.0)
        for i in range(args.consumers)
    ]
    clients: list[Client] = [*publishers, *consumers]
    rng = random.Random(args.seed)
    history.meta = {
        "config": vars(args),
        "servers": args.hosts * args.workers,
        "hosts": args.hosts,
    }
    failure = ""
    started = time.time()
    try:
        hosts.start()
        hosts.wait_settled("start")
        declare(ports, queues, args.queue_type)
        for client in clients:
            client.start()
        time.sleep(2.0)
        try:
            for n in range(args.faults):
                host = hosts.hosts[rng.randrange(args.hosts)] if clustered else hosts.hosts[0]
                kind = rng.choice(kinds)
                fault = apply(hosts, host, kind, rng, recorder)
                print(
                    f"[{n + 1}/{args.faults}] {kind} [{fault.target}] ({fault.role}) "
                    f"{fault.note} settled after {fault.recovered - fault.start:.1f}s",  # type: ignore[operator]
                    flush=True,
                )
                time.sleep(rng.uniform(0.5, 2.0))
        except Exception as exc:
            # a fault that did not settle: drain all the same, so the report tells
            # the messages still delivered from those that are not
            failure = _summary(exc)
            traceback.print_exc()
        history.drain_start = time.time()
        for publisher in publishers:
            publisher.halt()
        for publisher in publishers:
            publisher.join(15)
        for consumer in consumers:
            consumer.rate = None
        history.drained = drain(ports, queues, consumers, recorder, config)
        history.meta["swept"] = sweep(ports, queues, recorder)
        history.drain_end = time.time()
    except Exception as exc:
        failure = failure or _summary(exc)
        traceback.print_exc()
    finally:
        for client in clients:
            client.halt()
        for client in clients:
            if client.ident is not None:
                client.join(10)
        history.meta["client_errors"] = {c.name: dict(c.errors) for c in clients}
        history.meta["slowest_confirm"] = max((p.slowest for p in publishers), default=0.0)
        history.meta["failure"] = failure
        hosts.stop()
    report = check(history)
    print(report.format())
    print(f"{time.time() - started:.0f}s, {len(history.faults)} faults")
    if failure:
        print(f"FAILED: {failure}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    if args.history:
        history.save(Path(args.history))
    for host in hosts.hosts:
        print(f"logs: {host.broker.log_path}")
    return 0 if report.ok() and not failure else 1


if __name__ == "__main__":
    sys.exit(main())
