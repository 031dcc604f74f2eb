"""Time the console's pages in a real browser, as an operator opens them.

    python -m clusterapi.bench.pageload --console http://127.0.0.1:8010 \\
        --user op --password PASSWORD --repeat 3 --json pages.json

Debian's Chromium (``/usr/bin/chromium``) through Playwright logs in once, then
opens each page ``--repeat`` times and reads the browser's own timings: first
paint and first contentful paint, DOMContentLoaded and load (from navigation
start), and the document's size. Run it beside ``clusterapi.bench.linkload`` to
see the pages at the scale the fake brokers make (issue 43: 50 brokers x 1,000
queues).

The console serves no static files without DEBUG (a deployment's web server does:
deploy/nginx), so ``--static-root`` (its ``manage.py collectstatic`` directory)
serves ``/static/`` to the browser from disk, as that server would: the pages'
scripts run, the live ones open their websockets.

With ``--live SECONDS --sent-log FILE`` it then keeps the overview open that long
and measures its live updates: how late the page shows each status, from the
moment linkload sent it (the ``time`` of its ``--sent-log``, written as it goes) to
the moment the page's broker table shows it. Linkload must run with
``--tag-connections``, so a broker's Connections cell is the seq of the status the
page is showing; the page's script notes each broker's value after every live
message the htmx ws extension swaps in. A status counts as shown when its broker's
row shows it or a later one (the page renders at most a few times a second, so a
broker's statuses can be superseded before a render). Statuses sent in the last
``LIVE_MARGIN`` seconds are left out (their render may come after the window).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import BrowserContext, Page, Route, sync_playwright

from clusterapi.bench.meters import percentile

PAGES = ("/", "/brokers/", "/queues/", "/exchanges/", "/bindings/", "/alarms/", "/bridges/")
CHROMIUM = "/usr/bin/chromium"
#: seconds at the end of a live window whose statuses are not counted
LIVE_MARGIN = 5.0

TIMINGS = """async () => {
  // headless Chromium reports paints a frame or two after load: wait for them a moment
  const paints = await new Promise((resolve) => {
    const seen = () => performance.getEntriesByType('paint');
    if (seen().length >= 2) return resolve(seen());
    new PerformanceObserver(() => { if (seen().length >= 2) resolve(seen()); })
      .observe({type: 'paint', buffered: true});
    setTimeout(() => resolve(seen()), 2000);
  });
  const nav = performance.getEntriesByType('navigation')[0];
  const at = (name) => {
    const entry = paints.find((e) => e.name === name);
    return entry ? entry.startTime : null;
  };
  return {
    fp_ms: at('first-paint'),
    fcp_ms: at('first-contentful-paint'),
    dom_ms: nav.domContentLoadedEventEnd,
    load_ms: nav.loadEventEnd,
    bytes: nav.transferSize,
  };
}"""

#: after every live message: each broker row's Connections cell (the status's seq)
WATCH = """() => {
  window.__liveSeen = [];
  window.__liveMessages = 0;
  document.addEventListener('htmx:wsAfterMessage', (evt) => {
    const t = performance.timeOrigin + performance.now();
    window.__liveMessages += 1;
    for (const row of document.querySelectorAll('#broker-table tr[data-broker]')) {
      const cell = row.querySelector('td.num');
      const seq = cell ? parseInt(cell.textContent, 10) : NaN;
      if (!Number.isNaN(seq)) window.__liveSeen.push([row.dataset.broker, seq, t / 1000]);
    }
  });
}"""


def serve_static(context: BrowserContext, base: str, root: Path) -> None:
    """Answer the browser's ``/static/`` requests from ``root`` (a web server's job)."""
    prefix = f"{base}/static/"
    resolved = root.resolve()

    def answer(route: Route) -> None:
        path = (root / route.request.url[len(prefix) :].split("?")[0]).resolve()
        if path.is_file() and path.is_relative_to(resolved):
            route.fulfill(path=path)
        else:
            route.fulfill(status=404, body="not found")

    context.route(f"{prefix}**", answer)


def log_in(page: Page, base: str, user: str, password: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/accounts/login/" not in url, timeout=30_000)


def measure(page: Page, url: str) -> dict[str, Any]:
    page.goto(url, wait_until="load", timeout=120_000)
    timings = page.evaluate(TIMINGS)
    return {key: None if value is None else round(value, 1) for key, value in timings.items()}


def read_sent(path: Path) -> list[tuple[str, int, float]]:
    """(broker, seq, time) of every status linkload's ``--sent-log`` lists so far."""
    with path.open() as f:
        return [(row["broker"], int(row["seq"]), float(row["time"])) for row in csv.DictReader(f)]


