"""What an operator sees when a broker crashes, stops, drifts or is retired (issue 25),
in Chromium against the real stack.

One stack for the module (Daphne, Redis, Celery worker + beat, three primaries and a
secondary with a 0.3 s heartbeat). In file order, each leaving the cluster whole but
the last: a ``kill -9`` shown as down on the open overview and brokers pages within
2 s, without a reload; a SIGTERM shown as a planned stop (``stopped``, an info event,
no down alarm) and the restart after it; a drift shown key by key (``limits.frame_max``:
the version's value, the broker's, and its source, ``file``) on the configuration
page and the broker page; and a crashed primary decommissioned through its
confirmation page (an up broker is refused), leaving the lists and counts with its
alarm closed and the page saying what to edit in the cluster file. Screenshots go to
var/screenshots/.

The module is ``serial``: its first test holds the console to a 2 s deadline, which
a machine also running browser, Spark and unit tests beside it would make a lottery.
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from playwright.sync_api import BrowserContext, Locator, Page, expect

from tests.browser.support import (
    mark,
    open_page,
    screenshot,
    unreloaded,
)
from tests.console_stack import ConsoleStack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.serial,
    pytest.mark.timeout(300),
]

#: a page must show a change the brokers made within this many milliseconds
LIVE_TIMEOUT = 15_000
#: a crash (the broker's console link closing without ``stopping``) shows within this
CRASH_SHOWN_SECONDS = 2.0
#: after a planned stop, how long a down alarm would have had to appear: the link
#: closing (at once) and stale detection (5 heartbeats of 0.3 s, checked every second)
QUIET_SECONDS = 4.0
#: the version's frame_max, and the one in the drifting broker's own brokerd.toml
VERSION_FRAME_MAX = 65536
FILE_FRAME_MAX = 262144

#: records (Date.now()) when every selector first shows its text, from a mutation
#: observer: what the page showed when, not when a poll happened to look
WATCH = """([selectors, texts]) => {
  window.__rookerySeen = null;
  const shown = sel => {
    const el = document.querySelector(sel);
    return el ? el.textContent.replace(/\\s+/g, " ").trim() : null;
  };
  const check = () => {
    if (window.__rookerySeen === null && selectors.every((s, i) => shown(s) === texts[i])) {
      window.__rookerySeen = Date.now();
    }
  };
  new MutationObserver(check).observe(
    document.documentElement, {subtree: true, childList: true, characterData: true});
  check();
}"""


def root_name(stack: ConsoleStack) -> str:
    """The name (host:port) of the root every running broker agrees on."""
    assert stack.cluster is not None
    spid = stack.cluster.wait_until(stack.cluster.agreed_root, timeout=40)
    for index in stack.cluster.running():
        if stack.cluster.status(index)["spid"] == spid:
            return stack.broker_name(index)
    raise AssertionError(f"no running broker has spid {spid}")


def non_root_primaries(stack: ConsoleStack) -> list[int]:
    """The primaries that are not root: losing one needs no election."""
    root = root_name(stack)
    return [i for i in range(3) if stack.broker_name(i) != root]


def state_cell(name: str) -> str:
    """The state cell of broker ``name``'s row in the broker table."""
    return f'tr[data-broker="{name}"] .broker-state'


def restart(stack: ConsoleStack, index: int, pages: list[Page]) -> None:
    """Start broker ``index`` again; every page shows it up and four of four up."""
    assert stack.cluster is not None
    process = stack.cluster.servers[index]
    if process.proc is not None:
        process.proc.wait(15)
    stack.start_broker(index)
    name = stack.broker_name(index)
    for page in pages:
        expect(page.locator(state_cell(name))).to_have_text("up", timeout=LIVE_TIMEOUT)
    stack.cluster.wait_until(stack.cluster.agreed_root, timeout=40)


