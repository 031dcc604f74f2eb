"""A bridge made from the console, in Chromium against the real stack (issue 42).

An operator adds a shovel from a standalone broker (the "far site") into the
cluster to the configuration document and pushes it; the Bridges page shows it
running on one broker and moving the far site's messages. The far broker is
stopped: the page shows the bridge failing with its reason, then the
``bridge-down`` alarm; the far broker starts again: the bridge runs again and
the alarm clears. No page shows the far site's password.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from playwright.sync_api import BrowserContext, expect

from brokerd.bridges.service import BRIDGE_ALARM_AFTER
from tests.brokerd_process import BrokerProcess
from tests.browser.support import open_page, screenshot
from tests.console_stack import ConsoleStack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

#: a page must show a change the brokers made within this many milliseconds
LIVE_TIMEOUT = 15_000
MESSAGES = 50


@pytest.fixture(scope="module")
def far(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """The far site: a standalone brokerd holding the bridge's source queue."""
    proc = BrokerProcess(Path(tmp_path_factory.mktemp("far")) / "far").start()
    try:
        yield proc
    finally:
        if proc.stop() not in (0, None):
            print(proc.log_text()[-4000:])


def test_a_bridge_made_in_the_console_runs_fails_with_its_alarm_and_recovers(
    operator: BrowserContext, stack: ConsoleStack, far: BrokerProcess
) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", far.port))
    ch = conn.channel()
    ch.queue_declare("far-out", durable=True)
    ch.confirm_delivery()
    for i in range(MESSAGES):
        ch.basic_publish("", "far-out", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.close()
    password = "guest"
    document = {
        "bridges": [
            {
                "name": "from-far",
                "vhost": "/",
                "value": {
                    "src-uri": f"amqp://guest:{password}@127.0.0.1:{far.port}",
                    "src-queue": "far-out",
                    "dest-uri": "amqp://",
                    "dest-queue": "from-far",
                    "reconnect-delay": 1,
                },
            }
        ]
    }
    config = open_page(operator, "/config/")
    config.get_by_label("Document (JSON)").fill(json.dumps(document))
    config.get_by_role("button", name="Validate and show diff").click()
    expect(config.locator("#config-valid")).to_contain_text("valid")
    config.get_by_label("Comment").fill("a bridge from the far site")
    config.once("dialog", lambda dialog: dialog.accept())
    config.get_by_role("button", name="Save and push").click()
    expect(config.locator("#config-notice")).to_contain_text("saved and pushed")
    # the editor shows the document back without the password
    expect(config.get_by_label("Document (JSON)")).to_have_value(
        json.dumps(document, indent=2, sort_keys=True).replace(f":{password}@", ":***@")
    )
    config.close()

    page = open_page(operator, "/bridges/")
    row = page.locator('#bridge-table tr[data-bridge="//from-far"]')
    expect(row).to_have_attribute("data-state", "running", timeout=LIVE_TIMEOUT)
    expect(row.locator("td").nth(4)).not_to_have_text("none")  # the broker running it
    expect(row.locator("td").nth(8)).to_have_text(str(MESSAGES), timeout=LIVE_TIMEOUT)
    screenshot(page, "bridge-running")

    assert far.stop() == 0  # the far site goes away
    expect(row).to_have_attribute("data-state", "starting", timeout=LIVE_TIMEOUT)
    expect(row.locator("td.reason")).not_to_be_empty()
    alarms = open_page(operator, "/alarms/")
    alarm = alarms.locator('#active-alarms li[data-kind="bridge-down"]')
    expect(alarm).to_be_visible(timeout=(BRIDGE_ALARM_AFTER + 15) * 1000)
    expect(alarm).to_contain_text("from-far")
    screenshot(page, "bridge-down")

    far.start()  # back: the bridge reconnects at its backoff, and the alarm clears
    expect(row).to_have_attribute("data-state", "running", timeout=60_000)
    expect(alarm).to_have_count(0, timeout=LIVE_TIMEOUT)
    for shown in (page, alarms):
        assert f":{password}@" not in shown.content()
    page.close()
    alarms.close()
