"""The rendered API docs page shows ``Authorization: Token <your-token>`` (issue 25).

Swagger UI (the sidecar's files) in Debian's Chromium against ``live_server``: the
text a person reads, after the page's Markdown rendering and HTML sanitising.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHROMIUM = Path(os.environ.get("ROOKERY_CHROMIUM", "/usr/bin/chromium"))


def test_the_docs_page_shows_the_token_placeholder(live_server: Any) -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            page = browser.new_page()
            page.goto(f"{live_server.url}/api/v1/docs/")
            info = page.locator(".swagger-ui .info .description")
            info.wait_for(timeout=15_000)
            text = info.inner_text()
        finally:
            browser.close()
    assert "Authorization: Token <your-token>" in text, text
