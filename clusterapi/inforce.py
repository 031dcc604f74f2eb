"""What a broker runs, against the console's version: a per-key diff with sources.

A broker reports the configuration in force (``hello``, and a ``status`` whenever it
changed) as ``{"document": ..., "sources": ...}``: the document in the shape of the
console's configuration document (users without password hashes) and, per part (per
key for limits), whether it came from the console, the broker's files or the
defaults (docs/protocol.md). A drift is then shown key by key instead of as a
checksum mismatch: which keys the version sets that the broker does not run, which
the broker runs that the version does not have, which differ, and where the
broker's value comes from.
"""

from __future__ import annotations

from typing import Any

from clusterapi import passwords
from clusterapi.linkparse import LinkProtocolError

SOURCES = ("console", "file", "default")
#: parts whose dictionaries are compared key by key
KEYED = ("heartbeat", "limits")
#: parts that are sets of names
NAMED = ("known_hosts", "vhosts")
MAX_SOURCES = 10_000

ADDED, REMOVED, CHANGED, SAME, OWN = "added", "removed", "changed", "same", "own"
#: a status, in words, for the pages
WORDS = {
    ADDED: "only on the broker",
    REMOVED: "only in the version",
    CHANGED: "differs",
    SAME: "same",
    OWN: "not set by the version (the broker's own)",
}


def parse(value: Any, where: str) -> dict[str, Any]:
    """A reported ``in_force``, checked before it is stored (malformed: close 4400).
    Password hashes are dropped should a broker ever send one: the console keeps none
    but its own."""
    if not isinstance(value, dict):
        raise LinkProtocolError(f"{where}.in_force must be an object")
    document, sources = value.get("document"), value.get("sources")
    if not isinstance(document, dict):
        raise LinkProtocolError(f"{where}.in_force.document must be an object")
    if not isinstance(sources, dict) or len(sources) > MAX_SOURCES:
        raise LinkProtocolError(f"{where}.in_force.sources must be an object")
    for key, source in sources.items():
        if len(key) > 255 or source not in SOURCES:
            raise LinkProtocolError(
                f"{where}.in_force.sources[{key[:40]!r}] must be console, file or default"
            )
    return {"document": without_hashes(document), "sources": dict(sources)}


def without_hashes(document: dict[str, Any]) -> dict[str, Any]:
    users = document.get("users")
    if not isinstance(users, list):
        return dict(document)
    return {
        **document,
        "users": [
            {k: v for k, v in u.items() if k != "password_hash"} if isinstance(u, dict) else u
            for u in users
        ],
    }


def flatten(document: dict[str, Any]) -> dict[str, Any]:
    """``{key: value}`` with one key per thing an operator sets: ``limits.frame_max``,
    ``heartbeat.interval``, ``vhost_limits./.max_queues``, ``users.app`` (its tags),
    ``permissions.app@/``, ``known_hosts`` and ``vhosts`` (sorted lists)."""
    out: dict[str, Any] = {}
    for part, value in without_hashes(document).items():
        if part in KEYED and isinstance(value, dict):
            out.update({f"{part}.{key}": item for key, item in value.items()})
        elif part == "vhost_limits" and isinstance(value, dict):
            for vhost, limits in value.items():
                if isinstance(limits, dict):
                    out.update({f"{part}.{vhost}.{key}": item for key, item in limits.items()})
        elif part == "users" and isinstance(value, list):
            for user in value:
                if isinstance(user, dict):
                    tags = user.get("tags") or []
                    out[f"users.{user.get('name')}"] = {"tags": sorted(map(str, tags))}
        elif part == "permissions" and isinstance(value, list):
            for perm in value:
                if isinstance(perm, dict):
                    key = f"permissions.{perm.get('user')}@{perm.get('vhost')}"
                    out[key] = {k: perm.get(k) for k in ("configure", "write", "read")}
        elif part in NAMED and isinstance(value, list):
            out[part] = sorted(map(str, value))
        else:
            out[part] = value
    return out


def source_of(key: str, sources: dict[str, str]) -> str:
    """Where the broker's value of ``key`` comes from: per key, else per part."""
    return sources.get(key) or sources.get(key.split(".", 1)[0]) or ""


def diff(version_document: dict[str, Any] | None, in_force: dict[str, Any]) -> list[dict]:
    """Every key of either side: the version's value, the broker's, its source, and
    ``status``: ``added`` (the broker runs it, the version does not have it),
    ``removed`` (the version sets it, the broker does not run it), ``changed``,
    ``same``, or ``own`` (a part the version leaves to the broker's files)."""
    version_document = version_document or {}
    ours = flatten(version_document)
    theirs = flatten(in_force.get("document") or {})
    sources = in_force.get("sources") or {}
    rows = []
    for key in sorted(set(ours) | set(theirs)):
        part = key.split(".", 1)[0]
        if part not in version_document:
            status = OWN
        elif key not in theirs:
            status = REMOVED
        elif key not in ours:
            status = ADDED
        elif ours[key] != theirs[key]:
            status = CHANGED
        else:
            status = SAME
        rows.append(
            {
                "key": key,
                "status": status,
                "words": WORDS[status],
                "version": ours.get(key),
                "broker": theirs.get(key),
                "in_version": key in ours,
                "on_broker": key in theirs,
                "source": source_of(key, sources) if key in theirs else "",
            }
        )
    return rows


def view(version_document: dict[str, Any] | None, in_force: dict[str, Any] | None) -> dict:
    """What a page shows: the differences, the rest, counts (``None``: not reported)."""
    if not in_force:
        return {"reported": False}
    rows = diff(passwords.hidden(version_document), in_force)  # bridges' URIs redacted
    differences = [r for r in rows if r["status"] in (ADDED, REMOVED, CHANGED)]
    return {
        "reported": True,
        "differences": differences,
        "rows": rows,
        "same": sum(1 for r in rows if r["status"] == SAME),
        "own": sum(1 for r in rows if r["status"] == OWN),
    }
