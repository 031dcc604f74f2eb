"""``make run`` for real, one broker at a time (issue 45): deploy/quickstart.py with its
own DATA_DIR and free ports, driven as an operator would, from another shell
(``quickstart.py ctl``), with signals and through the console's REST API.

A broker sent SIGTERM (a planned stop: it drains and exits 0) stays stopped, the
console can then decommission it, and ``ctl start`` brings it back (it links again
and is active again); a broker killed with SIGKILL is restarted. With a broker
stopped on request, Ctrl-C still stops everything with status 0, and the last
primaries, which have no quorum left to hand their queues over with, do not wait
for hand-overs that cannot happen.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import psutil
import pytest

from tests.brokerd_process import free_port
from tests.integration.test_quickstart import Quickstart, api_token, gone, linked_brokers

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A short DATA_DIR: the control socket's path must fit a Unix socket address
    (pytest's tmp_path can be too deep for it)."""
    path = Path(tempfile.mkdtemp(prefix="qs-", dir="/tmp"))
    try:
        yield path / "var"
    finally:
        shutil.rmtree(path, ignore_errors=True)


def ctl(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``deploy/quickstart.py ctl ARGS`` as an operator runs it from another shell."""
    env = dict(os.environ, DATA_DIR=str(data_dir))
    return subprocess.run(
        [sys.executable, "deploy/quickstart.py", "ctl", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def status_of(data_dir: Path) -> dict[str, list[str]]:
    """``ctl status`` as {name: [state, pid or "-", ...]}."""
    done = ctl(data_dir, "status")
    assert done.returncode == 0, done
    return {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()}


def api(qs: Quickstart, token: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        qs.url(path),
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=qs.context()) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def broker_now(qs: Quickstart, token: str, name: str) -> dict:
    """The console's record of one broker, retired or not."""
    status, record = api(qs, token, f"/api/v1/brokers/{urllib.parse.quote(name)}/")
    assert status == 200, record
    return record


def until(check: Callable[[], object], what: str, qs: Quickstart, timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout} s:\n{qs.tail()}")
        time.sleep(0.3)
    return value


def brokerd_on(qs: Quickstart, port: int) -> list[psutil.Process]:
    """The quickstart's brokerd processes serving ``port`` (none while it is stopped)."""
    found = []
    for child in psutil.Process(qs.proc.pid).children():
        try:
            argv = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "brokerd" in argv and argv[argv.index("--port") + 1] == str(port):
            found.append(child)
    return found


def declare_durable(port: int, name: str) -> None:
    """A durable shared queue, owned by the broker on ``port`` (declared there)."""
    params = pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")
    )
    conn = pika.BlockingConnection(params)
    conn.channel().queue_declare(name, durable=True)
    conn.close()


