"""Times as summary.json writes them: ISO 8601 in UTC with a ``Z`` (no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with a ``Z``; a naive time is UTC."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def epoch_iso(seconds: float | None) -> str | None:
    return None if seconds is None else iso(datetime.fromtimestamp(seconds, tz=UTC))
