"""deploy/quickstart_supervisor.py with small Python processes: restarts with backoff,
readiness after a restart, the crash-loop give-up, and stopping without restarts.

Those tests start processes, hence ``PROCESSES`` (the ``integration`` marker, which
``make test-fast`` leaves out); each takes a second or two."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import os
import re
import signal
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(30)
PROCESSES = pytest.mark.integration


def _load() -> ModuleType:
    # test_quickstart_config.py may have loaded it already (through deploy/quickstart.py)
    if "quickstart_supervisor" in sys.modules:
        return sys.modules["quickstart_supervisor"]
    path = REPO / "deploy/quickstart_supervisor.py"
    spec = importlib.util.spec_from_file_location("quickstart_supervisor", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["quickstart_supervisor"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


sup = _load()

READY = re.compile(r"^ready$")
#: prints "ready" and stays up
STEADY = "import time; print('ready', flush=True); time.sleep(60)"
FAST = sup.RestartPolicy(first_delay=0.05, max_delay=0.2, stable_after=60, max_exits=4, window=30)


def service(name: str, code: str, **kwargs: object):
    return sup.Service(name, [sys.executable, "-c", code], dict(os.environ), **kwargs)


def supervisor(policy, **kwargs: object) -> tuple[object, io.StringIO]:
    out = io.StringIO()
    return sup.Supervisor(sup.Output(out, ("steady", "flaky")), policy, **kwargs), out


async def until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_backoff_doubles_up_to_its_cap_and_exits_are_described() -> None:
    policy = sup.RestartPolicy()
    assert [policy.delay(n) for n in range(6)] == [1, 2, 4, 8, 10, 10]
    assert policy.delay(10_000) == 10  # no overflow after a long flapping run
    assert sup.describe_exit(3) == "status 3"
    assert sup.describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert sup.describe_exit(-200) == "killed by signal 200"


@PROCESSES
async def test_a_crash_loop_gives_up_with_its_last_lines_and_the_others_keep_running() -> None:
    s, out = supervisor(FAST)
    steady = service("steady", STEADY, ready_line=READY)
    flaky = service(
        "flaky",
        "import sys; print('ready', flush=True); print('boom', flush=True); sys.exit(3)",
        ready_line=READY,
    )
    try:
        await s.start(steady)
        pid = steady.proc.pid
        await s.start(flaky)
        await asyncio.wait_for(s.shutdown.wait(), 10)
        assert steady.proc.pid == pid and steady.proc.returncode is None
    finally:
        await s.stop_all()
    text = out.getvalue()
    assert s.failure == "flaky crashed 4 times in 30 s: giving up"
    for n, delay in ((1, 0.05), (2, 0.1), (3, 0.2)):
        assert f"flaky exited (status 3); restarting in {delay:g} s (restart {n})" in text
        assert f"flaky is ready again (restart {n})" in text
    assert "(restart 4)" not in text
    assert re.search(
        r"giving up; its last lines:\n(rookery \|     .*\n)*rookery \|     boom\n", text
    )
    assert steady.restarts == 0 and "steady stopped (status -15)" in text


@PROCESSES
async def test_the_signal_is_named_and_a_stable_run_resets_the_backoff() -> None:
    policy = sup.RestartPolicy(first_delay=0.05, stable_after=0.2, max_exits=3, window=30)
    s, out = supervisor(policy)
    flaky = service(
        "flaky",
        "import os, signal, time; print('ready', flush=True); time.sleep(0.3); "
        "os.kill(os.getpid(), signal.SIGKILL)",
        ready_line=READY,
    )
    try:
        await s.start(flaky)
        await asyncio.wait_for(s.shutdown.wait(), 10)
    finally:
        await s.stop_all()
    text = out.getvalue()
    for n in (1, 2):  # 0.05 s both times: each run lasted longer than stable_after
        assert f"flaky exited (killed by SIGKILL); restarting in 0.05 s (restart {n})" in text
    assert s.failure == "flaky crashed 3 times in 30 s: giving up"


@PROCESSES
async def test_a_restart_waits_for_its_probe_without_holding_up_the_others() -> None:
    s, out = supervisor(FAST)
    gate = asyncio.Event()
    gate.set()

    async def probe() -> bool:
        return gate.is_set()

    slow = service("steady", "import time; time.sleep(60)", probe=probe)
    flaky = service("flaky", STEADY, ready_line=READY)
    try:
        await s.start(slow)
        await s.start(flaky)
        first = slow.proc.pid
        gate.clear()  # its next process will not look ready until the gate opens
        slow.proc.kill()
        await until(lambda: slow.restarts == 1 and slow.proc.pid != first)
        flaky.proc.kill()
        await until(lambda: "flaky is ready again (restart 1)" in out.getvalue())
        assert not slow.ready.is_set() and "steady is ready again" not in out.getvalue()
        gate.set()
        await until(lambda: "steady is ready again (restart 1)" in out.getvalue())
        assert not s.shutdown.is_set()
    finally:
        await s.stop_all()
    assert "steady exited (killed by SIGKILL); restarting in 0.05 s (restart 1)" in out.getvalue()
    assert s.failure is None


@PROCESSES
async def test_a_restart_not_ready_in_time_stops_everything() -> None:
    s, out = supervisor(FAST, startup_timeout=1.0)
    gate = asyncio.Event()
    gate.set()

    async def probe() -> bool:
        return gate.is_set()

    slow = service("steady", "import time; time.sleep(60)", probe=probe)
    try:
        await s.start(slow)
        gate.clear()
        slow.proc.kill()
        await asyncio.wait_for(s.shutdown.wait(), 5)
    finally:
        await s.stop_all()
    assert s.failure == "steady was not ready after 1 s"
    assert "steady stopped (status -15)" in out.getvalue()  # the restarted one, stopped


@PROCESSES
async def test_a_process_dying_before_it_is_ready_is_restarted_and_start_waits(
    tmp_path: Path,
) -> None:
    s, out = supervisor(FAST)
    runs = tmp_path / "runs"
    flaky = service(
        "flaky",
        "import pathlib, sys, time\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "runs.write_text(runs.read_text() + 'x' if runs.exists() else 'x')\n"
        "if len(runs.read_text()) == 1: sys.exit(2)\n"
        "print('ready', flush=True); time.sleep(60)",
        ready_line=READY,
    )
    try:
        await asyncio.wait_for(s.start(flaky), 10)
        assert flaky.ready.is_set() and flaky.restarts == 1
    finally:
        await s.stop_all()
    text = out.getvalue()
    assert "flaky exited (status 2); restarting in 0.05 s (restart 1)" in text
    assert "flaky is ready again (restart 1)" in text
    assert s.failure is None


@PROCESSES
async def test_stopping_during_the_backoff_restarts_nothing() -> None:
    s, out = supervisor(sup.RestartPolicy(first_delay=30.0, max_delay=30.0))
    flaky = service(
        "flaky", "import sys; print('ready', flush=True); sys.exit(1)", ready_line=READY
    )
    steady = service("steady", STEADY, ready_line=READY)
    await s.start(flaky)
    await s.start(steady)
    await until(lambda: "restarting in 30 s (restart 1)" in out.getvalue())
    began = time.monotonic()
    await s.stop_all()
    assert time.monotonic() - began < 10  # not the 30 s backoff
    await asyncio.sleep(0.2)
    text = out.getvalue()
    assert len(re.findall(r"^flaky +\| ready$", text, re.M)) == 1  # never started again
    assert "flaky stopped (status 1)" in text and "steady stopped (status -15)" in text
    assert s.failure is None


@PROCESSES
async def test_an_exit_while_stopping_is_no_crash() -> None:
    # exits 0 on SIGTERM: stopped, not restarted, not counted
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
        "print('ready', flush=True); time.sleep(60)"
    )
    s, out = supervisor(FAST)
    a = service("steady", code, ready_line=READY)
    await s.start(a)
    await s.stop_all()
    assert a.restarts == 0 and not a.exits
    assert "restarting" not in out.getvalue() and "steady stopped (status 0)" in out.getvalue()
