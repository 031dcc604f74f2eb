"""Convergence: which configuration each broker runs, by its own report.

Every hello, status and ``config.apply`` ack carries the console version the
broker's live configuration comes from (docs/protocol.md); the console keeps it
on :class:`Broker` (``config_version``, ``config_checksum``, empty when the
broker runs its own files). A broker runs a version when the checksum it reports
is the version's, after restarts and reloads alike, so "converged" is never
read from acknowledgements that a restart made stale. A broker that runs
something else while no push to it is in flight has drifted: ``config.drift``
is raised until it reports the current version again.
"""

from __future__ import annotations

import json
from typing import Any

from brokerd.configdoc import DOCUMENT_KEYS, HEARTBEAT_DEFAULTS, validate_document
from clusterapi import alarms, inforce
from clusterapi.cluster import notify_dashboard
from clusterapi.models import Broker, Command, ConfigApplication, ConfigVersion

#: per-broker states, for one version
RUNNING = "running"  # reports this version
PENDING = "pending"  # a push of this version is on its way
FAILED = "failed"  # refused this version (the error says why)
DRIFTED = "drifted"  # runs something else and nothing is on its way
DOWN = "down"  # not reporting: what it runs is not known
NOT_RUNNING = "not_running"  # (an older version) the broker runs another one
STATES = (RUNNING, PENDING, FAILED, DRIFTED, DOWN, NOT_RUNNING)

#: what a key missing from a version means, as the editor and the API state it
DEFAULTS: dict[str, str] = {
    "heartbeat": "each broker's cluster file (brokerd's default: interval {interval:g} s, "
    "timeout {timeout:g} s, open timeout {open_timeout:g} s)".format(**HEARTBEAT_DEFAULTS),
    "known_hosts": "each broker's cluster file",
    "limits": "each broker's brokerd.toml (brokerd's default: {})".format(
        ", ".join(f"{k} {v}" for k, v in validate_document({"limits": {}})["limits"].items())
    ),
    "vhosts": "each broker's brokerd.toml (default: '/')",
    "vhost_limits": "each broker's brokerd.toml ([[vhosts]] limits; default: none)",
    "users": "each broker's brokerd.toml (default: guest, loopback only)",
    "permissions": "each broker's brokerd.toml for the users that remain",
    "bridges": "none in a cluster; a standalone broker runs those brokerd ctl bridges saved",
    "federation_upstreams": "none in a cluster; a standalone broker uses those"
    " brokerd ctl federation saved",
    "policies": "none in a cluster; a standalone broker uses those brokerd ctl federation saved",
}


def unset_keys(document: dict[str, Any]) -> list[dict[str, str]]:
    """The keys ``document`` leaves out, each with what it means: the default."""
    return [{"key": key, "default": DEFAULTS[key]} for key in DOCUMENT_KEYS if key not in document]


def _running_labels() -> dict[str, int]:
    """checksum -> version number (the newest version with that checksum)."""
    return dict(ConfigVersion.objects.order_by("number").values_list("checksum", "number"))


def describe_running(broker: Broker, numbers: dict[str, int] | None = None) -> str:
    """What the broker reports running, in words."""
    if not broker.config_checksum:
        return "its own configuration files"
    numbers = _running_labels() if numbers is None else numbers
    number = numbers.get(broker.config_checksum)
    if number is None:
        return f"an unknown configuration (checksum {broker.config_checksum})"
    return f"version {number}"


