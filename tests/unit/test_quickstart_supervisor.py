"""deploy/quickstart_supervisor.py with small Python processes: restarts with backoff,
readiness after a restart, the crash-loop give-up, and stopping without restarts;
planned stops left stopped, and stop/start/restart/status of one service over
deploy/quickstart_control.py's socket, none of which counts as a crash (issue 45).

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


def _load(name: str = "quickstart_supervisor") -> ModuleType:
    """A deploy/ module by its file (deploy is no package). test_quickstart_config.py
    may have loaded it already (through deploy/quickstart.py)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "deploy" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
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


# -- planned stops and the control channel (issue 45) -----------------------------------------

#: prints "ready", exits 0 on SIGTERM (as brokerd does, drained)
CLEAN = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('ready', flush=True); time.sleep(60)"
)
CTL = ".venv/bin/python deploy/quickstart.py ctl"


def _catches_sigterm(pid: int) -> bool:
    """The process has a SIGTERM handler installed (``SigCgt`` in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except (FileNotFoundError, ProcessLookupError):
        return False
    return False


def _load_control() -> ModuleType:
    return _load("quickstart_control")


control = _load_control()


def state_of(s: object, name: str) -> str:
    """The status line's state column for ``name``."""
    (line,) = [line for line in s.status_lines() if line.split()[0] == name]
    return line.split()[1]


@PROCESSES
async def test_a_clean_exit_of_a_keep_stopped_service_is_a_planned_stop() -> None:
    s, out = supervisor(FAST, ctl=CTL)
    broker = service("steady", CLEAN, ready_line=READY, keep_stopped=True)
    other = service("flaky", CLEAN, ready_line=READY)  # e.g. the console: restarted
    try:
        await s.start(broker)
        await s.start(other)
        broker.proc.send_signal(signal.SIGTERM)  # an operator's kill, not the supervisor's
        await until(lambda: broker.state == sup.STOPPED)
        first = other.proc.pid
        other.proc.send_signal(signal.SIGTERM)
        await until(lambda: other.restarts == 1 and other.state == sup.RUNNING)
        await asyncio.sleep(0.3)  # longer than the backoff: still not restarted
        assert broker.proc.returncode == 0 and broker.restarts == 0 and not broker.exits
        assert state_of(s, "steady") == "stopped" and other.proc.pid != first
        assert "last exit: status 0" in s.status_lines()[0]
        assert not s.shutdown.is_set()
    finally:
        await s.stop_all()
    text = out.getvalue()
    assert (
        "steady stopped as planned (status 0); start it again with: "
        ".venv/bin/python deploy/quickstart.py ctl start steady"
    ) in text
    assert "steady exited" not in text and "steady stopped (status" not in text  # said once
    assert "flaky exited (status 0); restarting in 0.05 s (restart 1)" in text
    assert s.failure is None


@PROCESSES
async def test_a_clean_exit_before_ready_leaves_it_stopped_and_start_goes_on() -> None:
    s, out = supervisor(FAST, ctl=CTL)
    quitter = service("steady", "print('bye')", ready_line=READY, keep_stopped=True)
    try:
        await asyncio.wait_for(s.start(quitter), 10)  # returns: no ready line will come
        assert quitter.state == sup.STOPPED and not quitter.ready.is_set()
        with pytest.raises(sup.ControlError, match=r"exited before it was ready \(status 0\)"):
            await asyncio.wait_for(s.start_service("steady"), 10)
        assert quitter.state == sup.STOPPED and not s.shutdown.is_set()
    finally:
        await s.stop_all()
    assert out.getvalue().count("steady stopped as planned (status 0)") == 2


@PROCESSES
async def test_a_crash_of_a_keep_stopped_service_is_restarted() -> None:
    s, out = supervisor(FAST)
    broker = service("steady", CLEAN, ready_line=READY, keep_stopped=True)
    try:
        await s.start(broker)
        first = broker.proc.pid
        broker.proc.kill()  # kill -9
        await until(lambda: broker.restarts == 1 and broker.state == sup.RUNNING)
        second = broker.proc.pid
        assert second != first
        os.kill(second, signal.SIGUSR1)  # default action: killed by the signal
        await until(lambda: broker.restarts == 2 and broker.state == sup.RUNNING)
    finally:
        await s.stop_all()
    text = out.getvalue()
    assert "steady exited (killed by SIGKILL); restarting in 0.05 s (restart 1)" in text
    assert "steady exited (killed by SIGUSR1); restarting in 0.1 s (restart 2)" in text
    assert "steady is ready again (restart 2)" in text and "as planned" not in text


