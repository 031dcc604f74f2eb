"""The dashboard in Chromium against the real stack (Daphne, Redis, Celery, four brokers).

The tests run in file order on one stack and each leaves the cluster whole
(a disabled root is enabled again, a killed broker restarted). Every test
saves a screenshot under var/screenshots/. Waiting is Playwright's ``expect``
(polling the page), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import re
import signal
import uuid
from collections.abc import Callable

import pika
import pytest
from playwright.sync_api import Browser, BrowserContext, Dialog, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.browser.support import (
    live,
    login,
    mark,
    new_context,
    open_page,
    screenshot,
    unreloaded,
)
from tests.console_stack import OPERATOR, VIEWER, ConsoleStack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

#: a page must show a change the brokers made within this many milliseconds
LIVE_TIMEOUT = 15_000


@pytest.fixture(scope="module")
def width() -> int:
    """This module's pages are 1280 pixels wide."""
    return 1280


def agreed_root_name(stack: ConsoleStack) -> str:
    """The name (host:port) of the root all running brokers agree on."""
    assert stack.cluster is not None
    spid = stack.cluster.wait_until(stack.cluster.agreed_root, timeout=30)
    for index in stack.cluster.running():
        if stack.cluster.status(index)["spid"] == spid:
            return stack.broker_name(index)
    raise AssertionError(f"no running broker has spid {spid}")


def other_than(name: str) -> re.Pattern[str]:
    """A broker name that is not ``name``."""
    return re.compile(rf"^(?!{re.escape(name)}$)127\.0\.0\.1:\d+$")


def test_login_and_the_overview_shows_four_brokers_and_the_root(
    browser: Browser, stack: ConsoleStack
) -> None:
    context = new_context(browser, stack, viewport={"width": 1280, "height": 900})
    page = login(context, OPERATOR)
    rows = page.locator("#broker-table tbody tr[data-broker]")
    expect(rows).to_have_count(4)
    expect(page.locator("#broker-table .broker-state")).to_have_text(["up"] * 4)
    root = agreed_root_name(stack)
    expect(page.locator("#cluster-bar .root-name")).to_have_attribute("data-root", root)
    expect(page.locator("#overview-root")).to_have_text(root)
    expect(page.locator("#cluster-state")).to_contain_text("ready")
    expect(page.locator("#overview-brokers")).to_have_text("4 of 4 up")
    expect(page.locator(f'tr[data-broker="{root}"]')).to_contain_text("root")
    secondary = stack.broker_name(3)
    expect(page.locator(f'tr[data-broker="{secondary}"]')).to_contain_text("secondary")
    # The rate chart is drawn by uPlot and fed by the pushed series.
    expect(page.locator("#rate-chart canvas")).to_have_count(1)
    expect(page.locator("#rate-chart .u-legend")).to_contain_text("published/s")
    # Times are relative, with the absolute time on hover.
    seen = page.locator(f'tr[data-broker="{root}"] time.ago')
    expect(seen).to_have_text(re.compile(r"(just now|\d+ s ago)"))
    expect(seen).to_have_attribute("title", re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"))
    # the chart's legend shows the latest values without hovering, never "--"
    expect(page.locator("#rate-chart .u-legend .u-series").nth(1)).not_to_contain_text("--")
    # the favicon is served
    icon = page.locator('link[rel="icon"]').get_attribute("href")
    assert icon and page.evaluate(f"fetch({icon!r}).then(r => r.status)") == 200
    screenshot(page, "overview")
    # A narrow screen: nothing wider than the viewport but the scrolling tables.
    page.set_viewport_size({"width": 390, "height": 844})
    # the chart follows the width through a ResizeObserver: give the reflow a moment
    width_excess = "document.documentElement.scrollWidth - window.innerWidth"
    with contextlib.suppress(PlaywrightTimeoutError):
        page.wait_for_function(f"{width_excess} <= 1", timeout=5000)
    overflow = page.evaluate(width_excess)
    assert overflow <= 1, f"the page is {overflow}px wider than a 390px screen"
    screenshot(page, "overview-narrow")
    # Logging out ends the session: pages ask for a login again.
    page.get_by_role("button", name="Log out").click()
    page.goto("/brokers/")
    expect(page.get_by_role("heading", name="Log in")).to_be_visible()
    context.close()


def amqp(stack: ConsoleStack, index: int) -> pika.BlockingConnection:
    assert stack.cluster is not None
    credentials = pika.PlainCredentials("guest", "guest")
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", stack.cluster.ports[index], credentials=credentials)
    )