def live_lag(
    seen: list[tuple[str, int, float]], sent: list[tuple[str, int, float]], start: float, end: float
) -> dict[str, Any]:
    """How late the page showed each status sent in ``[start, end - LIVE_MARGIN)``: the
    first time its broker's row showed it or a later one, less when it was sent."""
    shown: dict[str, list[tuple[int, float]]] = {}
    for name, seq, t in seen:
        shown.setdefault(name, []).append((seq, t))
    lags: list[float] = []
    exact = missed = 0
    for name, seq, sent_at in sent:
        if not start <= sent_at < end - LIVE_MARGIN:
            continue
        first = next(((s, t) for s, t in shown.get(name, []) if s >= seq), None)
        if first is None:
            missed += 1
            continue
        exact += first[0] == seq
        lags.append(1000 * max(0.0, first[1] - sent_at))
    return {
        "statuses": len(lags) + missed,
        "shown": len(lags),
        "shown_exactly": exact,
        "not_shown": missed,
        "lag_ms": {
            "p50": round(percentile(lags, 50) or 0, 1) if lags else None,
            "p95": round(percentile(lags, 95) or 0, 1) if lags else None,
            "max": round(max(lags), 1) if lags else None,
            "mean": round(statistics.fmean(lags), 1) if lags else None,
        },
    }


def live(page: Page, base: str, seconds: float, sent_log: Path) -> dict[str, Any]:
    """Open the overview, wait for its websocket, and watch its live updates."""
    page.add_init_script(f"({WATCH})();")
    opened = measure(page, base + "/")
    page.wait_for_selector('#live-state[data-state="open"]', state="attached", timeout=60_000)
    start = time.time()
    page.wait_for_timeout(1000 * seconds)
    end = time.time()
    seen = [(str(n), int(s), float(t)) for n, s, t in page.evaluate("window.__liveSeen")]
    messages = int(page.evaluate("window.__liveMessages"))
    return {
        "page": "/",
        "opened": opened,
        "seconds": round(end - start, 1),
        "messages": messages,
        "messages_per_s": round(messages / (end - start), 2),
        **live_lag(seen, read_sent(sent_log), start, end),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = args.console.rstrip("/")
    out: dict[str, Any] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium)
        try:
            context = browser.new_context(viewport={"width": 1366, "height": 900})
            if args.static_root is not None:
                serve_static(context, base, args.static_root)
            page = context.new_page()
            log_in(page, base, args.user, args.password)
            for path in args.pages:
                runs = [measure(page, base + path) for _ in range(args.repeat)]
                out[path] = {
                    key: round(statistics.median(r[key] for r in runs), 1)
                    for key in ("fp_ms", "fcp_ms", "dom_ms", "load_ms", "bytes")
                    if all(r[key] is not None for r in runs)
                }
            if args.live:
                out["live"] = live(context.new_page(), base, args.live, args.sent_log)
        finally:
            browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--console", required=True, help="http://host:port")
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--pages", nargs="*", default=list(PAGES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chromium", default=CHROMIUM)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--static-root", type=Path, help="serve /static/ from here (collectstatic's directory)"
    )
    parser.add_argument(
        "--live", type=float, default=0.0, help="then watch the overview's live updates so long"
    )
    parser.add_argument(
        "--sent-log", type=Path, help="linkload's --sent-log (with --tag-connections)"
    )
    args = parser.parse_args(argv)
    if args.live and args.sent_log is None:
        parser.error("--live needs --sent-log")
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
