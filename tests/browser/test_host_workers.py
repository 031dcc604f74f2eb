"""A ``brokerd --workers 2`` host in the console (issue 40), in Chromium against the
real stack (Daphne, Redis, Celery worker and beat): each worker links as its own
broker, ``worker-K@HOST:PORT``, and the brokers page shows them under one host row.
One worker killed with SIGKILL is restarted by its host and shows as a restart of
that worker: never ``down``, no ``broker.down`` alarm, a ``restart`` event."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, expect

from tests.brokerd_process import BrokerProcess, log_tail
from tests.browser.support import open_page, screenshot
from tests.console_stack import ConsoleStack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def stack(console_stack: ConsoleStack) -> Iterator[ConsoleStack]:
    """The console, with no cluster: this module's broker is one host of workers."""
    console_stack.manage("collectstatic", "--noinput")
    yield console_stack


@pytest.fixture(scope="module")
def host(stack: ConsoleStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(
        tmp_path_factory.mktemp("workers") / "host",
        extra_args=[
            "--workers",
            "2",
            "--console",
            stack.link_url,
            f"--console-token={stack.broker_token}",
        ],
    )
    process.start()
    try:
        yield process
    finally:
        pids = [w["pid"] for w in _state(process)["workers"] if w.get("pid")]
        process.stop(timeout=20)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _state(host: BrokerProcess) -> dict[str, Any]:
    try:
        return json.loads((Path(host.data_dir) / "host" / "state.json").read_text())
    except (OSError, ValueError):
        return {"workers": []}


def _utc() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def workers(stack: ConsoleStack) -> dict[str, dict[str, Any]]:
    return {b["name"]: b for b in stack.api().items("/api/v1/brokers/") if b.get("host")}


def test_a_hosts_workers_are_grouped_and_a_killed_one_is_a_restart(
    operator: BrowserContext, stack: ConsoleStack, host: BrokerProcess
) -> None:
    address = f"127.0.0.1:{host.port}"
    names = [f"worker-{k}@{address}" for k in range(2)]

    def both_up() -> bool:
        seen = workers(stack)
        return all(seen.get(n, {}).get("state") == "up" for n in names)

    assert host.alive(), log_tail(host.log_path)
    stack.wait(both_up, 60, "both workers up in the console")
    listed = workers(stack)
    assert {(b["host"], b["worker"], b["host_workers"]) for b in listed.values()} == {
        (address, 0, 2),
        (address, 1, 2),
    }
    page = open_page(operator, "/brokers/")
    # no cluster links here, only a host's workers: no root to miss
    expect(page.locator("#cluster-bar")).to_contain_text("Cluster: none (standalone)")
    host_row = page.locator(f'tr.host-row[data-host="{address}"]')
    expect(host_row).to_contain_text("2 of 2 workers up")
    for name in names:
        expect(page.locator(f'tr[data-broker="{name}"] .broker-state')).to_have_text("up")

    since = _utc()
    old_spid = listed[names[1]]["spid"]
    victim = _state(host)["workers"][1]["pid"]
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    states = set()

    def restarted() -> bool:
        now = workers(stack).get(names[1], {})
        states.add(now.get("state"))
        return now.get("spid") not in (None, old_spid) and now.get("state") == "up"

    stack.wait(restarted, 30, "the killed worker back with a new spid")
    back = time.monotonic() - killed
    print(f"worker 1 back in the console {back:.1f} s after its kill; states seen {states}")
    assert states == {"up"}, f"the worker was shown as {states} while its host restarted it"
    api = stack.api()
    assert api.items(f"/api/v1/alarms/?kind=broker.down&since={since}") == []
    restarts = api.items(f"/api/v1/events/?kind=restart&since={since}")
    assert [e["broker"] for e in restarts] == [names[1]], restarts
    assert restarts[0]["details"]["old_spid"] == old_spid
    page.reload()
    expect(page.locator(f'tr.host-row[data-host="{address}"]')).to_contain_text("2 of 2 workers up")
    expect(page.locator(f'tr[data-broker="{names[1]}"] .broker-state')).to_have_text("up")
    screenshot(page, "host-workers-after-a-worker-restart")
    page.close()
    detail = open_page(operator, f"/brokers/{names[1]}/")  # '@' and ':' in the path
    expect(detail.locator("h1")).to_contain_text(names[1])
    detail.close()
