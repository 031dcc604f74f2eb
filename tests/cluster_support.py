"""The loopback cluster behind tests/console_stack.py (the console's tests).

The cluster tests use tests/cluster_harness.py; this smaller class keeps the
interface the console stack and its tests were written against.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from brokerd.server.control import request
from tests.brokerd_process import BrokerProcess, free_port
from tests.cluster_harness import write_cluster_file
from tests.support.eventually import eventually

HEARTBEAT = {"interval": 0.3, "timeout": 1.0, "open_timeout": 8}


def cluster_file(
    path: Path,
    ports: list[int],
    *,
    secret: str = "cluster-secret-1",
    heartbeat: dict[str, float] | None = None,
) -> Path:
    hb = {**HEARTBEAT, **(heartbeat or {})}
    return write_cluster_file(
        path,
        ports,
        secret=secret,
        interval=hb["interval"],
        timeout=hb["timeout"],
        open_timeout=hb["open_timeout"],
    )


class Cluster:
    """``primaries`` known hosts plus ``secondaries``, started oldest first."""

    def __init__(
        self,
        root: Path,
        primaries: int = 3,
        secondaries: int = 1,
        heartbeat: dict[str, float] | None = None,
    ) -> None:
        self.root = root
        self.ports = [free_port() for _ in range(primaries + secondaries)]
        self.primaries = primaries
        self.file = cluster_file(root / "cluster.toml", self.ports[:primaries], heartbeat=heartbeat)
        self.servers: dict[int, BrokerProcess] = {}

    def start(
        self, index: int, *, extra: list[str] | None = None, file: Path | None = None
    ) -> BrokerProcess:
        args = ["--cluster", str(file or self.file), "--enable-fault-injection", *(extra or [])]
        if index >= self.primaries:
            args += ["--type", "secondary"]
        proc = BrokerProcess(self.root / f"n{index}", port=self.ports[index], extra_args=args)
        proc.start()
        self.servers[index] = proc
        return proc

    def status(self, index: int, timeout: float = 2.0) -> dict[str, Any]:
        reply = request(self.servers[index].data_dir, "status", timeout=timeout)
        assert reply["ok"], reply
        return reply["result"]

    def running(self) -> list[int]:
        return [i for i, p in self.servers.items() if p.alive()]

    def sample(self, indexes: list[int] | None = None) -> dict[int, dict[str, Any]]:
        """Every answering server's status (a stopped or dead one is skipped)."""
        out = {}
        for index in indexes if indexes is not None else self.running():
            try:
                out[index] = self.status(index, timeout=0.5)
            except (OSError, AssertionError, ValueError):
                continue
        return out

    def agreed_root(self, indexes: list[int] | None = None) -> str | None:
        views = self.sample(indexes)
        wanted = indexes if indexes is not None else self.running()
        roots = {v["root"] for v in views.values()}
        if (
            len(views) == len(wanted)
            and len(roots) == 1
            and all(v["ready"] for v in views.values())
        ):
            return roots.pop()
        return None

    def wait(self, predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
        return eventually(
            predicate,
            timeout,
            "condition",
            tolerate=(OSError, AssertionError, KeyError, ValueError),
            explain=lambda: f"views: {self.sample()}",
        )

    def stop(self) -> None:
        for proc in self.servers.values():
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGCONT)
            proc.stop()
