"""The console says what is true, in Chromium against the real stack (issue 15).

One stack for the module (Daphne, Redis, Celery worker + beat, three primaries and a
secondary with a 0.3 s heartbeat, all fresh: the first hour of an install). In file
order: a report in the first minutes; a command followed live to its outcome in the
broker page's banner and the overview's recent commands; the confirm dialogs (dismissed:
nothing happens); the configuration round trip across a broker restart, a drift shown
with its alarm, the alarm acknowledged, the drift fixed by pushing the version again,
and a key left out going back to the broker's own file. Screenshots go to
var/screenshots/.
"""

from __future__ import annotations

import json
import re
import signal

import pytest
from playwright.sync_api import BrowserContext, Dialog, expect

from tests.browser.support import (
    mark,
    open_page,
    screenshot,
    unreloaded,
)
from tests.console_stack import OPERATOR, ConsoleStack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

#: a page must show a change the brokers made within this many milliseconds
LIVE_TIMEOUT = 15_000
#: Spark's start on a busy 2-core machine, plus the job
REPORT_TIMEOUT = 240_000


def heartbeat_timeout(stack: ConsoleStack, index: int) -> float:
    """What broker ``index`` itself runs (``brokerd ctl status``), not what the console says."""
    assert stack.cluster is not None
    return stack.cluster.status(index)["heartbeat"]["timeout"]


