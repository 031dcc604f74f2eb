"""The dashboard when things go wrong and on small screens (issue 25), in Chromium
against the real stack (Daphne, Redis, Celery, four brokers).

The skip link, the rate chart's gaps, no sideways scrolling at 390 and 1366 px on every
page (no table sticking out of its card; on the overview and the brokers page at 1366
px none wider than its card, and the root's host:port on one line; screenshots of each
under var/screenshots/), a silent broker's row greyed with its age, and the whole page
saying it is stale while Daphne is stopped, until it is back. The Daphne test runs
last: it restarts the console process.
"""

from __future__ import annotations

import contextlib
import re
import signal

import pika
import pytest
from playwright.sync_api import BrowserContext, Page, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.browser.support import live, open_page, screenshot
from tests.console_stack import ConsoleStack

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

LIVE_TIMEOUT = 15_000
REPORT_TIMEOUT = 240_000
#: a queue name with no place to break: it must wrap or scroll inside its box
LONG_NAME = "q-" + "x" * 120
#: the page is no wider than the window (1 px of rounding allowed)
WIDTH_EXCESS = "document.documentElement.scrollWidth - window.innerWidth"


def test_the_skip_link_is_the_first_tab_stop_and_jumps_to_the_content(
    operator: BrowserContext,
) -> None:
    for path in ("/", "/brokers/", "/config/"):
        page = open_page(operator, path)
        page.keyboard.press("Tab")
        focused = page.evaluate(
            "() => { const el = document.activeElement;"
            " return [el.tagName, el.textContent.trim(), el.getAttribute('href')]; }"
        )
        assert focused == ["A", "Skip to content", "#content"], (path, focused)
        link = page.locator("a.skip-link")
        box = link.bounding_box()
        assert box is not None and box["y"] >= 0 and box["height"] > 0, box  # shown on focus
        if path == "/":
            screenshot(page, "skip-link-focused")
        page.keyboard.press("Enter")
        expect(page.locator("main#content")).to_be_focused()
        assert page.evaluate("location.hash") == "#content"
        page.close()


def test_the_rate_chart_breaks_its_lines_where_samples_are_missing(
    operator: BrowserContext,
) -> None:
    page = open_page(operator, "/")
    expect(page.locator("#rate-chart canvas")).to_have_count(1)
    # the function building the points: a null wherever points are more than two steps apart
    gaps = page.evaluate("RookeryCharts.withGaps([[0, 1, 2, 10, 11], [5, 6, 7, 8, 9]])")
    assert gaps == [[0, 1, 2, 3, 10, 11], [5, 6, 7, None, 8, 9]]
    ended = page.evaluate("RookeryCharts.withGaps([[0, 1, 2], [5, 6, 7]], null, 30)")
    assert ended == [[0, 1, 2, 30], [5, 6, 7, None]]  # silent since: a gap up to now
    whole = page.evaluate("RookeryCharts.withGaps([[0, 1, 2, 4], [5, 6, 7, 8]])")
    assert whole == [[0, 1, 2, 4], [5, 6, 7, 8]]  # one late point is no gap
    # the live chart, fed a series with an outage (what a live update does), draws nulls
    # (uPlot breaks a line at a null unless spanGaps) and the series do not span gaps
    drawn = page.evaluate(
        """() => {
        const now = Math.floor(Date.now() / 1000);
        const t = [now - 14, now - 13, now - 12, now - 4, now - 3, now - 2];
        const ones = t.map(() => 1);
        document.getElementById("rate-series").textContent =
            JSON.stringify({t: t, published: ones, routed: ones, delivered: ones});
        document.dispatchEvent(new Event("htmx:wsAfterMessage"));
        const chart = RookeryCharts.chart();
        return {
            t: chart.data[0].map(x => x - now),
            published: chart.data[1],
            spanGaps: chart.series.slice(1).map(s => s.spanGaps),
        };
    }"""
    )
    assert drawn["t"] == [-14, -13, -12, -11, -4, -3, -2]
    assert drawn["published"] == [1, 1, 1, None, 1, 1, 1]
    assert drawn["spanGaps"] == [False, False, False]
    page.close()


def declare_long_queue(stack: ConsoleStack) -> None:
    assert stack.cluster is not None
    params = pika.ConnectionParameters(
        "127.0.0.1", stack.cluster.ports[0], credentials=pika.PlainCredentials("guest", "guest")
    )
    connection = pika.BlockingConnection(params)
    try:
        connection.channel().queue_declare(queue=LONG_NAME, durable=True)
    finally:
        connection.close()


