"""The console's settings variables, cleared wherever a test starts the console.

Tests that run ``console.settings`` in another process (the settings tests, the
console stack, the quickstart) start from the caller's environment minus these,
so that nothing in the outer shell leaks into the settings under test.
"""

from __future__ import annotations

import os

# Every variable console/settings.py reads, and the settings module's own name.
CONSOLE_SETTINGS_ENV = (
    "DJANGO_SETTINGS_MODULE",
    "DATA_DIR",
    "DEBUG",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "DATABASE_URL",
    "REDIS_URL",
    "CONSOLE_BROKER_TOKEN",
    "COMMAND_TIMEOUT_SECONDS",
    "COMMAND_RETRY_SECONDS",
    "BROKER_STALE_INTERVALS",
    "STALE_CHECK_SECONDS",
    "HEARTBEAT_RETENTION",
    "QUEUE_SAMPLE_SECONDS",
    "SPARK_MASTER",
    "ARCHIVE_AFTER",
    "ARCHIVE_BATCH_ROWS",
    "LAKE_PATH",
    "REPORTS_DIR",
    "REPORT_TIMEOUT_SECONDS",
    "REPORT_NIGHTLY_AT",
    "CONSOLE_HTTPS",
    "SESSION_COOKIE_AGE",
    "AXES_FAILURE_LIMIT",
    "AXES_COOLOFF_MINUTES",
    "LOG_LEVEL",
    "MAX_REQUEST_BODY_BYTES",
    "MAX_JSON_DEPTH",
)


def environ_without(names: tuple[str, ...] = CONSOLE_SETTINGS_ENV) -> dict[str, str]:
    """A copy of ``os.environ`` without ``names``."""
    return {k: v for k, v in os.environ.items() if k not in names}
