"""Playwright + Debian's Chromium against the real console stack.

The stack (tests/console_stack.py) is Redis, Daphne, Celery worker + beat and
three primaries plus one secondary linked to the console with a 0.3 s
heartbeat. Static files are what ``collectstatic`` gathers (console.css,
dashboard.js, and htmx, its ws extension and uPlot from node_modules).
Chromium is ``/usr/bin/chromium`` (Debian's package), never a Playwright download.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, sync_playwright

from tests.console_stack import ConsoleStack, console_stack  # noqa: F401

CHROMIUM = Path(os.environ.get("ROOKERY_CHROMIUM", "/usr/bin/chromium"))


@pytest.fixture(scope="module")
def stack(console_stack: ConsoleStack) -> Iterator[ConsoleStack]:  # noqa: F811
    """The console with 3 primaries + 1 secondary that agree on a root."""
    console_stack.manage("collectstatic", "--noinput")
    cluster = console_stack.start_cluster(3, secondaries=1)
    cluster.wait_until(cluster.agreed_root, timeout=40)
    yield console_stack


@pytest.fixture(scope="module")
def browser(stack: ConsoleStack) -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def width() -> int:
    """How wide an operator's pages are; a module overrides it for another screen."""
    return 1366


@pytest.fixture(scope="module")
def operator(browser: Browser, stack: ConsoleStack, width: int) -> Iterator[BrowserContext]:
    """A logged-in operator's browser session, shared by a module's pages."""
    from tests.browser.support import operator_session

    context = operator_session(browser, stack, width)
    yield context
    context.close()
