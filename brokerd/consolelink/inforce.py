"""The configuration a broker runs, and where each part came from.

The console compares it with its own version to show a drift as a diff, and
``brokerd ctl status`` shows it to an operator. The document has the shape of
the console's configuration document (``brokerd.configdoc``), users without
their password hashes; ``sources`` says, per part (per key for limits), whether
the value is the console's (a document applied in this run), the file's
(brokerd.toml, or the cluster file for heartbeat and known hosts) or the
default. A console document's parts are whole (the console fills in each
part's defaults), so a part it carries is the console's throughout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from brokerd.config import LIMIT_KEYS, VHOST_LIMIT_KEYS, limits_document
from brokerd.configdoc import redacted_document

if TYPE_CHECKING:
    from brokerd.cluster.config import ClusterConfig
    from brokerd.config import BrokerConfig

CONSOLE, FILE, DEFAULT = "console", "file", "default"
BROKER_PARTS = ("vhosts", "vhost_limits", "users", "permissions")


def document(config: BrokerConfig, cluster: ClusterConfig | None) -> dict[str, Any]:
    """What is in force, as a console configuration document (no password hashes)."""
    doc: dict[str, Any] = {}
    if cluster is not None:
        doc["heartbeat"] = {
            "interval": cluster.heartbeat_interval,
            "timeout": cluster.heartbeat_timeout,
            "open_timeout": cluster.open_timeout,
        }
        doc["known_hosts"] = sorted(str(h) for h in cluster.known_hosts)
    doc["limits"] = limits_document(config.limits)
    doc["vhosts"] = list(config.vhosts)
    doc["vhost_limits"] = {
        name: {key: getattr(limits, key) for key in VHOST_LIMIT_KEYS}
        for name, limits in sorted(config.vhost_limits.items())
    }
    doc["users"] = [{"name": u.name, "tags": list(u.tags)} for u in config.users]
    doc["permissions"] = [
        {
            "user": user,
            "vhost": vhost,
            "configure": p.configure,
            "write": p.write,
            "read": p.read,
        }
        for user, vhost, p in config.permissions
    ]
    return doc


def sources(
    config: BrokerConfig, cluster: ClusterConfig | None, applied: dict[str, Any] | None
) -> dict[str, str]:
    """Where each part (each limit) in force came from. ``applied``: the console
    document in force (None when the files rule: none applied, or a SIGHUP re-read
    them)."""
    applied = applied or {}
    explicit = config.explicit
    result: dict[str, str] = {}
    if cluster is not None:
        for part in ("heartbeat", "known_hosts"):
            result[part] = CONSOLE if part in applied else FILE
    for key in LIMIT_KEYS:
        if "limits" in applied:
            result[f"limits.{key}"] = CONSOLE
        else:
            result[f"limits.{key}"] = FILE if f"limits.{key}" in explicit else DEFAULT
    for part in BROKER_PARTS:
        if part in applied:
            result[part] = CONSOLE
        else:
            result[part] = FILE if part in explicit else DEFAULT
    return result


def in_force(
    config: BrokerConfig, cluster: ClusterConfig | None, applied: dict[str, Any] | None
) -> dict[str, Any]:
    doc = document(config, cluster)
    found = sources(config, cluster, applied)
    # the document's bridges, upstreams and policies, URIs without passwords (the
    # console compares them so redacted too)
    shown = redacted_document(applied) if applied else {}
    for part in ("bridges", "federation_upstreams", "policies"):
        if part in shown:
            doc[part] = shown[part]
            found[part] = CONSOLE
    return {"document": doc, "sources": found}