def broker_rows(version: ConfigVersion, current: ConfigVersion | None = None) -> list[dict]:
    """Per known broker: its state for ``version`` (one of :data:`STATES`), what it
    reports running, and the error of a refused push."""
    is_current = current is None or current.pk == version.pk
    numbers = _running_labels()
    in_flight = set(
        Command.objects.filter(
            name=Command.CONFIG_APPLY,
            state__in=Command.OPEN_STATES,
            args__version=version.number,
        ).values_list("broker_id", flat=True)
    )
    failed = dict(
        ConfigApplication.objects.filter(
            version=version, state=ConfigApplication.STATE_FAILED
        ).values_list("broker_id", "error")
    )
    rows = []
    for broker in Broker.objects.active().order_by("name"):
        error = ""
        if broker.state in Broker.NOT_RUNNING_STATES:
            state = DOWN
        elif broker.config_checksum == version.checksum:
            state = RUNNING
        elif not is_current:
            state = NOT_RUNNING
        elif broker.pk in in_flight:
            state = PENDING
        elif broker.pk in failed:
            state, error = FAILED, failed[broker.pk]
        else:
            state = DRIFTED
        rows.append(
            {
                "broker": broker.name,
                "state": state,
                "checksum": broker.config_checksum,
                "running": describe_running(broker, numbers),
                "running_version": numbers.get(broker.config_checksum),
                "error": error,
                # the version against what it reports in force, key by key, with sources
                "in_force": inforce.view(version.document, broker.in_force),
            }
        )
    return rows


def converged(rows: list[dict]) -> bool:
    """Every known broker reports running the version."""
    return bool(rows) and all(row["state"] == RUNNING for row in rows)


def summary(rows: list[dict]) -> str:
    """One line: converged, or how many brokers are in which state."""
    if converged(rows):
        return f"every broker reports running it ({len(rows)} of {len(rows)})"
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    words = {RUNNING: "running it", NOT_RUNNING: "running another version"}
    parts = [f"{n} {words.get(state, state)}" for state, n in counts.items()]
    return ", ".join(parts) or "no brokers"


def check_drift(broker: Broker, version: ConfigVersion | None = None) -> None:
    """Raise or clear ``config.drift`` for one broker after what it runs (or the current
    version) changed: raised while it has drifted, cleared once it runs the current
    version or a refused push says why (``config.failed``) instead."""
    version = version or ConfigVersion.objects.current()
    if version is None:
        changed = alarms.clear_alarm(alarms.CONFIG_DRIFT, broker)
    else:
        broker.refresh_from_db(fields=["state", "config_version", "config_checksum"])
        [row] = [r for r in broker_rows(version) if r["broker"] == broker.name]
        if row["state"] == DRIFTED:
            _, changed = alarms.raise_alarm(
                alarms.CONFIG_DRIFT,
                f"{broker.name} runs {row['running']}, not version {version.number} "
                "(push it again to fix)",
                broker,
            )
        elif row["state"] in (RUNNING, FAILED):
            changed = bool(alarms.clear_alarm(alarms.CONFIG_DRIFT, broker))
        else:
            changed = False
    if changed:
        notify_dashboard("alarm", broker.name)


def running_groups(exclude_checksum: str | None = None) -> list[dict[str, Any]]:
    """The configurations the brokers that are up report running, grouped: each with
    its label, its document (None when unknown) and the brokers. What the editor diffs
    the edited document against."""
    numbers = _running_labels()
    documents = dict(ConfigVersion.objects.values_list("checksum", "document"))
    groups: dict[str, dict[str, Any]] = {}
    for broker in Broker.objects.filter(state=Broker.STATE_UP).order_by("name"):
        checksum = broker.config_checksum
        if checksum == exclude_checksum:
            continue
        document = documents.get(checksum) if checksum else None
        key = checksum
        if not checksum:
            # its own files: what it reports in force (one group per distinct document),
            # not an empty document; unknown from a broker too old to report it
            reported = (broker.in_force or {}).get("document")
            document = reported if isinstance(reported, dict) else None
            key = "files:" + json.dumps(document, sort_keys=True)
        group = groups.setdefault(
            key,
            {
                "checksum": checksum,
                "label": describe_running(broker, numbers),
                "document": document,
                "brokers": [],
            },
        )
        group["brokers"].append(broker.name)
    return list(groups.values())