def test_a_report_runs_in_the_first_minutes_of_a_fresh_install(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    page = operator.new_page()
    page.goto("/reports/")
    page.get_by_role("button", name="Run report now").click()
    expect(page.get_by_role("heading", name=re.compile(r"^Report \d+$"))).to_be_visible()
    # the page reloads itself until the run is done: no archive yet, no Spark error
    expect(page.locator("#report-state")).to_have_text("succeeded", timeout=REPORT_TIMEOUT)
    expect(page.locator(".tiles")).to_contain_text("Brokers")
    expect(page.locator(".tile").first.locator(".big")).to_have_text("4")
    # times in words, ISO 8601 on hover
    first = page.locator("dd time").first
    expect(first).to_have_attribute("title", re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"))
    expect(page.locator("#report-isr-xsr .u-legend .u-series").nth(1)).not_to_contain_text("--")
    # a run of a few seconds is one minute of data: the time axis spans minutes, not years
    for chart in ("#report-isr-xsr", "#report-brokers"):
        x_span = "box => box.uplot.scales.x.max - box.uplot.scales.x.min"
        span = page.locator(chart).evaluate(x_span)
        assert 0 < span <= 3600, (chart, span)
    screenshot(page, "report-first-hour")
    page.close()


def test_a_command_is_followed_live_in_the_banner_and_the_recent_commands(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    name = stack.broker_name(1)
    overview = open_page(operator, "/")
    broker = open_page(operator, f"/brokers/{name}/")
    for page in (overview, broker):
        mark(page)
    broker.get_by_role("button", name="Dump state").click()
    banner = broker.locator("#command-result .banner-command").first
    expect(banner).to_contain_text("state.dump")
    # the same banner, not reloaded, ends on the broker's answer
    expect(banner).to_have_attribute("data-state", "acked", timeout=LIVE_TIMEOUT)
    expect(banner).not_to_contain_text("has not answered")
    command_id = banner.get_attribute("data-command")
    row = overview.locator(f'#recent-commands tr[data-command="{command_id}"]')
    expect(row).to_contain_text("acked", timeout=LIVE_TIMEOUT)
    expect(row.locator("td").nth(6).locator("time")).to_have_count(1)  # Finished: a time
    expect(row).not_to_contain_text("not yet")
    # nothing is cut off on a laptop screen: the table fits its card
    overflow = overview.evaluate(
        "(() => { const w = document.querySelector('#recent-commands .table-wrap');"
        " return w.scrollWidth - w.clientWidth; })()"
    )
    assert overflow <= 1, f"the recent commands scroll {overflow}px sideways at 1366px"
    assert unreloaded(overview) and unreloaded(broker)
    screenshot(broker, "command-banner-acked")
    screenshot(overview, "overview-recent-commands")
    overview.close()
    broker.close()


def test_confirm_dialogs_guard_root_disable_and_config_push(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    api = stack.api(OPERATOR)
    before = api.ok("/api/v1/commands/")["count"]
    name = stack.broker_name(2)
    page = open_page(operator, f"/brokers/{name}/")
    seen: list[str] = []

    def dismiss(dialog: Dialog) -> None:
        seen.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.get_by_role("button", name="Disable root").click()
    expect(page.get_by_role("button", name="Disable root")).to_be_visible()
    assert seen and seen[0].startswith(f"Disable root on {name}?")
    # the secondary is never offered root at all
    secondary = open_page(operator, f"/brokers/{stack.broker_name(3)}/")
    expect(secondary.locator("#root-unavailable")).to_contain_text("secondaries are never root")
    expect(secondary.get_by_role("button", name="Enable root")).to_have_count(0)
    secondary.close()

    config = open_page(operator, "/config/")
    config.get_by_label("Document (JSON)").fill('{"vhosts": ["/", "never"]}')
    config.once("dialog", dismiss)
    config.get_by_role("button", name="Save and push").click()
    expect(config.locator("#config-notice")).to_have_count(0)
    assert len(seen) == 2 and seen[1].startswith("Push this configuration to every broker")
    assert api.ok("/api/v1/commands/")["count"] == before
    assert api.ok("/api/v1/configs/")["count"] == 0
    page.close()
    config.close()


def test_configuration_round_trip_across_a_restart_drift_acknowledged_and_pushed_again(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    assert stack.cluster is not None
    victim = 1
    name = stack.broker_name(victim)
    file_timeout = heartbeat_timeout(stack, victim)
    document = {
        "heartbeat": {"interval": 0.3, "timeout": 1.5, "open_timeout": 8.0},
        "vhosts": ["/", "round-trip"],
    }
    config = open_page(operator, "/config/")
    config.get_by_label("Document (JSON)").fill(json.dumps(document))
    config.get_by_role("button", name="Validate and show diff").click()
    # (wait for the checked editor: clicking in the one it replaces would be lost)
    expect(config.locator("#config-valid")).to_contain_text("valid")
    expect(config.locator("#config-unset")).to_contain_text("known_hosts")  # stated defaults
    config.get_by_label("Comment").fill("slower peer timeout")
    config.once("dialog", lambda dialog: dialog.accept())
    config.get_by_role("button", name="Save and push").click()
    expect(config.locator("#config-notice")).to_contain_text(
        "Version 1 saved and pushed", timeout=LIVE_TIMEOUT
    )
    expect(config.locator("#converged")).to_have_text("converged", timeout=LIVE_TIMEOUT)
    assert heartbeat_timeout(stack, victim) == 1.5
    # the editor opens on the current document
    expect(config.get_by_label("Document (JSON)")).to_have_value(re.compile(r'"round-trip"'))
    mark(config)

    # a restart: the broker comes back on its own files, says so, and gets version 1
    stack.cluster.servers[victim].stop()
    row = config.locator(f'#convergence tr[data-broker="{name}"]')
    expect(row).to_have_attribute("data-state", "down", timeout=LIVE_TIMEOUT)
    expect(config.locator("#converged")).to_have_text("not converged")
    stack.start_broker(victim)
    expect(row).to_have_attribute("data-state", "running", timeout=LIVE_TIMEOUT)
    expect(config.locator("#converged")).to_have_text("converged")
    stack.cluster.wait_until(lambda: heartbeat_timeout(stack, victim) == 1.5, 10)

    # a reload puts brokerd.toml's part back: it drifts, and the console says so
    stack.cluster.servers[victim].signal(signal.SIGHUP)
    expect(row).to_have_attribute("data-state", "drifted", timeout=LIVE_TIMEOUT)
    expect(row).to_contain_text("its own configuration files")
    expect(config.locator("#converged")).to_have_text("not converged")
    expect(config.locator("#config-running")).to_contain_text(f"({name})")
    screenshot(config, "config-drifted")

    alarms = open_page(operator, "/alarms/")
    drift = alarms.locator(f'#active-alarms li[data-kind="config.drift"][data-broker="{name}"]')
    expect(drift).to_be_visible(timeout=LIVE_TIMEOUT)
    expect(alarms.locator("#cluster-bar")).to_contain_text("not acknowledged")
    drift.get_by_role("button", name="Acknowledge").click()
    expect(drift).to_have_attribute("data-acknowledged", "yes", timeout=LIVE_TIMEOUT)
    expect(drift).to_contain_text("acknowledged by operator")
    # the rest of the page follows live: the cluster bar and the history
    expect(alarms.locator("#cluster-bar")).to_contain_text("1 active, acknowledged")
    history = alarms.locator('#alarm-table tr[data-kind="config.drift"]').first
    expect(history).to_contain_text("operator")
    screenshot(alarms, "alarm-acknowledged")
    audit = open_page(operator, "/audit/")
    entry = audit.locator("#audit-table tr", has_text="alarm.acknowledge").first
    expect(entry.locator("dl.details")).to_contain_text("kind")
    expect(entry).not_to_contain_text("{'")  # no Python dict reprs
    audit.close()

    # pushing the version again fixes it; the alarm clears
    config.once("dialog", lambda dialog: dialog.accept())
    config.locator('#config-versions tr[data-version="1"]').get_by_role(
        "button", name="Push again"
    ).click()
    expect(row).to_have_attribute("data-state", "running", timeout=LIVE_TIMEOUT)
    expect(config.locator("#converged")).to_have_text("converged")
    expect(drift).to_have_count(0, timeout=LIVE_TIMEOUT)
    assert heartbeat_timeout(stack, victim) == 1.5
    assert unreloaded(config)
    screenshot(config, "config-converged-again")

    # a version without the heartbeat key means the cluster file's heartbeat, on every broker
    config.get_by_label("Document (JSON)").fill('{"vhosts": ["/", "round-trip"]}')
    config.once("dialog", lambda dialog: dialog.accept())
    config.get_by_role("button", name="Save and push").click()
    expect(config.locator("#config-notice")).to_contain_text(
        "Version 2 saved and pushed", timeout=LIVE_TIMEOUT
    )
    expect(config.locator("#converged")).to_have_text("converged", timeout=LIVE_TIMEOUT)
    stack.cluster.wait_until(
        lambda: all(heartbeat_timeout(stack, i) == file_timeout for i in range(4)), 10
    )
    # the same document again is not a new version; version 1 can be pushed again
    config.once("dialog", lambda dialog: dialog.accept())
    config.get_by_role("button", name="Save and push").click()
    expect(config.locator("#config-notice")).to_contain_text("No change", timeout=LIVE_TIMEOUT)
    expect(config.locator("#config-versions tbody tr")).to_have_count(2)
    # nothing on the page is wider than the window
    excess = config.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert excess <= 1, f"the configuration page is {excess}px wider than the window"
    screenshot(config, "config-versions")
    alarms.close()
    config.close()