def test_a_stopped_broker_stays_stopped_and_is_decommissioned(data_dir: Path) -> None:
    ports = [free_port() for _ in range(4)]
    qs = Quickstart(data_dir, free_port(), ports)
    try:
        qs.wait_running()
        assert "One service: DATA_DIR=" in qs.output  # the summary says how
        password = (data_dir / "admin-password").read_text().strip()
        status, body = api_token(qs, "admin", password)
        assert status == 200, body
        token = body["token"]
        assert len(linked_brokers(qs, token)) == 4
        assert (data_dir / "quickstart.sock").stat().st_mode & 0o777 == 0o600
        services = status_of(data_dir)
        assert list(services) == [
            *("redis", "console", "primary1", "primary2", "primary3", "secondary"),
            *("worker", "beat"),
        ]
        assert all(s[0] == "running" and s[1] == "pid" for s in services.values()), services

        # up: the console refuses, and says how to stop one under make run
        name = f"127.0.0.1:{ports[2]}"  # primary3
        status, body = api(qs, token, f"/api/v1/brokers/{name}/decommission/", {"confirm": name})
        assert status == 409 and "deploy/quickstart.py ctl stop NAME" in body["error"], body

        # SIGTERM, as `kill PID` would: a planned stop, not restarted
        (victim,) = brokerd_on(qs, ports[2])
        victim.send_signal(signal.SIGTERM)
        qs.wait_line("primary3 stopped as planned (status 0); start it again with: DATA_DIR=", 30)
        time.sleep(3)  # three times the first backoff: nothing started it again
        assert brokerd_on(qs, ports[2]) == []
        assert "primary3 exited" not in qs.output
        assert status_of(data_dir)["primary3"] == ["stopped", "-", "last", "exit:", "status", "0"]
        until(
            lambda: (
                broker_now(qs, token, name)["state"] == "stopped"
                and not broker_now(qs, token, name)["connected"]
            ),
            "the console shows primary3 stopped",
            qs,
        )

        # ... so the console decommissions it
        status, body = api(qs, token, f"/api/v1/brokers/{name}/decommission/", {"confirm": name})
        assert status == 200, body
        assert body["broker"] == name and any("Under make run" in s for s in body["next"])
        assert broker_now(qs, token, name)["state"] == "retired"

        # ctl start: ready again, linked again, and active again
        done = ctl(data_dir, "start", "primary3")
        assert done.returncode == 0, (done, qs.tail())
        assert re.fullmatch(r"primary3 started \(pid \d+\) and ready\n", done.stdout), done
        assert len(brokerd_on(qs, ports[2])) == 1
        qs.wait_line("primary3 is ready (started on request)")
        until(
            lambda: (
                broker_now(qs, token, name)["state"] == "up"
                and broker_now(qs, token, name)["connected"]
            ),
            "primary3 back in the console",
            qs,
        )
        assert ctl(data_dir, "start", "primary3").returncode == 1  # running: refused

        # kill -9: a crash, restarted as before
        (secondary,) = brokerd_on(qs, ports[3])
        secondary.kill()
        qs.wait_line("secondary exited (killed by SIGKILL); restarting in 1 s (restart 1)")
        qs.wait_line("secondary is ready again (restart 1)")
        until(lambda: brokerd_on(qs, ports[3]), "secondary restarted", qs)

        # stopped on request, and left stopped at Ctrl-C
        done = ctl(data_dir, "stop", "secondary")
        assert done.returncode == 0 and done.stdout.startswith("secondary stopped (status 0)")
        assert brokerd_on(qs, ports[3]) == []
        assert status_of(data_dir)["secondary"][:2] == ["stopped", "-"]
        assert "giving up" not in qs.output

        # Ctrl-C: primary3 hands its queue over (primary1 and primary2 keep a quorum);
        # primary2 then stops with no quorum left after it, and does not wait
        for index in (0, 1, 2):
            declare_durable(ports[index], f"qs-stop-{index}")
        until(lambda: len(linked_brokers(qs, token, want=3)) >= 3, "primaries linked", qs)
        children = qs.children()
        began = time.monotonic()
        qs.proc.send_signal(signal.SIGINT)
        assert qs.wait_exit() == 0, qs.tail()
        took = time.monotonic() - began
        assert "everything stopped" in qs.output
        assert gone(children) == []
        assert not (data_dir / "quickstart.sock").exists()
        assert re.search(r"primary3 +\|.*stopping: 1 of 1 queues moved", qs.output), qs.tail()
        assert re.search(  # "no root" should primary2 have been root itself
            r"primary2 +\|.*stopping: (no quorum \(1 of 3 known primaries stay\)|no root), "
            r"\d+ queues? stays? here",
            qs.output,
        ), qs.tail()
        waits = [int(ms) for ms in re.findall(r"moved to other primaries in (\d+) ms", qs.output)]
        assert all(ms < 3000 for ms in waits), (waits, qs.tail())
        print(f"Ctrl-C took {took:.1f} s; hand-overs {waits} ms")
    finally:
        qs.kill_leftovers()