def fits(page: Page, what: str) -> None:
    """No horizontal page scrolling (the chart follows the width through a ResizeObserver:
    the reflow gets a moment)."""
    with contextlib.suppress(PlaywrightTimeoutError):
        page.wait_for_function(f"{WIDTH_EXCESS} <= 1", timeout=3000)
    excess = page.evaluate(WIDTH_EXCESS)
    if excess > 1:
        culprits = page.evaluate(
            """() => [...document.querySelectorAll("body *")]
                .filter(el => el.getBoundingClientRect().right > window.innerWidth + 1)
                .slice(0, 5).map(el => el.tagName + "." + el.className + "#" + el.id)"""
        )
        raise AssertionError(f"{what}: {excess}px wider than the window; {culprits}")


#: per table in the main content: how far its visible box (the table, or the box it
#: scrolls in) sticks out of its card's content box, and how much wider than that
#: content box the table itself is (0 or less: it fits without scrolling)
TABLES_IN_CARDS = """() => [...document.querySelectorAll("main table")].map(table => {
    const card = table.closest(".card, .tile, section") || table.parentElement;
    const style = getComputedStyle(card), rect = card.getBoundingClientRect();
    const left = rect.left + parseFloat(style.paddingLeft) + parseFloat(style.borderLeftWidth);
    const right = rect.right - parseFloat(style.paddingRight)
        - parseFloat(style.borderRightWidth);
    const scrolls = el => ["auto", "scroll"].includes(getComputedStyle(el).overflowX);
    let shown = table;
    while (shown !== card && !scrolls(shown)) shown = shown.parentElement;
    if (shown === card) shown = table;
    const caption = table.querySelector("caption, th");
    return {
        table: table.closest("[id]")?.id || (caption ? caption.textContent.trim() : "?"),
        sticksOut: Math.round(shown.getBoundingClientRect().right - right),
        wider: Math.round(table.getBoundingClientRect().width - (right - left)),
    };
})"""


def tables_fit(page: Page, what: str, scroll_allowed: bool) -> None:
    """No table sticks out of its card; where ``scroll_allowed`` is false (a wide screen)
    none is wider than its card either, so nothing needs scrolling sideways."""
    for table in page.evaluate(TABLES_IN_CARDS):
        assert table["sticksOut"] <= 1, f"{what}: {table}"
        if not scroll_allowed:
            assert table["wider"] <= 1, f"{what}: {table}"


def test_the_overview_and_brokers_fit_at_390_and_1366_pixels(operator: BrowserContext) -> None:
    """The issue's proof: the overview (and the brokers page) at 1366 and 390 px, with
    no sideways scrolling, no table wider than its card at 1366 px (at 390 px a table
    scrolls inside its card), and the root's host:port on one line, whole."""
    page = operator.new_page()
    for width in (1366, 390):
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in (("overview", "/"), ("brokers", "/brokers/")):
            page.goto(path)
            live(page)
            expect(page.locator("#broker-table tbody tr[data-broker]")).to_have_count(4)
            fits(page, f"{name} at {width}px")
            tables_fit(page, f"{name} at {width}px", scroll_allowed=width < 700)
            if name == "overview":
                root = page.locator("#overview-root")
                expect(root).to_have_text(re.compile(r"^127\.0\.0\.1:\d+$"))
                lines = root.evaluate("el => el.getClientRects().length")
                cut = root.evaluate(
                    "el => el.parentElement.scrollWidth - el.parentElement.clientWidth"
                )
                assert (lines, cut) == (1, 0), f"root at {width}px: {lines} lines, {cut}px cut"
                expect(root.locator("xpath=..")).to_have_attribute("title", root.inner_text())
            screenshot(page, f"{name}-{width}")
    page.close()