@PROCESSES
async def test_ctl_status_stop_start_restart_over_the_socket(tmp_path: Path) -> None:
    s, out = supervisor(FAST, ctl=CTL)
    gate = asyncio.Event()
    gate.set()

    async def probe() -> bool:
        # ready once it catches SIGTERM: a stop sent before its handler is in place
        # would kill it (seen under CI load), which is not the planned stop tested here
        return gate.is_set() and _catches_sigterm(broker.proc.pid)

    broker = service("steady", CLEAN, probe=probe, keep_stopped=True)
    other = service("flaky", STEADY, ready_line=READY)
    path = tmp_path / "qs.sock"
    server = control.ControlServer(s, path)
    await server.open()

    async def ctl(line: str) -> tuple[bool, list[str]]:
        return await asyncio.to_thread(control.request, path, line, 20.0)

    try:
        assert path.stat().st_mode & 0o777 == 0o600
        await s.start(broker)
        await s.start(other)
        ok, lines = await ctl("status")
        assert ok and len(lines) == 2
        assert lines[0].split()[:4] == ["steady", "running", "pid", str(broker.proc.pid)]
        assert lines[1].split()[:2] == ["flaky", "running"]

        first = broker.proc.pid
        assert await ctl("stop steady") == (
            True,
            ["steady stopped (status 0); start it again with: " + CTL + " start steady"],
        )
        assert broker.proc.returncode == 0 and broker.state == sup.STOPPED
        assert (await ctl("status"))[1][0].split()[:3] == ["steady", "stopped", "-"]
        assert await ctl("stop steady") == (True, ["steady is stopped already"])
        await asyncio.sleep(0.3)  # longer than the backoff: it stays stopped
        assert broker.proc.pid == first and broker.restarts == 0

        # start waits for the readiness probe, as at startup
        gate.clear()
        starting = asyncio.create_task(ctl("start steady"))
        await until(lambda: broker.proc.pid != first)
        await asyncio.sleep(0.5)
        assert not starting.done() and state_of(s, "steady") == "starting"
        gate.set()
        ok, lines = await starting
        second = broker.proc.pid
        assert ok and lines == [f"steady started (pid {second}) and ready"]
        assert state_of(s, "steady") == "running"

        ok, lines = await ctl("restart steady")
        assert ok and lines[0] == "steady stopped (status 0); start it again with: " + (
            CTL + " start steady"
        )
        assert lines[1] == f"steady started (pid {broker.proc.pid}) and ready"
        assert broker.proc.pid != second and broker.restarts == 0

        assert await ctl("start flaky") == (False, ["flaky is running, not stopped"])
        ok, lines = await ctl("stop nosuch")
        assert not ok and lines == ["no service 'nosuch' (services: steady, flaky)"]
        ok, lines = await ctl("explode steady")
        assert not ok and "expected status | stop NAME" in lines[0]
        assert not s.shutdown.is_set() and s.failure is None
        assert not broker.exits and not other.exits  # no stop above was a crash
    finally:
        await s.stop_all()
        ok, lines = await ctl("stop flaky")  # after Ctrl-C: refused, status still answers
        assert (ok, lines) == (False, ["everything is stopping"])
        assert (await ctl("status"))[1][1].split()[:2] == ["flaky", "stopped"]
        await server.close()
    assert not path.exists()
    text = out.getvalue()
    assert "steady stopped on request (status 0)" in text
    assert "steady is ready (started on request)" in text
    assert "restarting" not in text


@PROCESSES
async def test_planned_stops_do_not_count_towards_the_crash_loop(tmp_path: Path) -> None:
    # two crashes within the window would give up; five planned stops must not
    policy = sup.RestartPolicy(first_delay=0.05, max_delay=0.2, max_exits=2, window=30)
    s, out = supervisor(policy)
    quits = "import time; print('ready', flush=True); time.sleep(0.2)"  # exits 0 itself
    broker = service("steady", quits, ready_line=READY, keep_stopped=True)
    other = service("flaky", CLEAN, ready_line=READY, keep_stopped=True)
    try:
        await s.start(broker)
        await s.start(other)
        for _ in range(3):
            await until(lambda: broker.state == sup.STOPPED)
            assert (await s.start_service("steady")).startswith("steady started")
        for _ in range(3):
            await s.restart_service("flaky")
        assert await s.stop_service("flaky") == "flaky stopped (status 0)"
        await until(lambda: broker.state == sup.STOPPED)
        assert not s.shutdown.is_set() and s.failure is None
        assert not broker.exits and not other.exits and broker.restarts == other.restarts == 0
        # a crash after all that is the first one, restarted as usual
        assert (await s.start_service("flaky")).startswith("flaky started")
        other.proc.kill()
        await until(lambda: other.restarts == 1 and other.state == sup.RUNNING)
        assert len(other.exits) == 1 and not s.shutdown.is_set()
    finally:
        began = time.monotonic()
        await s.stop_all()  # a stopped service does not hold the stop up
        assert time.monotonic() - began < 5
    text = out.getvalue()
    assert text.count("steady stopped as planned (status 0)") == 4
    assert "giving up" not in text and s.failure is None


def test_the_control_socket_replaces_a_stale_one_only(tmp_path: Path) -> None:
    import socket

    stale = tmp_path / "stale.sock"
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(stale))  # bound, not listening: a quickstart that was killed
    left.close()
    control.check_free(stale)
    assert not stale.exists()

    (tmp_path / "file.sock").write_text("mine")
    with pytest.raises(sup.ControlError, match="not a socket"):
        control.check_free(tmp_path / "file.sock")

    live = tmp_path / "live.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(live))
        listening.listen()
        with pytest.raises(sup.ControlError, match="another quickstart answers"):
            control.check_free(live)
    with pytest.raises(sup.ControlError, match="shorter DATA_DIR"):
        control.check_free(tmp_path / ("x" * 120))
    with pytest.raises(control.ControlUnavailable, match="nothing answers"):
        control.request(tmp_path / "none.sock", "status")
    assert control.parse("restart primary2") == ("restart", "primary2")
    for bad in ("", "stop", "status primary1", "start a b", "kill primary1"):
        with pytest.raises(sup.ControlError, match="expected"):
            control.parse(bad)
