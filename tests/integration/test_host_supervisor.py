"""The supervising parent of ``brokerd --workers N`` (brokerd.host.supervisor) with
real processes: a Supervisor runs in a child Python, its workers are
tests/support/sleeper_worker.py, which write their pid and the signals they get
to files. Every test kills what it started, even when it fails, and prints the
supervisor's log (the workers write to it too) when it does.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from tests.brokerd_process import log_tail
from tests.support.eventually import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

ROOT = Path(__file__).resolve().parents[2]
SLEEPER = ROOT / "tests" / "support" / "sleeper_worker.py"

#: the child that runs the supervisor: its spec (argv of each worker, state file,
#: timings, the starts after which ``command`` raises) comes as JSON on argv
RUNNER = """\
import json, logging, sys
from pathlib import Path
from brokerd.host.supervisor import Supervisor

spec = json.loads(sys.argv[1])
logging.basicConfig(
    level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
)
argvs = spec["argvs"]
starts = []

def command(k):
    starts.append(k)
    if len(starts) > spec["most_starts"]:
        raise RuntimeError("the test's command fails at this start")
    return argvs[k]

supervisor = Supervisor(len(argvs), command, state_file=Path(spec["state"]), **spec["timings"])
sys.exit(supervisor.run())
"""


def gone(pid: int) -> bool:
    """The process is dead; a zombie counts as dead, since whoever reaps an orphan
    (init, or a subreaper) may take its time."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return text.rsplit(")", 1)[1].split()[0] == "Z"