def test_no_page_scrolls_sideways_at_390_or_1366_pixels(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    # content with long unbroken strings: a queue name, a pushed configuration (checksums,
    # a diff), a state dump (JSON in a <pre>) and a report run
    declare_long_queue(stack)
    status, _ = stack.api().post(
        "/api/v1/configs/",
        {"document": {"vhosts": ["/", "v-" + "y" * 100]}, "comment": "z" * 150},
    )
    assert status == 201, status
    broker = stack.broker_name(0)
    reports = operator.new_page()
    reports.goto("/reports/")
    reports.get_by_role("button", name="Run report now").click()
    expect(reports.locator("#report-state")).to_have_text("succeeded", timeout=REPORT_TIMEOUT)
    report_path = reports.evaluate("location.pathname")
    reports.close()
    queues = open_page(operator, f"/queues/?name_contains={LONG_NAME}")
    link = queues.get_by_role("link", name=LONG_NAME)
    expect(link).to_have_count(1, timeout=LIVE_TIMEOUT)
    queue_path = link.get_attribute("href")
    queues.close()
    pages = {
        "overview": "/",
        "brokers": "/brokers/",
        "broker": f"/brokers/{broker}/",
        "queues": "/queues/",
        "queue": queue_path,
        "exchanges": "/exchanges/",
        "bindings": "/bindings/",
        "config": "/config/",
        "commands": "/commands/",
        "audit": "/audit/",
        "alarms": "/alarms/",
        "reports": "/reports/",
        "report": report_path,
    }
    page = operator.new_page()
    for width in (390, 1366):
        page.set_viewport_size({"width": width, "height": 900})
        for name, path in pages.items():
            page.goto(path)
            if name not in ("reports", "report"):  # not live pages
                live(page)
            if name == "broker":
                # a state dump: a <pre> of JSON, shown by a live update once it is back
                page.get_by_role("button", name="Dump state").click()
                expect(page.locator("#dump-text")).to_contain_text("{", timeout=30_000)
            fits(page, f"{name} at {width}px")
            tables_fit(page, f"{name} at {width}px", scroll_allowed=True)
            screenshot(page, f"fit-{width}-{name}")
    page.close()


def test_a_silent_broker_is_greyed_with_the_age_of_its_last_update(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    assert stack.cluster is not None
    victim = stack.broker_name(3)  # the secondary: no election
    overview = open_page(operator, "/")
    row = overview.locator(f'tr[data-broker="{victim}"]')
    expect(row).not_to_have_class(re.compile(r"\bstale\b"))
    stack.cluster.servers[3].signal(signal.SIGSTOP)
    try:
        expect(row).to_have_class(re.compile(r"\bstale\b"), timeout=LIVE_TIMEOUT)
        note = row.locator(".stale-note")
        expect(note).to_have_text(re.compile(r"^last update \d+ s ago$"))
        first = int(re.findall(r"\d+", note.inner_text())[0])
        expect(note).not_to_have_text(f"last update {first} s ago")  # it counts
        # dimmed (the row may be swapped by a live update meanwhile: the check retries)
        expect(row.locator("th")).to_have_css("opacity", re.compile(r"^0(\.\d+)?$"))
        # the others are fresh
        expect(overview.locator("#broker-table tr.stale")).to_have_count(1)
        screenshot(overview, "stale-broker-row")
        # any value from its statuses, not only its row: its page's peer table too
        own = open_page(operator, f"/brokers/{victim}/")
        expect(own.locator("#peer-links .table-wrap")).to_have_class(
            re.compile(r"\bstale\b"), timeout=LIVE_TIMEOUT
        )
        expect(own.locator("#peer-links .stale-note")).to_have_text(re.compile(r"last update"))
        own.close()
    finally:
        stack.cluster.servers[3].signal(signal.SIGCONT)
    expect(row).not_to_have_class(re.compile(r"\bstale\b"), timeout=LIVE_TIMEOUT)
    expect(row.locator(".stale-note")).to_have_count(0)
    expect(row.locator(".broker-state")).to_have_text("up", timeout=LIVE_TIMEOUT)
    overview.close()


def test_the_page_says_it_is_stale_while_daphne_is_stopped_and_clears_when_it_is_back(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    overview = open_page(operator, "/")
    broker = open_page(operator, f"/brokers/{stack.broker_name(0)}/")
    banner = overview.get_by_role("alert")
    expect(overview.locator("#stale-banner")).to_be_hidden()
    stack.services["daphne"].stop()
    try:
        for page in (overview, broker):
            expect(page.locator("#live-state")).to_have_text("reconnecting")
            stale = page.locator("#stale-banner")
            expect(stale).to_be_visible(timeout=LIVE_TIMEOUT)
            expect(stale).to_contain_text("Console connection lost")
            expect(stale).to_contain_text("stale")
            expect(stale).to_contain_text(re.compile(r"last update \d+ s ago"))
            # the values are dimmed
            expect(page.locator("main")).to_have_css("opacity", re.compile(r"^0(\.\d+)?$"))
        expect(banner).to_contain_text(re.compile(r"last update \d+ s ago"))
        seconds = int(re.findall(r"last update (\d+) s ago", banner.inner_text())[0])
        expect(banner).to_contain_text(f"last update {seconds + 1} s ago")  # counting
        screenshot(overview, "stale-overview")
        overview.set_viewport_size({"width": 390, "height": 844})
        screenshot(overview, "stale-overview-390")
        overview.set_viewport_size({"width": 1366, "height": 900})
    finally:
        stack._start_daphne()
    # the pages reconnect by themselves (htmx's backoff) and fresh data clears the banner
    for page in (overview, broker):
        expect(page.locator("#live-state")).to_have_text("live", timeout=70_000)
        expect(page.locator("#stale-banner")).to_be_hidden(timeout=LIVE_TIMEOUT)
        expect(page.locator("body")).not_to_have_attribute("data-stale", "yes")
        expect(page.locator("main")).to_have_css("opacity", "1")
    screenshot(overview, "stale-cleared")
    overview.close()
    broker.close()
