"""A loopback cluster of real brokerd processes, for the membership tests.

    cluster = Cluster(tmp_path, primaries=3, secondaries=2)
    try:
        cluster.start_all()                   # oldest first, staggered: seniority is defined
        root = cluster.wait_until(cluster.agreed_root)
        cluster.kill(0)                       # SIGKILL; pause()/resume() are SIGSTOP/SIGCONT
    finally:
        cluster.close()                       # SIGCONT the paused ones, then stop everything

Every server gets the same cluster file (``Cluster.file``) unless a test
passes another one to ``start``. Statuses are read over each server's
control socket with a short timeout, so a stopped or dead server is simply
missing from a sample. ``Sampler`` polls every answering server in the
background and records each sample, so a test can check a safety property
(never two roots with quorum) over the whole run, not just at the end.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokerd.server.control import request
from tests.brokerd_process import BrokerProcess, free_port

INTERVAL = 0.3
TIMEOUT = 1.0
OPEN_TIMEOUT = 5.0
SECRET = "cluster-secret-123"

View = dict[str, Any]


def write_cluster_file(
    path: Path,
    ports: Iterable[int | str],
    *,
    secret: str = SECRET,
    name: str = "test",
    interval: float = INTERVAL,
    timeout: float = TIMEOUT,
    open_timeout: float = OPEN_TIMEOUT,
) -> Path:
    """The shared TOML file; ``ports`` may also hold whole ``host:port`` strings."""
    hosts = ", ".join(f'"{p}"' if isinstance(p, str) else f'"127.0.0.1:{p}"' for p in ports)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'name = "{name}"\n'
        f'secret = "{secret}"\n'
        f"known_hosts = [{hosts}]\n"
        "[heartbeat]\n"
        f"interval = {interval}\n"
        f"timeout = {timeout}\n"
        f"open_timeout = {open_timeout}\n"
    )
    return path


@dataclass
class Node:
    index: int
    kind: str
    port: int
    process: BrokerProcess | None = None
    spid: str | None = None
    paused: bool = False

    @property
    def data_dir(self) -> Path:
        assert self.process is not None
        return self.process.data_dir

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def answering(self) -> bool:
        return self.alive() and not self.paused


def brief(view: View) -> str:
    """One line per view, for failure messages."""
    root = (view.get("root") or "-")[-9:]
    return (
        f"{view.get('type', '?')[0]}:{str(view.get('spid', '?'))[-9:]} root={root} "
        f"is_root={view.get('is_root')} quorum={view.get('quorum')} ready={view.get('ready')} "
        f"vote={(view.get('vote') or '-')[-9:]} reason={view.get('reason')!r} "
        f"active={sum(bool(p.get('active')) for p in view.get('peers', []))}"
    )


def roots_with_quorum(views: dict[int, View]) -> list[int]:
    """Indexes of the sampled servers that believe they are root and have quorum."""
    return sorted(i for i, v in views.items() if v.get("is_root") and v.get("quorum"))


class Cluster:
    """``primaries`` known hosts (indexes 0..primaries-1) and ``secondaries`` after them."""

    def __init__(
        self,
        base: Path,
        primaries: int = 3,
        secondaries: int = 0,
        *,
        interval: float = INTERVAL,
        timeout: float = TIMEOUT,
        open_timeout: float = OPEN_TIMEOUT,
        secret: str = SECRET,
        fault_injection: bool = True,
    ) -> None:
        self.base = base
        self.base.mkdir(parents=True, exist_ok=True)
        self.interval = interval
        self.timeout = timeout
        self.fault_injection = fault_injection
        self.nodes = [
            Node(i, "primary" if i < primaries else "secondary", free_port())
            for i in range(primaries + secondaries)
        ]
        self.primary_ports = [n.port for n in self.nodes[:primaries]]
        self.file = write_cluster_file(
            base / "cluster.toml",
            self.primary_ports,
            secret=secret,
            interval=interval,
            timeout=timeout,
            open_timeout=open_timeout,
        )

    # -- processes ---------------------------------------------------------------

    def add_secondary(self) -> int:
        """Room for one more secondary (not in known_hosts); returns its index."""
        self.nodes.append(Node(len(self.nodes), "secondary", free_port()))
        return len(self.nodes) - 1

    def start(
        self, index: int, *, file: Path | None = None, extra: list[str] | None = None
    ) -> Node:
        """Start one server and wait until its control socket answers (its spid is known)."""
        node = self.nodes[index]
        args = ["--cluster", str(file or self.file), "--type", node.kind]
        if self.fault_injection:
            args.append("--enable-fault-injection")
        node.process = BrokerProcess(
            self.base / f"n{index}", port=node.port, extra_args=[*args, *(extra or [])]
        )
        node.paused = False
        node.process.start()
        view = self.wait_until(lambda: self.status(index), timeout=10, what=f"status of {index}")
        node.spid = view["spid"]
        return node

    def start_all(self, indexes: Iterable[int] | None = None, stagger: float = 0.15) -> None:
        """Start servers in order, oldest first: seniority follows the index."""
        for index in indexes if indexes is not None else range(len(self.nodes)):
            self.start(index)
            time.sleep(stagger)

    def kill(self, index: int) -> float:
        """SIGKILL; returns the monotonic time of the kill."""
        node = self.nodes[index]
        assert node.process is not None and node.process.proc is not None
        node.process.proc.kill()
        killed = time.monotonic()
        node.process.proc.wait(5)
        node.paused = False
        return killed

    def pause(self, index: int) -> float:
        node = self.nodes[index]
        assert node.process is not None
        node.paused = True  # before the signal: samplers must skip it from now on
        node.process.signal(signal.SIGSTOP)
        return time.monotonic()

    def resume(self, index: int) -> float:
        node = self.nodes[index]
        assert node.process is not None
        node.process.signal(signal.SIGCONT)
        node.paused = False
        return time.monotonic()

    def stop(self, index: int) -> int | None:
        node = self.nodes[index]
        if node.process is None:
            return None
        if node.paused and node.alive():
            node.process.signal(signal.SIGCONT)
            node.paused = False
        return node.process.stop()

    def close(self) -> None:
        """Resume every paused server, then stop them all (never raises)."""
        for node in self.nodes:
            if node.process is not None and node.alive():
                try:
                    node.process.signal(signal.SIGCONT)
                except (OSError, AssertionError):
                    pass
            node.paused = False
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.stop(timeout=5)
                except Exception:  # noqa: BLE001 - keep stopping the others
                    if node.process.proc is not None:
                        node.process.proc.kill()

    # -- views -------------------------------------------------------------------

    def status(self, index: int, timeout: float = 0.5) -> View | None:
        """One server's ctl status, or None if it does not answer in time."""
        node = self.nodes[index]
        if not node.answering():
            return None
        try:
            reply = request(node.data_dir, "status", timeout=timeout)
        except (OSError, ValueError):
            return None
        return reply["result"] if reply.get("ok") else None

    def ctl(self, index: int, command: str, *args: str) -> dict[str, Any]:
        reply = request(self.nodes[index].data_dir, command, list(args), timeout=5)
        assert reply.get("ok"), f"ctl {command} {args} on {index}: {reply}"
        return reply["result"]

    def running(self) -> list[int]:
        return [n.index for n in self.nodes if n.alive()]

    def sample(self, indexes: Iterable[int] | None = None, timeout: float = 0.3) -> dict[int, View]:
        """Every answering server's view (paused, dead and silent ones are left out)."""
        out = {}
        for index in indexes if indexes is not None else self.running():
            view = self.status(index, timeout=timeout)
            if view is not None:
                out[index] = view
        return out

    def agreed_root(self, indexes: Iterable[int] | None = None) -> str | None:
        """The root every listed server (default: every running one) reports, all ready."""
        wanted = list(indexes) if indexes is not None else self.running()
        views = self.sample(wanted)
        if len(views) != len(wanted) or not views:
            return None
        roots = {v["root"] for v in views.values()}
        if len(roots) == 1 and all(v["ready"] for v in views.values()):
            return roots.pop()
        return None

    def spid(self, index: int) -> str:
        spid = self.nodes[index].spid
        assert spid is not None
        return spid

    def index_of(self, spid: str | None) -> int | None:
        return next((n.index for n in self.nodes if n.spid == spid), None)

    def describe(self) -> str:
        lines = []
        for index, view in self.sample().items():
            lines.append(f"  [{index}] {brief(view)}")
        for node in self.nodes:
            if node.process is None:
                continue
            tail = [
                line
                for line in node.process.log_text().splitlines()
                if " WARNING " in line or " ERROR " in line
            ][-6:]
            lines.append(f"  [{node.index}] log: " + "\n      ".join(tail))
        return "\n".join(lines)

    def wait_until(
        self,
        predicate: Callable[[], Any],
        timeout: float = 15.0,
        interval: float = 0.05,
        what: str = "condition",
    ) -> Any:
        """Poll until ``predicate()`` is truthy and return its value; fail with the views."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = predicate()
            except (OSError, KeyError, ValueError):
                value = None
            if value:
                return value
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what}: not within {timeout}s\n{self.describe()}")
            time.sleep(interval)


@dataclass
class Sample:
    at: float
    views: dict[int, View]


@dataclass
class Sampler:
    """Samples every answering server about every ``period`` seconds in a thread.

    Use as a context manager; afterwards ``samples`` holds every sample and
    ``double_roots`` every sample in which two servers had is_root and quorum.
    """

    cluster: Cluster
    period: float = 0.1
    indexes: list[int] | None = None
    samples: list[Sample] = field(default_factory=list)
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._halt.is_set():
            started = time.monotonic()
            indexes = self.indexes if self.indexes is not None else self.cluster.running()
            views = self.cluster.sample([i for i in indexes if self.cluster.nodes[i].answering()])
            self.samples.append(Sample(started, views))
            self._halt.wait(max(0.0, self.period - (time.monotonic() - started)))

    @property
    def double_roots(self) -> list[tuple[float, dict[int, str]]]:
        return [
            (s.at, {i: brief(s.views[i]) for i in roots})
            for s in self.samples
            if len(roots := roots_with_quorum(s.views)) > 1
        ]

    def since(self, moment: float) -> list[Sample]:
        return [s for s in self.samples if s.at >= moment]