class Host:
    """One supervisor child and its sleeper workers, all under ``base``."""

    def __init__(
        self,
        base: Path,
        flags: list[list[str]],
        executable: str,
        most_starts: int,
        timings: dict[str, float],
    ) -> None:
        self.base = base
        base.mkdir()
        self.state_file = base / "state.json"
        self.log_path = base / "supervisor.log"
        argvs = [
            [
                executable,
                str(SLEEPER),
                "--pid-file",
                str(self.pid_file(k)),
                "--signal-log",
                str(self.signal_log(k)),
                *extra,
            ]
            for k, extra in enumerate(flags)
        ]
        spec = {
            "argvs": argvs,
            "state": str(self.state_file),
            "timings": timings,
            "most_starts": most_starts,
        }
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", RUNNER, json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=dict(os.environ, PYTHONUNBUFFERED="1"),
            )
        self.seen: set[int] = set()

    def pid_file(self, k: int) -> Path:
        return self.base / f"worker-{k}.pid"

    def signal_log(self, k: int) -> Path:
        return self.base / f"worker-{k}.signals"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def explain(self) -> str:
        return f"supervisor log:\n{log_tail(self.log_path, 60)}"

    def pid(self, k: int) -> int | None:
        """Worker k's pid as it last wrote it, if that process is alive."""
        try:
            pid = int(self.pid_file(k).read_text())
        except FileNotFoundError:
            return None
        self.seen.add(pid)
        return None if gone(pid) else pid

    def wait_pids(self, count: int, timeout: float = 5.0) -> list[int]:
        return eventually(
            lambda: (pids := [self.pid(k) for k in range(count)]) and all(pids) and pids,
            timeout,
            f"{count} live worker pids",
            explain=self.explain,
            each=self.check_alive,
        )

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())

    def signals(self, k: int) -> list[str]:
        try:
            return self.signal_log(k).read_text().splitlines()
        except FileNotFoundError:
            return []

    def check_alive(self) -> None:
        assert self.proc.poll() is None, (
            f"the supervisor exited with {self.proc.returncode}\n{self.explain()}"
        )

    def close(self) -> None:
        """Kill the supervisor (its workers die with it) and any sleeper of ours
        still alive; our own child is reaped."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)
        for pid in self.seen:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if str(self.base).encode() in cmdline and not gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


#: starts of workers without limit, for ``most_starts``
UNLIMITED = 1_000_000


class MakeHost(Protocol):
    def __call__(
        self,
        *flags: list[str],
        executable: str = sys.executable,
        most_starts: int = UNLIMITED,
        **timings: float,
    ) -> Host: ...


@pytest.fixture
def make_host(tmp_path: Path) -> Iterator[MakeHost]:
    """Supervisors with one worker per flag list (``make_host([], ["--crash"])``), the
    workers' interpreter ``executable``, ``command`` raising after ``most_starts``
    starts, and the given timing keywords. All are killed at the end and their logs
    printed (pytest shows a test's output only when it fails)."""
    hosts: list[Host] = []

    def factory(
        *flags: list[str],
        executable: str = sys.executable,
        most_starts: int = UNLIMITED,
        **timings: float,
    ) -> Host:
        base = tmp_path / f"host-{len(hosts)}"
        host = Host(base, list(flags), executable, most_starts, timings)
        hosts.append(host)
        return host

    try:
        yield factory
    finally:
        for host in hosts:
            host.close()
            print(f"--- {host.base.name}: {host.explain()}")


def test_every_worker_starts(make_host: MakeHost) -> None:
    host = make_host([], [])
    pids = host.wait_pids(2)
    assert len(set(pids)) == 2
    state = eventually(
        lambda: [w["pid"] for w in host.state()["workers"]] == pids and host.state(),
        5,
        "the state file naming both workers",
        tolerate=(FileNotFoundError,),
        explain=host.explain,
    )
    assert state["pid"] == host.proc.pid
    assert not state["stopping"]
    for k, worker in enumerate(state["workers"]):
        assert worker["index"] == k
        assert worker["state"] == "running"
        assert worker["restarts"] == 0 and worker["quick_exits"] == 0
        assert worker["crash_looping"] is False and worker["last_exit"] is None
        assert worker["started"] >= state["started"] and worker["next_start"] is None
    assert stat.S_IMODE(host.state_file.stat().st_mode) == 0o600
    for pid in pids:
        # the parent waits with every signal blocked; its workers must not inherit that
        blocked = re.search(
            r"^SigBlk:\s*([0-9a-f]+)$", Path(f"/proc/{pid}/status").read_text(), re.M
        )
        assert blocked is not None and int(blocked[1], 16) == 0, f"worker {pid} blocks signals"
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(
            host.proc.pid
        )


def test_a_killed_worker_is_restarted_within_two_seconds(make_host: MakeHost) -> None:
    host = make_host([], [])
    first, other = host.wait_pids(2)
    killed = time.monotonic()
    os.kill(first, signal.SIGKILL)
    new = eventually(
        lambda: host.pid(0) not in (None, first) and host.pid(0),
        2.0,
        "a new worker 0",
        interval=0.02,
        explain=host.explain,
    )
    took = time.monotonic() - killed
    assert new != first and host.pid(1) == other, f"took {took:.2f}s"
    worker = eventually(
        lambda: (w := host.state()["workers"][0])["pid"] == new and w,
        2,
        "the state file naming the new worker 0",
        explain=host.explain,
    )
    assert worker["state"] == "running"
    assert worker["restarts"] == 1 and worker["quick_exits"] == 1
    assert worker["last_exit"] == "killed by SIGKILL"
    assert worker["crash_looping"] is False
    assert host.state()["workers"][1]["restarts"] == 0
    assert f"worker 0 pid {first} exited (killed by SIGKILL); restarting in 0.5 s" in (
        host.log_text()
    )


def test_reload_and_dump_signals_reach_every_worker(make_host: MakeHost) -> None:
    host = make_host([], [])
    pids = host.wait_pids(2)
    for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        host.proc.send_signal(sig)
    expected = [
        sorted(f"{name} {pid}" for name in ("SIGHUP", "SIGUSR1", "SIGUSR2")) for pid in pids
    ]
    eventually(
        lambda: [sorted(host.signals(k)) for k in range(2)] == expected,
        5,
        "every signal logged by every worker",
        explain=lambda: f"{[host.signals(k) for k in range(2)]}\n{host.explain()}",
    )
    assert [host.pid(k) for k in range(2)] == pids, "a worker died of a forwarded signal"
    host.check_alive()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_planned_stop_stops_every_worker_and_the_parent_exits_0(
    make_host: MakeHost, stop: signal.Signals
) -> None:
    host = make_host([], [])
    pids = host.wait_pids(2)
    host.proc.send_signal(stop)
    assert host.proc.wait(timeout=10) == 0, host.explain()
    for k, pid in enumerate(pids):
        assert f"SIGTERM {pid}" in host.signals(k)
        assert gone(pid), f"worker {k} pid {pid} outlived the supervisor"
    text = host.log_text()
    assert f"{stop.name}: stopping 2 workers (SIGTERM)" in text
    assert "all workers stopped" in text
    state = host.state()
    assert state["stopping"] is True
    for worker in state["workers"]:
        assert worker["state"] == "stopped" and worker["pid"] is None
        assert worker["last_exit"] == "exited (status 0)"
        assert worker["restarts"] == 0


def test_workers_die_with_a_killed_parent(make_host: MakeHost) -> None:
    host = make_host([], [])
    pids = host.wait_pids(2)
    host.proc.kill()
    host.proc.wait(timeout=5)
    eventually(
        lambda: all(gone(pid) for pid in pids),
        2.0,
        "every worker gone after kill -9 of the parent",
        interval=0.02,
        explain=host.explain,
    )


def test_a_crashing_worker_backs_off_and_is_reported(make_host: MakeHost) -> None:
    host = make_host(["--crash"], restart_delay=0.05, stable_after=5.0, max_backoff=10.0)
    worker = eventually(
        lambda: (w := host.state()["workers"][0])["quick_exits"] >= 3 and w,
        5,
        "three quick exits",
        tolerate=(FileNotFoundError,),
        explain=host.explain,
        each=host.check_alive,
    )
    assert worker["crash_looping"] is True
    assert worker["last_exit"] == "exited (status 3)"
    assert worker["restarts"] >= 2
    text = host.log_text()
    delays = [float(d) for d in re.findall(r"\(status 3\); restarting in ([0-9.]+) s", text)]
    assert delays[:3] == [0.05, 0.1, 0.2], text
    assert "ERROR brokerd.host: worker 0 is crash-looping: 3 quick exits in a row," in text
    assert "next start in 0.2 s" in text
    # a planned stop while it waits for its next start ends it there
    host.proc.send_signal(signal.SIGTERM)
    assert host.proc.wait(timeout=5) == 0, host.explain()
    last = host.state()["workers"][0]
    assert last["state"] == "stopped" and last["next_start"] is None
    assert last["crash_looping"] is True


def test_a_worker_that_cannot_start_counts_as_a_quick_crash(make_host: MakeHost) -> None:
    host = make_host([], executable=str(ROOT / "no-such-python"), restart_delay=0.02)
    worker = eventually(
        lambda: (w := host.state()["workers"][0])["crash_looping"] and w,
        5,
        "an unstartable worker reported as crash-looping",
        tolerate=(FileNotFoundError,),
        explain=host.explain,
        each=host.check_alive,
    )
    assert worker["pid"] is None and worker["quick_exits"] >= 3
    assert worker["last_exit"].startswith("could not start: [Errno 2]"), worker
    assert "ERROR brokerd.host: worker 0 could not start:" in host.log_text()


def test_a_stable_run_ends_the_crash_loop(make_host: MakeHost) -> None:
    host = make_host([], restart_delay=0.02, stable_after=2.0)
    for _ in range(3):
        pid = host.wait_pids(1)[0]
        os.kill(pid, signal.SIGKILL)
        eventually(lambda pid=pid: host.pid(0) not in (None, pid), 2, "a new worker 0")
    looping = host.state()["workers"][0]
    assert looping["crash_looping"] is True and looping["quick_exits"] == 3
    worker = eventually(
        lambda: not (w := host.state()["workers"][0])["crash_looping"] and w,
        5,
        "the crash loop cleared by a run longer than stable_after",
        explain=host.explain,
    )
    assert worker["quick_exits"] == 0 and worker["state"] == "running"
    assert worker["pid"] == host.pid(0)
    assert "worker 0 has run 2 s: no longer crash-looping" in host.log_text()


def test_a_worker_deaf_to_sigterm_is_killed_after_the_grace(make_host: MakeHost) -> None:
    host = make_host([], ["--ignore-sigterm"], stop_grace=1.5, stable_after=0.3)
    first = host.wait_pids(2)[1]
    # the deaf worker crashes quickly once, and the stop comes before its new run is
    # stable: its stability deadline passes during the grace, where the loop must not spin
    os.kill(first, signal.SIGKILL)
    deaf = eventually(lambda: host.pid(1) not in (None, first) and host.pid(1), 2, "worker 1")
    stopped = time.monotonic()
    host.proc.send_signal(signal.SIGTERM)
    # the parent's CPU time (its workers' start-ups included): about 0.15 s; a loop
    # spinning through the grace would add a second
    _, status, usage = os.wait4(host.proc.pid, 0)
    host.proc.returncode = os.waitstatus_to_exitcode(status)
    assert host.proc.returncode == 0, host.explain()
    assert 1.4 < time.monotonic() - stopped < 5, host.explain()
    assert usage.ru_utime + usage.ru_stime < 0.6, f"the parent spun: {usage}\n{host.explain()}"
    assert f"SIGTERM {deaf}" in host.signals(1)
    assert gone(deaf)
    assert "1 workers still running after 1.5 s" in host.log_text()
    assert [w["last_exit"] for w in host.state()["workers"]] == [
        "exited (status 0)",
        "killed by SIGKILL",
    ]


def test_a_failing_supervisor_kills_its_workers_first(make_host: MakeHost) -> None:
    host = make_host([], [], most_starts=2, restart_delay=0.02)
    first, other = host.wait_pids(2)
    os.kill(first, signal.SIGKILL)  # its restart calls command(0), which raises
    assert host.proc.wait(timeout=5) == 1, host.explain()
    assert gone(other)
    text = host.log_text()
    assert "supervisor failed: killing 1 workers" in text
    assert "RuntimeError: the test's command fails at this start" in text
    # reaped by the supervisor itself, before the error went on
    worker = host.state()["workers"][1]
    assert worker["last_exit"] == "killed by SIGKILL" and worker["pid"] is None