def test_a_killed_broker_shows_down_within_two_seconds_without_a_reload(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    assert stack.cluster is not None
    index = non_root_primaries(stack)[-1]
    victim = stack.broker_name(index)
    overview = open_page(operator, "/")
    brokers = open_page(operator, "/brokers/")
    broker = open_page(operator, f"/brokers/{victim}/")
    watched = {
        overview: (state_cell(victim), "#overview-brokers"),
        brokers: (state_cell(victim), "#cluster-bar .brokers-up"),
    }
    expect(overview.locator("#overview-brokers")).to_have_text("4 of 4 up")
    expect(brokers.locator("#cluster-bar .brokers-up")).to_have_text("4 of 4")
    for page, (state, _) in watched.items():
        expect(page.locator(state)).to_have_text("up")
    expect(broker.locator("#broker-summary .broker-state")).to_have_text("up")
    for page in (overview, brokers, broker):
        mark(page)
    overview.evaluate(WATCH, [list(watched[overview]), ["down", "3 of 4 up"]])
    brokers.evaluate(WATCH, [list(watched[brokers]), ["down", "3 of 4"]])
    assert overview.evaluate("window.__rookerySeen") is None
    assert brokers.evaluate("window.__rookerySeen") is None

    killed_at = time.time()
    stack.cluster.kill(index)  # SIGKILL: no `stopping`, the link just closes
    for page, (state, count) in watched.items():
        expect(page.locator(state)).to_have_text("down", timeout=LIVE_TIMEOUT)
        expect(page.locator(count)).to_contain_text("3 of 4")
    seen = {page.url: page.evaluate("window.__rookerySeen") for page in watched}
    assert None not in seen.values(), f"the observer saw no mutation showing it: {seen}"
    latencies = {url: at / 1000 - killed_at for url, at in seen.items()}
    slow = {url: round(s, 2) for url, s in latencies.items() if s > CRASH_SHOWN_SECONDS}
    assert not slow, f"shown down later than {CRASH_SHOWN_SECONDS} s after the kill: {slow}"
    print(
        f"kill -9 of {victim} shown down after "
        + ", ".join(f"{s:.2f} s on {url}" for url, s in latencies.items())
    )
    # the row says why it is grey: down, not ready, with the down alarm beside it
    row = overview.locator(f'#broker-table tr[data-broker="{victim}"]')
    expect(row).to_have_class(re.compile(r"\brow-bad\b"))
    expect(row.locator(".broker-ready")).to_have_text("unknown")
    alarm = overview.locator(f'#active-alarms li[data-kind="broker.down"][data-broker="{victim}"]')
    expect(alarm).to_contain_text("without a planned stop")
    # its own page: down at once, and a warning event for the lost link
    expect(broker.locator("#broker-summary .broker-state")).to_have_text("down")
    lost = broker.locator('#broker-events tr[data-event="link_lost"]').first
    expect(lost).to_have_attribute("data-level", "warning")
    expect(lost).to_contain_text("link lost without a planned stop")
    for page in (overview, brokers, broker):
        assert unreloaded(page), f"{page.url} was reloaded"
    screenshot(overview, "crash-overview-down")
    screenshot(brokers, "crash-brokers-down")
    screenshot(broker, "crash-broker-page")

    restart(stack, index, [overview, brokers])
    expect(overview.locator("#overview-brokers")).to_have_text("4 of 4 up")
    expect(alarm).to_have_count(0, timeout=LIVE_TIMEOUT)
    back = broker.locator('#broker-events tr[data-event="restart"]').first
    expect(back).to_contain_text("restarted without a planned stop", timeout=LIVE_TIMEOUT)
    expect(back).to_have_attribute("data-level", "warning")
    for page in (overview, brokers, broker):
        page.close()


def test_a_planned_stop_shows_stopped_with_an_info_event_and_no_down_alarm(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    assert stack.cluster is not None
    index = 3  # the secondary
    victim = stack.broker_name(index)
    overview = open_page(operator, "/")
    brokers = open_page(operator, "/brokers/")
    alarms = open_page(operator, "/alarms/")
    broker = open_page(operator, f"/brokers/{victim}/")
    pages = [overview, brokers, alarms, broker]
    for page in pages:
        mark(page)
    expect(overview.locator(state_cell(victim))).to_have_text("up")
    expect(overview.locator("#overview-brokers")).to_have_text("4 of 4 up")
    expect(broker.locator('#broker-events tr[data-event="stopping"]')).to_have_count(0)

    process = stack.cluster.servers[index]
    process.signal(signal.SIGTERM)  # brokerd says `stopping` first, then closes
    assert process.proc is not None
    process.proc.wait(15)
    exited = time.monotonic()
    for page in (overview, brokers):
        state = page.locator(state_cell(victim))
        expect(state).to_have_text("stopped", timeout=LIVE_TIMEOUT)
        expect(state.locator(".state")).to_have_attribute("title", "it announced a planned stop")
    expect(overview.locator("#overview-brokers")).to_have_text("3 of 4 up")
    expect(brokers.locator("#cluster-bar .brokers-up")).to_have_text("3 of 4")
    expect(broker.locator("#broker-summary .broker-state")).to_have_text("stopped")
    event = broker.locator('#broker-events tr[data-event="stopping"]')
    expect(event).to_have_count(1, timeout=LIVE_TIMEOUT)
    expect(event).to_have_attribute("data-level", "info")
    expect(event).to_contain_text("planned stop")
    expect(event).to_contain_text("stopping as planned (SIGTERM)")
    expect(broker.locator('#broker-events tr[data-event="link_lost"]')).to_have_count(0)

    # no down alarm, now or once stale detection has had its chance
    left = QUIET_SECONDS - (time.monotonic() - exited)
    if left > 0:
        alarms.wait_for_timeout(left * 1000)
    expect(alarms.locator(f'#active-alarms li[data-broker="{victim}"]')).to_have_count(0)
    expect(overview.locator(f'#active-alarms li[data-broker="{victim}"]')).to_have_count(0)
    history = alarms.locator('#alarm-table tbody tr[data-kind="broker.down"]', has_text=victim)
    expect(history).to_have_count(0)
    expect(broker.locator("#broker-summary ul.alarms")).to_have_count(0)
    expect(overview.locator(state_cell(victim))).to_have_text("stopped")
    for page in pages:
        assert unreloaded(page), f"{page.url} was reloaded"
    screenshot(broker, "planned-stop-broker-page")
    screenshot(alarms, "planned-stop-alarms")
    screenshot(overview, "planned-stop-overview")

    # it comes back: an info event says the restart followed a planned stop
    restart(stack, index, [overview, brokers])
    expect(overview.locator("#overview-brokers")).to_have_text("4 of 4 up")
    back = broker.locator('#broker-events tr[data-event="restart"]').first
    expect(back).to_contain_text("restarted after a planned stop", timeout=LIVE_TIMEOUT)
    expect(back).to_have_attribute("data-level", "info")
    for page in pages:
        page.close()


def frame_max_row(page: Page, within: str) -> Locator:
    """The ``limits.frame_max`` row of the differences table inside ``within``."""
    return page.locator(f'{within} table.in-force-diff tr[data-key="limits.frame_max"]')


def test_a_drift_shows_both_sides_of_each_key_with_the_broker_s_source(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    assert stack.cluster is not None
    index = 3  # the secondary
    victim = stack.broker_name(index)
    config = open_page(operator, "/config/")
    config.get_by_label("Document (JSON)").fill(
        f'{{"limits": {{"frame_max": {VERSION_FRAME_MAX}}}}}'
    )
    config.get_by_role("button", name="Validate and show diff").click()
    expect(config.locator("#config-valid")).to_contain_text("valid")
    config.get_by_label("Comment").fill("smaller frames")
    config.once("dialog", lambda dialog: dialog.accept())
    config.get_by_role("button", name="Save and push").click()
    notice = config.locator("#config-notice")
    expect(notice).to_contain_text(
        re.compile(r"Version \d+ saved and pushed"), timeout=LIVE_TIMEOUT
    )
    number = int(re.findall(r"Version (\d+) saved", notice.inner_text())[0])
    expect(config.locator("#converged")).to_have_text("converged", timeout=LIVE_TIMEOUT)

    # the secondary gets a brokerd.toml of its own (read at start and on SIGHUP)...
    own_file = stack.cluster.nodes[index].home / "brokerd.toml"
    own_file.write_text(f"[limits]\nframe_max = {FILE_FRAME_MAX}\n")
    try:
        row = config.locator(f'#convergence tr[data-broker="{victim}"]')
        stack.cluster.stop(index)
        expect(row).to_have_attribute("data-state", "down", timeout=LIVE_TIMEOUT)
        stack.start_broker(index)
        # ...and runs the version after its hello all the same
        expect(row).to_have_attribute("data-state", "running", timeout=LIVE_TIMEOUT)
        expect(config.locator("#converged")).to_have_text("converged", timeout=LIVE_TIMEOUT)
        detail = config.locator(f'#convergence tr[data-in-force-for="{victim}"]')
        expect(detail).to_have_count(0)
        broker = open_page(operator, f"/brokers/{victim}/")
        expect(broker.locator("#broker-in-force .in-force-same")).to_be_visible(
            timeout=LIVE_TIMEOUT
        )
        mark(config)
        mark(broker)

        # a reload puts its own file back in force: it drifts on limits.frame_max
        stack.cluster.servers[index].signal(signal.SIGHUP)
        expect(row).to_have_attribute("data-state", "drifted", timeout=LIVE_TIMEOUT)
        expect(config.locator("#converged")).to_have_text("not converged")
        expect(detail.locator("details").first).to_have_attribute("open", "")
        sides = ((config, f'tr[data-in-force-for="{victim}"]'), (broker, "#broker-in-force"))
        for page, within in sides:
            frame = frame_max_row(page, within)
            cells = frame.locator("td")
            expect(frame).to_have_count(1, timeout=LIVE_TIMEOUT)
            expect(frame).to_have_attribute("data-status", "changed")
            expect(frame.locator("th")).to_have_text("limits.frame_max")
            expect(cells.nth(0)).to_contain_text("differs")
            expect(cells.nth(1)).to_have_text(str(VERSION_FRAME_MAX))  # the version's side
            expect(cells.nth(2)).to_have_text(str(FILE_FRAME_MAX))  # the broker's side
            expect(cells.nth(3)).to_have_text("file")  # where the broker's value comes from
            headers = page.locator(f"{within} table.in-force-diff thead th")
            expect(headers).to_have_text(
                [
                    "Key",
                    "Difference",
                    re.compile(rf"^(Version|Version {number})$"),
                    "On the broker",
                    "Broker's source",
                ]
            )
        expect(broker.locator("#broker-in-force h2")).to_have_text(
            f"Configuration in force against version {number}"
        )
        # the other brokers still run the version: no difference shown for them
        expect(config.locator("#convergence tr.in-force-row")).to_have_count(1)
        assert unreloaded(config) and unreloaded(broker)
        screenshot(config, "drift-config-page")
        screenshot(broker, "drift-broker-page")

        # pushing the version again ends the drift
        config.once("dialog", lambda dialog: dialog.accept())
        config.locator(f'#config-versions tr[data-version="{number}"]').get_by_role(
            "button", name="Push again"
        ).click()
        expect(row).to_have_attribute("data-state", "running", timeout=LIVE_TIMEOUT)
        expect(detail).to_have_count(0)
        expect(broker.locator("#broker-in-force .in-force-same")).to_be_visible(
            timeout=LIVE_TIMEOUT
        )
        broker.close()
    finally:
        own_file.unlink(missing_ok=True)
    config.close()


def test_a_crashed_broker_is_decommissioned_and_an_up_one_is_refused(
    operator: BrowserContext, stack: ConsoleStack
) -> None:
    assert stack.cluster is not None
    index = non_root_primaries(stack)[0]
    victim = stack.broker_name(index)
    decommission = f"/brokers/{victim}/decommission/"

    # up: no decommission button, the reason instead; the confirmation page and a
    # forged POST say the same (409)
    page = open_page(operator, f"/brokers/{victim}/")
    refusal = f"{victim} is linked to the console and up: stop brokerd on it first"
    expect(page.locator("#decommission-unavailable")).to_contain_text(refusal)
    expect(page.get_by_role("link", name=re.compile("^Decommission"))).to_have_count(0)
    page.goto(decommission)
    expect(page.locator("#decommission-refused")).to_contain_text(refusal)
    expect(page.locator("#decommission-confirm")).to_have_count(0)
    token = next(c["value"] for c in operator.cookies() if c["name"] == "csrftoken")
    forged = page.request.post(
        decommission, form={"confirm": victim}, headers={"X-CSRFToken": token}
    )
    assert forged.status == 409, forged.status
    assert refusal in forged.text()
    screenshot(page, "decommission-refused-up")
    page.close()

    overview = open_page(operator, "/")
    alarms = open_page(operator, "/alarms/")
    own = open_page(operator, f"/brokers/{victim}/")  # open while it is up
    for each in (overview, alarms, own):
        mark(each)
    expect(overview.locator("#overview-brokers")).to_have_text("4 of 4 up")
    # its down alarms so far: an earlier test may have crashed this primary too (the
    # root, hence the non-root ones, may differ after its restart)
    history = '#alarm-table tbody tr[data-kind="broker.down"]'
    earlier = alarms.locator(history, has_text=victim).count()
    stack.cluster.kill(index)
    expect(overview.locator(state_cell(victim))).to_have_text("down", timeout=LIVE_TIMEOUT)
    alarm = f'#active-alarms li[data-kind="broker.down"][data-broker="{victim}"]'
    expect(alarms.locator(alarm)).to_be_visible(timeout=LIVE_TIMEOUT)
    expect(overview.locator("#overview-brokers")).to_have_text("3 of 4 up")
    # its open page follows without a reload: the offer appears, the refusal goes,
    # and its peer table says it is what the broker last reported
    offer = own.get_by_role("link", name=f"Decommission {victim}…")
    expect(offer).to_be_visible(timeout=LIVE_TIMEOUT)
    expect(own.locator("#decommission-unavailable")).to_have_count(0)
    expect(own.locator("#peer-links-old")).to_contain_text("as it last reported them")
    assert unreloaded(own), "the broker page was reloaded"
    screenshot(own, "decommission-offered-live")
    own.close()

    # down: its page offers decommissioning; the confirmation page asks for the name
    page = open_page(operator, f"/brokers/{victim}/")
    page.get_by_role("link", name=f"Decommission {victim}…").click()
    expect(page).to_have_url(re.compile(re.escape(decommission) + "$"))
    expect(page.get_by_role("heading", name=f"Decommission broker {victim}")).to_be_visible()
    steps = page.locator("#decommission-steps li")
    expect(steps.first).to_contain_text(f"Remove {victim} from known_hosts in the cluster file")
    name_box = page.get_by_label(re.compile(r"^Type the broker's name"))
    retire = page.get_by_role("button", name=f"Retire {victim}")
    # a wrong name retires nothing
    name_box.fill("127.0.0.1:1")
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        retire.click()
    assert answer.value.status == 400, answer.value.status
    expect(page.locator("#decommission-error")).to_contain_text(
        f"type the broker's name, {victim}, to retire it"
    )
    expect(overview.locator(f'#broker-table tr[data-broker="{victim}"]')).to_have_count(1)
    page.get_by_label(re.compile(r"^Type the broker's name")).fill(victim)
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.get_by_role("button", name=f"Retire {victim}").click()
    assert answer.value.status == 200, answer.value.status
    done = page.locator("#decommission-done")
    expect(done).to_contain_text(f"{victim} is retired")
    expect(done).to_contain_text("1 active alarm closed")
    expect(page.locator("#decommission-steps li").first).to_have_text(
        f"Remove {victim} from known_hosts in the cluster file on every server "
        "(the cluster file is the authority on membership; the console cannot edit it)."
    )
    screenshot(page, "decommission-done")

    # every open page follows: out of the lists and counts, its alarm closed
    expect(overview.locator(f'#broker-table tr[data-broker="{victim}"]')).to_have_count(
        0, timeout=LIVE_TIMEOUT
    )
    expect(overview.locator("#broker-table tbody tr[data-broker]")).to_have_count(3)
    expect(overview.locator("#overview-brokers")).to_have_text("3 of 3 up")
    expect(overview.locator(f'#active-alarms li[data-broker="{victim}"]')).to_have_count(0)
    expect(alarms.locator(alarm)).to_have_count(0, timeout=LIVE_TIMEOUT)
    closed = alarms.locator(history, has_text=victim)
    expect(closed).to_have_count(earlier + 1)
    expect(closed.first).to_contain_text("cleared")
    expect(alarms.locator("#cluster-bar .brokers-up")).to_have_text("3 of 3")
    for each in (overview, alarms):
        assert unreloaded(each), f"{each.url} was reloaded"
    brokers = open_page(operator, "/brokers/")
    expect(brokers.locator("#broker-table tbody tr[data-broker]")).to_have_count(3)
    expect(brokers.locator(f'tr[data-broker="{victim}"]')).to_have_count(0)
    # its page stays, as history, with no decommission offered again
    page.goto(f"/brokers/{victim}/")
    expect(page.locator("#broker-retired")).to_contain_text("decommissioned by an operator")
    expect(page.locator("#broker-decommission")).to_be_hidden()
    expect(page.get_by_role("link", name=re.compile("^Decommission"))).to_have_count(0)
    screenshot(overview, "decommission-overview")
    screenshot(alarms, "decommission-alarms")
    for each in (page, overview, alarms, brokers):
        each.close()
