"""Time the console's pages in a real browser, as an operator opens them.

    python -m clusterapi.bench.pageload --console http://127.0.0.1:8010 \\
        --user op --password PASSWORD --repeat 3 --json pages.json

Debian's Chromium (``/usr/bin/chromium``) through Playwright logs in once, then
opens each page ``--repeat`` times and reads the browser's own timings: first
contentful paint, DOMContentLoaded and load (from navigation start), and the
document's size. Run it beside ``clusterapi.bench.linkload`` to see the pages at
the scale the fake brokers make (issue 43: 50 brokers x 1,000 queues).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from playwright.sync_api import Page, sync_playwright

PAGES = ("/", "/brokers/", "/queues/", "/exchanges/", "/bindings/", "/alarms/", "/bridges/")
CHROMIUM = "/usr/bin/chromium"

TIMINGS = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const paint = performance.getEntriesByName('first-contentful-paint')[0];
  return {
    fcp_ms: paint ? paint.startTime : null,
    dom_ms: nav.domContentLoadedEventEnd,
    load_ms: nav.loadEventEnd,
    bytes: nav.transferSize,
  };
}"""


def log_in(page: Page, base: str, user: str, password: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(lambda url: "/accounts/login/" not in url, timeout=30_000)


def measure(page: Page, url: str) -> dict[str, Any]:
    page.goto(url, wait_until="load", timeout=120_000)
    return dict(page.evaluate(TIMINGS))


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = args.console.rstrip("/")
    out: dict[str, Any] = {}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium)
        try:
            page = browser.new_context(viewport={"width": 1366, "height": 900}).new_page()
            log_in(page, base, args.user, args.password)
            for path in args.pages:
                runs = [measure(page, base + path) for _ in range(args.repeat)]
                out[path] = {
                    key: round(statistics.median(r[key] for r in runs), 1)
                    for key in ("fcp_ms", "dom_ms", "load_ms", "bytes")
                    if all(r[key] is not None for r in runs)
                }
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
    args = parser.parse_args(argv)
    report = run(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
