"""Values as a person reads them: times (words, ISO 8601 on hover) and audit details.

Pages never show a raw ISO timestamp or a Python dict: a time is "3 min ago" or
"5 Jan 2026 14:03:07 UTC" inside a ``<time>`` element whose ``title`` is the
ISO form (``templates/dashboard/when.html``), and an audit entry's details are
"key: value" pairs.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.utils import timezone


@dataclass(frozen=True)
class Stamp:
    """A time as pages show it: ``text`` in words, ``iso`` on hover and in ``datetime``."""

    iso: str
    text: str
    #: "ago": ``text`` is relative and static/dashboard.js keeps it ticking
    kind: str = "ago"


def relative(delta: dt.timedelta) -> str:
    """``"12 s ago"``, ``"3 min ago"``, ``"in 5 s"`` (static/dashboard.js keeps it ticking)."""
    seconds = delta.total_seconds()
    future, span = seconds < 0, abs(seconds)
    if span < 1:
        return "just now"
    if span < 60:
        text = f"{int(span)} s"
    elif span < 3600:
        text = f"{int(span // 60)} min"
    elif span < 86400:
        text = f"{int(span // 3600)} h"
    else:
        text = f"{int(span // 86400)} d"
    return f"in {text}" if future else f"{text} ago"


def iso(value: dt.datetime) -> str:
    """ISO 8601 in UTC with a Z, to the second (what the hover shows)."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp(value: dt.datetime | None, now: dt.datetime | None = None) -> Stamp | None:
    """A recent time: relative words."""
    if value is None:
        return None
    return Stamp(iso=iso(value), text=relative((now or timezone.now()) - value))


def absolute(value: Any) -> Stamp | None:
    """A time of a report (often days ago): the date and time in words, UTC. Takes a
    datetime or the ISO text a report's summary carries; anything else is None."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    utc = value.astimezone(dt.UTC)
    return Stamp(iso=iso(utc), text=f"{utc.day} {utc:%b %Y %H:%M:%S} UTC", kind="at")


def with_stamps(objects: Iterable[Any], *fields: str) -> list[Any]:
    """The objects as a list, each with ``<field>_stamp`` set for every field."""
    now = timezone.now()
    out = list(objects)
    for obj in out:
        for name in fields:
            setattr(obj, f"{name}_stamp", stamp(getattr(obj, name), now))
    return out


def detail_items(details: Any) -> list[tuple[str, str]]:
    """An audit entry's details as (key, text) pairs: strings as they are, lists joined,
    anything nested as compact JSON; a non-object as one unnamed item."""
    if not isinstance(details, dict):
        return [("", _text(details))] if details not in (None, "", [], {}) else []
    return [(str(key), _text(value)) for key, value in details.items() if value not in (None, "")]


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(", ", ": "), sort_keys=True)
    return str(value)
