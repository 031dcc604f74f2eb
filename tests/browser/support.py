"""Helpers of the browser tests: contexts that get static files, login, screenshots."""

from __future__ import annotations

import mimetypes
from collections.abc import Callable
from pathlib import Path

from playwright.sync_api import Browser, BrowserContext, Page, Route, expect

from tests.console_stack import OPERATOR, ConsoleStack

SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"


def serve_static(stack: ConsoleStack) -> Callable[[Route], None]:
    """Answer ``/static/...`` from ``STATIC_ROOT`` (collectstatic's output), as the
    nginx of deploy/nginx does in front of Daphne, which serves no static files."""
    root = (stack.data_dir / "static").resolve()
    prefix = f"{stack.http_url}/static/"

    def handle(route: Route) -> None:
        url = route.request.url.split("?", 1)[0]
        path = (root / url.removeprefix(prefix)).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            route.fulfill(status=404, body="not found")
            return
        ctype = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        route.fulfill(status=200, body=path.read_bytes(), headers={"Content-Type": ctype})

    return handle


def new_context(browser: Browser, stack: ConsoleStack, **options: object) -> BrowserContext:
    context = browser.new_context(base_url=stack.http_url, **options)
    context.route(f"{stack.http_url}/static/**", serve_static(stack))
    context.set_default_timeout(15_000)
    return context


def login(context: BrowserContext, user: tuple[str, str]) -> Page:
    """A new page of ``context``, logged in as ``user``, on the overview, live."""
    page = context.new_page()
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(user[0])
    page.get_by_label("Password").fill(user[1])
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Cluster overview")).to_be_visible()
    live(page)
    return page


def operator_session(browser: Browser, stack: ConsoleStack, width: int) -> BrowserContext:
    """A logged-in operator's browser session, ``width`` pixels wide."""
    context = new_context(browser, stack, viewport={"width": width, "height": 900})
    login(context, OPERATOR).close()
    return context


def open_page(context: BrowserContext, path: str) -> Page:
    """A new page at ``path``, once its live connection is up."""
    page = context.new_page()
    page.goto(path)
    live(page)
    return page


def live(page: Page) -> None:
    """Wait until the page's websocket is open (its indicator says "live")."""
    expect(page.locator("#live-state")).to_have_text("live")


def mark(page: Page) -> None:
    """Tag the page's window; :func:`unreloaded` fails if the page was loaded again."""
    page.evaluate("window.__rookeryMark = 'kept'")


def unreloaded(page: Page) -> bool:
    return page.evaluate("window.__rookeryMark") == "kept"


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
