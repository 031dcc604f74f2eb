"""``--workers``: the option's parsing and the SO_REUSEPORT check
(brokerd.host.workers), and the supervisor's arithmetic that needs no process:
the restart backoff, the words for an exit, the state before ``run()``."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from pathlib import Path

import pytest

from brokerd.host.supervisor import (
    MAX_BACKOFF,
    RESTART_DELAY,
    Supervisor,
    backoff_delay,
    exit_detail,
)
from brokerd.host.workers import (
    MAX_WORKERS,
    available_cpus,
    cgroup_cpu_quota,
    parse_workers,
    reuseport_problem,
)


@pytest.mark.parametrize(("value", "count"), [("1", 1), ("2", 2), ("256", 256), ("007", 7)])
def test_a_count_is_taken(value: str, count: int) -> None:
    assert parse_workers(value) == count


def test_auto_is_one_per_core() -> None:
    assert parse_workers("auto", cpu_count=8) == 8
    assert parse_workers("auto", cpu_count=0) == 1
    assert parse_workers("auto", cpu_count=1000) == MAX_WORKERS
    assert 1 <= parse_workers("auto") <= max(os.cpu_count() or 1, 1)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "--workers 0: need at least 1 worker"),
        ("000", "--workers 000: need at least 1 worker"),
        ("-1", "--workers -1: not a number (a count 1..256, or auto)"),
        ("257", "--workers 257: at most 256 workers"),
        ("99999999999999999999", "--workers 99999999999999999999: at most 256 workers"),
        ("abc", "--workers abc: not a number (a count 1..256, or auto)"),
        ("", "--workers '': not a number (a count 1..256, or auto)"),
        (" 2", "--workers ' 2': not a number (a count 1..256, or auto)"),
        ("+2", "--workers +2: not a number (a count 1..256, or auto)"),
        ("2.0", "--workers 2.0: not a number (a count 1..256, or auto)"),
        ("0x2", "--workers 0x2: not a number (a count 1..256, or auto)"),
        ("١٢", "--workers ١٢: not a number (a count 1..256, or auto)"),
        ("AUTO", "--workers AUTO: not a number (a count 1..256, or auto)"),
    ],
)
def test_anything_else_is_refused_with_the_reason(value: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        parse_workers(value)
    assert str(refused.value) == message


def test_argparse_reports_the_refusal() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--workers", type=parse_workers)
    assert parser.parse_args(["--workers", "3"]).workers == 3
    with pytest.raises(argparse.ArgumentError, match="at most 256 workers"):
        parser.parse_args(["--workers", "300"])


@pytest.mark.parametrize(
    ("membership", "files", "cores"),
    [
        ("0::/box\n", {"box/cpu.max": "250000 100000\n"}, 3),  # docker --cpus 2.5
        ("0::/box\n", {"box/cpu.max": "max 100000\n"}, None),
        ("0::/\n", {"cpu.max": "50000 100000\n"}, 1),  # half a core: one worker
        (
            "4:cpu,cpuacct:/k8s/pod\n0::/\n",
            {
                "cpu,cpuacct/k8s/pod/cpu.cfs_quota_us": "200000",
                "cpu,cpuacct/k8s/pod/cpu.cfs_period_us": "100000",
            },
            2,
        ),
        (
            "4:cpu,cpuacct:/\n",
            {
                "cpu,cpuacct/cpu.cfs_quota_us": "-1",
                "cpu,cpuacct/cpu.cfs_period_us": "100000",
            },
            None,
        ),
        ("0::/box\n", {"box/cpu.max": "garbage"}, None),
        ("0::/gone\n", {}, None),
    ],
)
def test_auto_heeds_a_cgroup_cpu_limit(
    tmp_path: Path, membership: str, files: dict[str, str], cores: int | None
) -> None:
    """``--workers auto`` in a container limited to 2.5 CPUs runs 3 workers, not one
    per core of the machine (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``)."""
    (tmp_path / "self").write_text(membership)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path / "fs", tmp_path / "self") == cores
    assert available_cpus() >= 1


def test_this_linux_machine_has_so_reuseport() -> None:
    assert reuseport_problem() is None


def test_a_platform_without_so_reuseport_is_told_to_run_one_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(socket, "SO_REUSEPORT")
    problem = reuseport_problem()
    assert problem is not None
    assert "SO_REUSEPORT" in problem and "(--workers 1)" in problem


def test_quick_exits_in_a_row_double_the_delay_up_to_the_cap() -> None:
    delays = [backoff_delay(n) for n in range(9)]
    assert delays == [RESTART_DELAY, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, MAX_BACKOFF, MAX_BACKOFF]
    assert backoff_delay(10_000) == MAX_BACKOFF
    assert backoff_delay(3, base=0.05, most=0.15) == 0.15


def test_an_exit_is_described_by_its_status_or_signal() -> None:
    assert exit_detail(3 << 8) == ("status 3", "exited (status 3)")
    assert exit_detail(0) == ("status 0", "exited (status 0)")
    assert exit_detail(signal.SIGKILL) == ("killed by SIGKILL", "killed by SIGKILL")
    assert exit_detail(None) == ("status unknown", "exited (status unknown)")


def test_before_it_runs_every_slot_is_stopped() -> None:
    supervisor = Supervisor(2, lambda k: ["true"])
    state = supervisor.describe()
    assert state["pid"] == os.getpid() and state["started"] is None
    assert state["stopping"] is False
    assert [w["index"] for w in state["workers"]] == [0, 1]
    assert state["workers"][0] == {
        "index": 0,
        "pid": None,
        "state": "stopped",
        "started": None,
        "restarts": 0,
        "quick_exits": 0,
        "crash_looping": False,
        "last_exit": None,
        "next_start": None,
    }


def test_a_supervisor_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="at least 1 worker"):
        Supervisor(0, lambda k: ["true"])


def test_a_data_directory_is_refused_to_a_count_that_would_leave_state_behind(
    tmp_path: Path,
) -> None:
    from brokerd.host.local import state_problem

    assert state_problem(tmp_path, 1) is None and state_problem(tmp_path, 4) is None
    (tmp_path / "store").mkdir()
    assert state_problem(tmp_path, 1) is None
    assert "start it with --workers 1" in (state_problem(tmp_path, 2) or "")
    (tmp_path / "store").rmdir()
    for k in range(3):
        (tmp_path / f"worker-{k}" / "store").mkdir(parents=True)
    assert state_problem(tmp_path, 3) is None and state_problem(tmp_path, 4) is None
    assert "--workers 3" in (state_problem(tmp_path, 1) or "")
    assert "worker-2 holds a worker's state" in (state_problem(tmp_path, 2) or "")


def test_a_data_directory_too_deep_for_any_workers_socket_is_refused(tmp_path: Path) -> None:
    """The hand-over socket's name is the longest of a worker's (``worker-K.handoff``):
    a directory that leaves room for the link socket but not for it is refused at
    start with the path, not left to crash-loop its workers."""
    from brokerd.host.local import MAX_SOCKET_PATH, HostLayout, HostSetupError, prepare

    base = tmp_path / "d"
    # deep enough that "host/worker-0.sock" fits and "host/worker-0.handoff" does not
    room = MAX_SOCKET_PATH - len(str(base)) - len("/host/worker-0.sock")
    deep = base / ("x" * (room - 2))
    assert len(str(deep / "host" / "worker-0.sock").encode()) <= MAX_SOCKET_PATH
    with pytest.raises(HostSetupError, match=r"hand-over socket .*worker-0\.handoff"):
        prepare(HostLayout(deep, 2))
