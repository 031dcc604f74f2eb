"""The bridges as the console shows them (issue 42): the current configuration's
definitions, each with the state the broker running it last reported.

Brokers report the bridges they run in every status (``status.view.bridges``,
checked by ``linkparse.bridges``); the definitions are the current version's
``bridges`` part, passwords redacted (``passwords.hidden``). A defined bridge
no broker that is up reports is shown ``not running`` (not placed yet, its
server lost, or pushed to no broker yet); one a broker runs that the version
does not define (its own ``ctl bridges``) is shown too.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from clusterapi import configs, passwords
from clusterapi.models import Broker

NOT_RUNNING = "not running"


def rows() -> list[dict[str, Any]]:
    """One row per bridge: definition (redacted), broker, state, reason, counts, rate."""
    version = configs.current()
    document = passwords.hidden(version.document) if version is not None else {}
    defined = {(b["vhost"], b["name"]): b["value"] for b in document.get("bridges") or ()}
    reported: dict[tuple[str, str], dict[str, Any]] = {}
    for broker in Broker.objects.filter(state=Broker.STATE_UP).order_by("name"):
        for row in (broker.view or {}).get("bridges") or ():
            key = (row["vhost"], row["name"])
            since = row.get("since")
            entry = {
                **row,
                "broker": broker.name,
                "since_at": dt.datetime.fromtimestamp(since, dt.UTC) if since else None,
            }
            # two brokers briefly running one (a move under way): the running one shows
            if key not in reported or row["state"] == "running":
                reported[key] = entry
    out = []
    for key in sorted(defined.keys() | reported.keys()):
        row = reported.get(key) or {
            "vhost": key[0],
            "name": key[1],
            "state": NOT_RUNNING,
            "reason": "no broker runs it now",
            "broker": "",
            "since_at": None,
            "rate": 0.0,
            "forwarded": 0,
            "acknowledged": 0,
            "requeued": 0,
            "in_flight": 0,
            "backlog": None,
            "src_uri": "",
            "dest_uri": "",
        }
        value = defined.get(key)
        if value is not None:  # where it leads, whether or not a broker runs it now
            row = {
                **row,
                "src_uri": row["src_uri"] or _first(value.get("src-uri")),
                "dest_uri": row["dest_uri"] or _first(value.get("dest-uri")),
            }
        out.append({**row, "defined": value is not None, "definition": value})
    return out


def _first(uris: Any) -> str:
    """A definition's first URI (a key may hold one, or a list to try in turn)."""
    if isinstance(uris, list):
        return str(uris[0]) if uris else ""
    return str(uris or "")
