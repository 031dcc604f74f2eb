"""Start and stop real brokerd processes for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from brokerd.bench import ports


def _worker_slice() -> tuple[int, int]:
    """This process's share of the ports below the ephemeral range: one slice per
    xdist worker, so two workers never hand out the same port."""
    low, high = ports.LOWEST_PORT, ports.ephemeral_low()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    width = (high - low) // max(count, 1)
    return low + index * width, low + (index + 1) * width


def free_port() -> int:
    """A loopback port for a server the test starts: below the ephemeral range,
    where no outgoing connection can take it first (``brokerd.bench.ports``), from
    this worker's slice, and none twice in one process."""
    low, high = _worker_slice()
    return ports.free_port(low, high)


def process_running(pid: int) -> bool:
    """The process runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def log_tail(path: Path | None, lines: int = 40) -> str:
    """The last ``lines`` of a process's log, for a failure message."""
    if path is None or not path.exists():
        return "(no log)"
    tail = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(tail) or "(empty log)"


def wait_for_port(
    port: int,
    timeout: float = 15.0,
    proc: subprocess.Popen | None = None,
    log_path: Path | None = None,
    host: str = "127.0.0.1",
) -> None:
    """Wait until something listens on ``port``; if ``proc`` dies first (or nothing
    listens in time) the error carries the tail of ``log_path``, so CI shows why."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"process exited with {proc.returncode} before listening on {port}; "
                f"its log ({log_path}) ends:\n{log_tail(log_path)}"
            )
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(
        f"nothing listening on port {port} after {timeout}s; "
        f"its log ({log_path}) ends:\n{log_tail(log_path)}"
    )


def wait_workers_ready(data_dir: Path, workers: int, timeout: float = 30.0) -> None:
    """``brokerd --workers N``: wait until every worker answers its control socket
    and follows the host's local root (nothing to wait for with one worker)."""
    from brokerd.server.control import request

    if workers <= 1:
        return
    deadline = time.monotonic() + timeout
    waiting = list(range(workers))
    while waiting:
        try:
            reply = request(data_dir / f"worker-{waiting[0]}", "status", timeout=0.5)
            if reply.get("ok") and reply["result"].get("ready"):
                waiting.pop(0)
                continue
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers {waiting} of {data_dir} not ready after {timeout}s")
        time.sleep(0.1)


@dataclass
class BrokerProcess:
    """A brokerd subprocess on a free loopback port, logging to a file."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    #: the address it binds and is reached at (a network namespace's, on a test bed)
    host: str = "127.0.0.1"
    #: runs the command elsewhere (``NetBed.wrap``: in its namespace); None: here
    wrap: Callable[[list[str]], list[str]] | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "brokerd.log"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    def start(self) -> BrokerProcess:
        """Spawn and wait until the AMQP port listens."""
        self.spawn()
        self.wait_listening()
        return self

    def spawn(self) -> BrokerProcess:
        """Only start the process (``wait_listening`` waits for it): several brokers
        spawned first and awaited after start in parallel."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        cmd = [
            sys.executable,
            "-m",
            "brokerd",
            "--bind",
            self.host,
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--log-level",
            "info",
            *self.extra_args,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.wrap is not None:
            cmd = self.wrap(cmd)
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        return self

    def wait_listening(self, timeout: float = 15.0) -> None:
        wait_for_port(self.port, timeout, proc=self.proc, log_path=self.log_path, host=self.host)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode
