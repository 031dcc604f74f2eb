"""What the configuration page shows: the current version, what each broker reports
running, the versions, and the editor's diffs.

Convergence is read from the brokers' own reports (``clusterapi.convergence``):
"converged" appears only while every broker reports running the current version,
after restarts and reloads too. The editor opens on the current document and
shows how it differs from what the brokers run, so an operator sees drift before
pushing; the keys a document leaves out are listed with the default they mean.
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from typing import Any

from django.http import QueryDict

from clusterapi import configs, convergence, passwords
from clusterapi.models import Broker, ConfigVersion
from console.dashboard.readable import with_stamps


def pretty(document: Any) -> str:
    """A document as the editor shows it and diffs compare it (sorted keys, 2 spaces),
    without users' password hashes: they are write-only (``clusterapi.passwords``; a
    user saved back without one keeps it)."""
    return json.dumps(passwords.hidden(document), indent=2, sort_keys=True)


def diff(current: Any, proposed: Any, current_label: str, proposed_label: str = "edited"):
    """Unified diff of two documents as (css class, line) pairs; empty when equal."""
    lines = difflib.unified_diff(
        pretty(current).splitlines() if current is not None else [],
        pretty(proposed).splitlines(),
        fromfile=current_label,
        tofile=proposed_label,
        lineterm="",
    )
    out = []
    for line in lines:
        if line.startswith(("+++", "---")):
            kind = "head"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "same"
        out.append((kind, line))
    return out


def running_diffs(document: dict[str, Any], label: str) -> list[dict[str, Any]]:
    """For each configuration the brokers that are up report running, other than
    ``document``: which brokers, what it is, and the diff from it to ``document``.

    A broker on its own files reports everything in force (heartbeat, known hosts,
    limits...), but pushing ``document`` changes only the parts it sets: the others
    keep the broker's own values. So only those parts are diffed, and the rest are
    named as kept (``kept``), not shown as removed."""
    _, checksum = configs.validate(document)
    out = []
    for group in convergence.running_groups(exclude_checksum=checksum):
        running = group["document"]
        kept: list[str] = []
        if running is not None and not group["checksum"]:
            kept = sorted(part for part in running if part not in document)
            running = {part: value for part, value in running.items() if part in document}
        out.append(
            {
                **group,
                "kept": kept,
                "changes": diff(running, document, group["label"], label)
                if running is not None
                else None,
            }
        )
    return out


def build_config(params: QueryDict) -> dict[str, Any]:
    """The page's context (its live fragments: convergence, versions, what brokers run)."""
    version = configs.current()
    up = Broker.objects.filter(state=Broker.STATE_UP)
    running = Counter(up.values_list("config_checksum", flat=True))
    versions = list(ConfigVersion.objects.select_related("created_by").order_by("-number")[:20])
    for item in versions:
        item.running_count = running.get(item.checksum, 0)
        item.is_current = version is not None and item.pk == version.pk
    rows = convergence.broker_rows(version) if version is not None else []

    return {
        "version": version,
        "convergence": rows,
        "converged": convergence.converged(rows),
        "convergence_summary": convergence.summary(rows) if rows else "",
        "versions": with_stamps(versions, "created_at", "pushed_at"),
        "current_text": pretty(version.document) if version is not None else "",
        "unset": convergence.unset_keys(version.document if version else {}),
        "broker_total": Broker.objects.active().count(),
        "brokers_up": sum(running.values()),
        "running": running_diffs(
            version.document if version is not None else {},
            f"version {version.number}" if version is not None else "no version",
        ),
    }