def test_a_shared_queue_is_listed_once_with_its_depth_and_where_its_consumers_are(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    root = agreed_root_name(stack)
    secondary = stack.broker_name(3)
    name = f"shared-{uuid.uuid4().hex[:8]}"
    page = open_page(operator, f"/queues/?name_contains={name}")
    mark(page)
    expect(page.locator("#queue-table")).to_contain_text("No queues.")
    row = page.locator(f'#queue-table tr[data-queue="{name}"]')
    publisher, consumer = amqp(stack, 3), amqp(stack, 1)  # the secondary, a primary
    try:
        channel = publisher.channel()
        channel.queue_declare(name)
        channel.confirm_delivery()
        for body in (b"one", b"two"):
            channel.basic_publish("", name, body)
        # every broker has the queue (4 rows), the list shows it once, held by the root
        expect(row).to_have_count(1, timeout=LIVE_TIMEOUT)
        expect(row).to_have_attribute("data-broker", root)
        expect(row.locator(".queue-ready")).to_have_text("2", timeout=LIVE_TIMEOUT)
        # a consumer on the secondary, holding one message unacked
        receiving = publisher.channel()
        receiving.basic_qos(prefetch_count=1)
        receiving.basic_consume(name, lambda *_: None)
        second = consumer.channel()
        second.basic_qos(prefetch_count=1)
        second.basic_consume(name, lambda *_: None)
        expect(row.locator(".queue-consumers")).to_have_text("2", timeout=LIVE_TIMEOUT)
        expect(row.locator(f'.spread[data-broker="{secondary}"]')).to_contain_text("(1)")
        expect(row.locator(f'.spread[data-broker="{stack.broker_name(1)}"]')).to_be_visible()
        expect(row).to_have_count(1)
        assert unreloaded(page)
        screenshot(page, "queues-shared-once")
        # its page: the root holds the messages, every other broker has a proxy
        row.get_by_role("link", name=name).click()
        expect(page.locator("#queue-master")).to_have_text(root)
        roles = page.locator("#per-broker tbody tr .role")
        expect(roles).to_have_count(4)
        expect(page.locator(f'#per-broker tr[data-broker="{root}"] .role')).to_have_text("master")
        expect(page.locator(f'#per-broker tr[data-broker="{secondary}"] .role')).to_have_text(
            "proxy"
        )
        live(page)
        screenshot(page, "queue-per-broker")
        channel.queue_delete(name)
        expect(page.locator("#object-detail")).to_contain_text(
            "No broker reports this queue", timeout=LIVE_TIMEOUT
        )
    finally:
        for connection in (publisher, consumer):
            with contextlib.suppress(Exception):
                connection.close()
    page.close()


def test_a_queue_move_starts_on_no_primary_asks_first_and_keeps_the_counters(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    """Issue 45: the target select starts empty (required), the move is confirmed
    before anything is sent, and the queue's Enqueued/Delivered go on counting under
    the new owner instead of restarting at 0."""
    name = f"moved-{uuid.uuid4().hex[:8]}"
    connection = amqp(stack, 0)  # a primary: the queue's first owner (client-local)
    page = open_page(operator, f"/queues/?name_contains={name}")
    try:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
        channel.confirm_delivery()
        for body in (b"one", b"two", b"three"):
            channel.basic_publish("", name, body)
        link = page.get_by_role("link", name=name)
        expect(link).to_have_count(1, timeout=LIVE_TIMEOUT)
        link.click()
        live(page)
        mark(page)
        enqueued = page.locator("#object-detail dt:text-is('Enqueued') + dd")
        expect(enqueued).to_have_text("3", timeout=LIVE_TIMEOUT)
        owner = page.locator("#queue-owner a").inner_text()
        select = page.locator("#move-to")
        expect(select).to_have_value("")
        expect(select.locator("option").first).to_have_text("choose a primary")
        moves: list[str] = []
        page.on("request", lambda r: moves.append(r.url) if r.method == "POST" else None)
        dialogs: list[str] = []

        def answer(accept: bool) -> Callable[[Dialog], None]:
            def handle(dialog: Dialog) -> None:
                dialogs.append(dialog.message)
                if accept:
                    dialog.accept()
                else:
                    dialog.dismiss()

            return handle

        # nothing chosen: the browser refuses the form, nothing asked and nothing sent
        page.get_by_role("button", name="Move owner").click()
        assert select.evaluate("el => el.validity.valueMissing") is True
        assert (dialogs, moves) == ([], [])
        # a primary chosen: asked first; "Cancel" sends nothing
        target = select.locator("option").nth(1)
        target_name = target.inner_text()
        assert target_name != owner
        select.select_option(target.get_attribute("value"))
        page.once("dialog", answer(False))
        page.get_by_role("button", name="Move owner").click()
        assert len(dialogs) == 1 and f"queue {name}" in dialogs[0], dialogs
        assert moves == []
        expect(page.locator("#queue-move-result")).not_to_contain_text("queue.move")
        screenshot(page, "queue-move-confirm")
        # "OK": sent, and followed in place to the new owner
        page.once("dialog", answer(True))
        page.get_by_role("button", name="Move owner").click()
        expect(page.locator("#queue-move-result")).to_contain_text(f"to {target_name}")
        assert len(dialogs) == 2 and len(moves) == 1 and moves[0].endswith("/move/")
        expect(page.locator("#queue-owner a")).to_have_text(target_name, timeout=LIVE_TIMEOUT)
        expect(page.locator("#queue-master")).to_have_text(target_name, timeout=LIVE_TIMEOUT)
        # the new owner reports its own counters; the page goes on from 3
        expect(enqueued).to_have_text("3")
        for body in (b"four", b"five"):
            channel.basic_publish("", name, body)
        expect(enqueued).to_have_text("5", timeout=LIVE_TIMEOUT)
        assert unreloaded(page)
        screenshot(page, "queue-moved-counters")
        channel.queue_delete(name)
    finally:
        with contextlib.suppress(Exception):
            connection.close()
    page.close()


def test_disabling_the_root_shows_the_new_root_on_every_open_page(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    old_root = agreed_root_name(stack)
    pages = [
        open_page(operator, "/"),
        open_page(operator, "/brokers/"),
        open_page(operator, "/alarms/"),
        open_page(operator, f"/brokers/{old_root}/"),
    ]
    broker_page = pages[-1]
    for page in pages:
        mark(page)
    # handing root over is confirmed first
    broker_page.once("dialog", lambda dialog: dialog.accept())
    broker_page.get_by_role("button", name="Disable root").click()
    expect(broker_page.locator("#command-result")).to_contain_text("root.disable")
    for page in pages:
        expect(page.locator("#cluster-bar .root-name")).to_have_attribute(
            "data-root", other_than(old_root), timeout=LIVE_TIMEOUT
        )
    new_root = agreed_root_name(stack)
    assert new_root != old_root
    for page in pages:
        expect(page.locator("#cluster-bar .root-name")).to_have_attribute("data-root", new_root)
        assert unreloaded(page), f"{page.url} was reloaded"
    expect(pages[0].locator("#overview-root")).to_have_text(new_root)
    expect(broker_page.locator("#broker-root-enabled")).to_have_text("disabled")
    expect(broker_page.locator("#broker-role")).to_have_text("not root")
    expect(broker_page.locator("#broker-commands")).to_contain_text("root.disable")
    expect(broker_page.locator("#broker-commands tbody tr").first).to_contain_text("acked")
    screenshot(broker_page, "root-disabled")
    screenshot(pages[0], "root-disabled-overview")
    # Leave the cluster whole: the old root may be root again.
    broker_page.get_by_role("button", name="Enable root").click()
    expect(broker_page.locator("#broker-root-enabled")).to_have_text("yes", timeout=LIVE_TIMEOUT)
    expect(broker_page.get_by_role("button", name="Disable root")).to_be_visible()
    for page in pages:
        page.close()


def test_state_dump_shows_in_the_broker_page(operator: BrowserContext, stack: ConsoleStack) -> None:
    name = stack.broker_name(1)
    page = open_page(operator, f"/brokers/{name}/")
    expect(page.locator("#peer-links tbody tr[data-peer]")).to_have_count(3)
    expect(page.locator("#peer-links")).to_contain_text("active")
    expect(page.locator("#peer-links")).to_contain_text(re.compile(r"\d+\.\d ms"))
    page.get_by_role("button", name="Dump state").click()
    expect(page.locator("#dump-text")).to_be_visible(timeout=LIVE_TIMEOUT)
    assert stack.cluster is not None
    spid = stack.cluster.status(1)["spid"]
    expect(page.locator("#dump-text")).to_contain_text(spid)
    screenshot(page, "state-dump")
    page.close()


def test_pushing_an_edited_configuration_shows_convergence_on_all_brokers(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    page = open_page(operator, "/config/")
    document = page.get_by_label("Document (JSON)")
    # A bad document: the error names the key, in place, and nothing is saved.
    document.fill('{"vhosts": 5}')
    page.get_by_role("button", name="Validate and show diff").click()
    expect(page.locator("#config-errors")).to_contain_text("vhosts")
    # A good one: valid, with its diff against the current version.
    document = page.get_by_label("Document (JSON)")
    document.fill('{"vhosts": ["/", "staging"]}')
    page.get_by_role("button", name="Validate and show diff").click()
    expect(page.locator("#config-valid")).to_contain_text("valid")
    expect(page.locator("#config-diff")).to_contain_text('+    "staging"')
    page.get_by_label("Comment").fill("a staging virtual host")
    mark(page)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Save and push").click()
    expect(page.locator("#config-editor")).to_contain_text("saved and pushed")
    expect(page.locator("#convergence .apply-state")).to_have_text(
        ["running it"] * 4, timeout=LIVE_TIMEOUT
    )
    expect(page.locator("#converged")).to_have_text("converged")
    expect(page.locator("#config-versions")).to_contain_text("4 of 4 brokers")
    assert unreloaded(page)
    screenshot(page, "config-converged")
    page.close()


def test_a_killed_broker_shows_down_with_an_alarm_and_clears_on_restart(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    assert stack.cluster is not None
    victim = stack.broker_name(3)  # the secondary: no election needed
    overview = open_page(operator, "/")
    alarms = open_page(operator, "/alarms/")
    row_state = overview.locator(f'tr[data-broker="{victim}"] .broker-state')
    expect(row_state).to_have_text("up")
    down_alarm = f'li[data-kind="broker.down"][data-broker="{victim}"]'
    stack.cluster.servers[3].signal(signal.SIGKILL)
    expect(row_state).to_have_text("down", timeout=LIVE_TIMEOUT)
    # a broker that is not heard is never shown ready, nor offered commands
    row = overview.locator(f'tr[data-broker="{victim}"]')
    expect(row.locator(".broker-ready")).to_have_text("unknown")
    down_page = open_page(operator, f"/brokers/{victim}/")
    expect(down_page.locator("#broker-ready")).to_have_text("unknown")
    expect(down_page.locator("#dump-unavailable")).to_contain_text("is down")
    expect(down_page.get_by_role("button", name="Dump state")).to_have_count(0)
    screenshot(down_page, "broker-down-page")
    down_page.close()
    expect(overview.locator(f"#active-alarms {down_alarm}")).to_be_visible()
    expect(overview.locator("#overview-brokers")).to_have_text("3 of 4 up")
    expect(alarms.locator(f"#active-alarms {down_alarm}")).to_be_visible()
    screenshot(overview, "broker-down")
    stack.cluster.servers[3].proc.wait(10)
    stack.start_broker(3)
    expect(row_state).to_have_text("up", timeout=LIVE_TIMEOUT)
    expect(overview.locator(f"#active-alarms {down_alarm}")).to_have_count(0)
    expect(alarms.locator(f"#active-alarms {down_alarm}")).to_have_count(0)
    expect(alarms.locator('#alarm-table tr[data-kind="broker.down"]').first).to_contain_text(
        "cleared"
    )
    expect(overview.locator("#overview-brokers")).to_have_text("4 of 4 up")
    screenshot(overview, "broker-restarted")
    overview.close()
    alarms.close()


def test_a_read_only_user_sees_no_command_buttons_and_a_forged_post_is_refused(
    browser: Browser, stack: ConsoleStack
) -> None:
    context = new_context(browser, stack, viewport={"width": 1280, "height": 900})
    login(context, VIEWER).close()
    name = stack.broker_name(0)
    page = open_page(context, f"/brokers/{name}/")
    expect(page.locator("#broker-summary")).to_contain_text("up")
    expect(page.get_by_role("button", name="Disable root")).to_have_count(0)
    expect(page.get_by_role("button", name="Enable root")).to_have_count(0)
    expect(page.get_by_role("button", name="Dump state")).to_have_count(0)
    expect(page.locator(".who")).to_contain_text("read-only")
    before = len(stack.api().items("/api/v1/commands/"))
    # Forged: the viewer's own session and CSRF token, straight to the action URL.
    token = next(c["value"] for c in context.cookies() if c["name"] == "csrftoken")
    forged = page.request.post(
        f"/brokers/{name}/root/",
        form={"enabled": "0"},
        headers={"X-CSRFToken": token, "HX-Request": "true"},
    )
    assert forged.status == 403
    # And without the token: refused by the CSRF check.
    tokenless = page.request.post(f"/brokers/{name}/dump/", form={})
    assert tokenless.status == 403
    pushed = page.request.post("/config/", form={"document": "{}"}, headers={"X-CSRFToken": token})
    assert pushed.status == 403
    assert len(stack.api().items("/api/v1/commands/")) == before
    config = open_page(context, "/config/")
    expect(config.get_by_role("button", name="Save and push")).to_have_count(0)
    expect(config.locator("#convergence")).to_contain_text("converged")
    screenshot(page, "read-only-broker")
    context.close()
