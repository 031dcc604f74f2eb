"""The console logs one access line per request (the server's), never Django's copies."""

from __future__ import annotations

import logging

import pytest
from django.test import Client


@pytest.mark.django_db
def test_a_404_and_a_401_add_no_log_line_of_their_own(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert Client().get("/no-such-page/").status_code == 404
        assert Client().get("/api/v1/brokers/").status_code == 401
    assert [r.getMessage() for r in caplog.records if r.name.startswith("django")] == []


def test_django_loggers_have_no_handler_of_their_own() -> None:
    """Their records reach the root's one handler once (Django's defaults add a console
    handler under DEBUG and one for django.server: each request logged twice)."""
    for name in ("django", "django.server", "django.channels.server", "django.request"):
        logger = logging.getLogger(name)
        assert logger.handlers == [] and logger.propagate, name
    assert logging.getLogger("django.request").level == logging.ERROR  # 5xx still logged
