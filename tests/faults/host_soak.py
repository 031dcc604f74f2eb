"""Worker faults on one host: ``python -m tests.faults.host_soak --faults 40 --seed 1``.

A ``brokerd --workers N`` host (issue 40) under the fault harness's workload:
confirmed publishers of persistent messages and consumers with manual acks,
every client on the host's one port (the kernel picks each connection's
worker), durable classic queues placed over the workers. The nemesis picks,
seeded, among

- ``kill-worker``: kill -9 of one worker (the parent starts it again; its
  durable queues come back from its journal);
- ``pause-worker``: SIGSTOP of one worker for 0.5-4 s, then SIGCONT;
- ``term-worker``: SIGTERM to one worker (a planned stop of one; the parent
  starts it again);
- ``kill-parent``: kill -9 of the parent (every worker dies with it), then the
  host is started again on the same data directory;
- ``restart-host``: SIGTERM to the parent, and the host started again.

Each fault is held until every worker answers and follows one root again.
The checker is the harness's (``tests.faults.checker``): 0 lost confirmed
messages, 0 duplicates without the redelivered flag, 0 order violations.
Exits 1 if one of those is not 0 or the drain did not finish.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.brokerd_process import BrokerProcess, log_tail
from tests.faults.checker import check
from tests.faults.history import Fault, Recorder
from tests.faults.run import RunConfig, drain
from tests.faults.workload import Client, Consumer, Publisher, declare, sweep

KINDS = ("kill-worker", "pause-worker", "term-worker", "kill-parent", "restart-host")
#: how long a fault may take to settle (every worker ready under one root)
SETTLE_TIMEOUT = 60.0


class Host:
    """The host under test: its process tree, and what its state file says."""

    def __init__(self, base: Path, workers: int) -> None:
        self.workers = workers
        self.broker = BrokerProcess(base / "host", extra_args=["--workers", str(workers)])

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

    def settled(self) -> bool:
        views = self.views()
        if any(v is None or not v.get("ready") for v in views):
            return False
        return len({v["root"] for v in views if v}) == 1

    def wait_settled(self, what: str) -> float:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while not self.settled():
            if not self.broker.alive():
                raise RuntimeError(
                    f"the host exited ({what}); log:\n{log_tail(self.broker.log_path)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"not settled after {what}; log:\n{log_tail(self.broker.log_path)}"
                )
            time.sleep(0.1)
        return time.time()

    def role(self, index: int) -> str:
        view = self.views()[index]
        return "root" if view is not None and view.get("is_root") else "worker"

    def restarted(self, index: int, old: int | None) -> None:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while self.pid(index) in (None, old):
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {index} not restarted; state {self.state()}")
            time.sleep(0.05)


def apply(host: Host, kind: str, rng: random.Random, recorder: Recorder) -> Fault:
    """Inject one fault, undo it, wait until the host has settled; recorded."""
    index = rng.randrange(host.workers)
    role = "host" if kind in ("kill-parent", "restart-host") else host.role(index)
    fault = recorder.fault(Fault(kind, index, role, time.time()))
    if kind == "kill-worker":
        old = host.pid(index)
        os.kill(old, signal.SIGKILL)  # type: ignore[arg-type]
        host.restarted(index, old)
    elif kind == "term-worker":
        old = host.pid(index)
        os.kill(old, signal.SIGTERM)  # type: ignore[arg-type]
        host.restarted(index, old)
    elif kind == "pause-worker":
        pid = host.pid(index)
        held = rng.uniform(0.5, 4.0)
        os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
        time.sleep(held)
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
    fault.recovered = host.wait_settled(kind)
    return fault


def _gone(pids: list[int | None], timeout: float = 5.0) -> None:
    """The workers of a parent killed with -9 are gone (they die with it); a zombie
    waiting for its reaper counts as gone."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if p is not None and _running(p)]
        if not alive:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers {alive} outlived their parent")
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.host_soak", description=__doc__)
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=40.0, help="messages/s per publisher")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds: {', '.join(sorted(unknown))}")
    config = RunConfig(seed=args.seed, faults=args.faults, durable=True, queue_type="classic")
    base = Path(tempfile.mkdtemp(prefix="rookery-host-soak-"))
    host = Host(base, args.workers)
    recorder = Recorder()
    history = recorder.history
    queues = [f"host-soak-{i}" for i in range(args.queues)]
    ports = [host.port]
    publishers = [
        Publisher(f"p{i}", ports, 0, recorder, queues, rate=args.rate, durable=True, pad=64)
        for i in range(args.publishers)
    ]
    consumers = [
        Consumer(f"c{i}", ports, 0, recorder, queues[i % len(queues)], prefetch=32, rate=25.0)
        for i in range(args.consumers)
    ]
    clients: list[Client] = [*publishers, *consumers]
    rng = random.Random(args.seed)
    history.meta = {"config": vars(args), "servers": args.workers}
    try:
        host.broker.start()
        host.wait_settled("start")
        declare(ports, queues, "classic")
        for client in clients:
            client.start()
        time.sleep(2.0)
        for n in range(args.faults):
            kind = rng.choice(kinds)
            fault = apply(host, kind, rng, recorder)
            print(
                f"[{n + 1}/{args.faults}] {kind} [{fault.target}] ({fault.role}) "
                f"{fault.note} settled after {fault.recovered - fault.start:.1f}s",  # type: ignore[operator]
                flush=True,
            )
            time.sleep(rng.uniform(0.5, 2.0))
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
    finally:
        for client in clients:
            client.halt()
        for client in clients:
            if client.ident is not None:
                client.join(10)
        host.broker.stop(timeout=60)
    report = check(history)
    print(report.format())
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    print(f"logs: {host.broker.log_path}")
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
