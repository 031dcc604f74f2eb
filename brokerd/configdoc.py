"""The console's cluster configuration document: validation and checksum.

Pure functions, no I/O: the console validates a version with them before
saving it, and the broker validates again before applying it (docs/protocol.md,
"Cluster configuration document"). Field rules are shared with brokerd.toml
(``brokerd.config``) and the cluster file (``brokerd.cluster.config``), so a
document the console accepts is one the broker can apply.

Normalisation makes the checksum stable: numbers get their canonical types,
defaults are filled in inside each part present, host names are lower-cased
and de-duplicated, and ``validate_document`` of a normalised document returns
it unchanged.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from brokerd.bridges.definitions import DefinitionError, parse_name, parse_shovel
from brokerd.bridges.upstreams import (
    POLICY_KEYS,
    parse_policy,
    parse_upstream,
    parse_upstream_set,
)
from brokerd.bridges.uri import parse_uris, redact
from brokerd.cluster.config import ClusterConfigError, parse_host
from brokerd.config import (
    VHOST_LIMIT_KEYS,
    ConfigError,
    limits_document,
    parse_limits,
    parse_permission,
    parse_user,
    parse_vhost_limits,
    parse_vhost_name,
)

DOCUMENT_KEYS = (
    "heartbeat",
    "known_hosts",
    "limits",
    "vhosts",
    "vhost_limits",
    "users",
    "permissions",
    "bridges",
    "federation_upstreams",
    "policies",
)
HEARTBEAT_DEFAULTS = {"interval": 1.0, "timeout": 3.0, "open_timeout": 10.0}
#: an hour between heartbeats is already useless; larger values are typos
HEARTBEAT_MAX = 3600.0


class ConfigDocumentError(ValueError):
    """The document cannot be applied; the message starts with the bad key."""


def _heartbeat(raw: object) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise ConfigDocumentError("heartbeat: must be an object")
    unknown = sorted(set(raw) - set(HEARTBEAT_DEFAULTS))
    if unknown:
        raise ConfigDocumentError(f"heartbeat: unknown key(s) {', '.join(map(repr, unknown))}")
    values = {}
    for key, default in HEARTBEAT_DEFAULTS.items():
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigDocumentError(f"heartbeat.{key} must be a number of seconds")
        if not 0 < value <= HEARTBEAT_MAX:
            raise ConfigDocumentError(
                f"heartbeat.{key} must be greater than 0 and at most {HEARTBEAT_MAX:g}"
            )
        values[key] = float(value)
    if values["timeout"] <= values["interval"]:
        raise ConfigDocumentError("heartbeat.timeout must be greater than heartbeat.interval")
    return values


def _known_hosts(raw: object) -> list[str]:
    if not isinstance(raw, list) or not raw:
        raise ConfigDocumentError("known_hosts: must be a non-empty list of 'host:port' strings")
    hosts: dict[str, None] = {}
    for i, value in enumerate(raw):
        try:
            hosts[str(parse_host(value, f"known_hosts[{i}]"))] = None
        except ClusterConfigError as exc:
            raise ConfigDocumentError(str(exc)) from None
    return list(hosts)


def _vhosts(raw: object) -> list[str]:
    if not isinstance(raw, list) or not raw:
        raise ConfigDocumentError("vhosts: must be a non-empty list of vhost names")
    names = [parse_vhost_name(value, f"vhosts[{i}]") for i, value in enumerate(raw)]
    return list(dict.fromkeys(names))


def _users(raw: object) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise ConfigDocumentError("users: must be a non-empty list of users")
    users: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        user = parse_user(entry, f"users[{i}]", strict=True)
        if user.name in seen:
            raise ConfigDocumentError(f"users[{i}].name: user '{user.name}' is defined twice")
        seen.add(user.name)
        users.append(
            {"name": user.name, "password_hash": user.password_hash, "tags": list(user.tags)}
        )
    return users


def _permissions(raw: object, doc: dict[str, Any]) -> list[dict[str, str]]:
    if not isinstance(raw, list):
        raise ConfigDocumentError("permissions: must be a list")
    for needed in ("users", "vhosts"):
        if needed not in doc:
            raise ConfigDocumentError(
                f"permissions: need '{needed}' in the same document to refer to"
            )
    users = {u["name"] for u in doc["users"]}
    permissions: dict[tuple[str, str], dict[str, str]] = {}
    for i, entry in enumerate(raw):
        user, vhost, perm = parse_permission(
            entry, f"permissions[{i}]", users, doc["vhosts"], strict=True
        )
        if (user, vhost) in permissions:
            raise ConfigDocumentError(
                f"permissions[{i}]: a second permission for user '{user}' on vhost '{vhost}'"
            )
        permissions[(user, vhost)] = {
            "user": user,
            "vhost": vhost,
            "configure": perm.configure,
            "write": perm.write,
            "read": perm.read,
        }
    return list(permissions.values())


def _vhost_limits(raw: object, doc: dict[str, Any]) -> dict[str, dict[str, int | None]]:
    if not isinstance(raw, dict):
        raise ConfigDocumentError("vhost_limits: must be an object of vhost name -> limits")
    if "vhosts" not in doc:
        raise ConfigDocumentError("vhost_limits: need 'vhosts' in the same document to refer to")
    out = {}
    for name, entry in raw.items():
        if name not in doc["vhosts"]:
            raise ConfigDocumentError(f"vhost_limits.{name}: limits for unknown vhost {name!r}")
        limits = parse_vhost_limits(entry, f"vhost_limits.{name}")
        out[name] = {key: getattr(limits, key) for key in VHOST_LIMIT_KEYS}
    return out


#: bridges one document defines at most (each runs two connections on some server)
BRIDGES_MAX = 256


def _bridges(raw: object, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Shovels as RabbitMQ's definitions list its parameters: ``name``, ``vhost``
    and ``value``, the JSON ``rabbitmqctl set_parameter shovel`` takes. Each value
    is stored normalised (its defaults filled in); an error names the key, and its
    text never carries a URI's password."""
    if not isinstance(raw, list):
        raise ConfigDocumentError("bridges: must be a list of {name, vhost, value}")
    if len(raw) > BRIDGES_MAX:
        raise ConfigDocumentError(f"bridges: at most {BRIDGES_MAX} bridges")
    vhosts = doc.get("vhosts")
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for i, entry in enumerate(raw):
        where = f"bridges[{i}]"
        if not isinstance(entry, dict):
            raise ConfigDocumentError(f"{where}: must be an object with name, vhost and value")
        unknown = sorted(set(entry) - {"name", "vhost", "value", "component"})
        if unknown:
            raise ConfigDocumentError(f"{where}.{unknown[0]}: unknown key")
        if entry.get("component", "shovel") != "shovel":
            raise ConfigDocumentError(f"{where}.component: only 'shovel' bridges are defined here")
        try:
            name = parse_name(entry.get("name"))
        except DefinitionError as exc:
            raise ConfigDocumentError(f"{where}.name: {exc.message}") from None
        vhost = parse_vhost_name(entry.get("vhost", "/"), f"{where}.vhost")
        if vhosts is not None and vhost not in vhosts:
            raise ConfigDocumentError(f"{where}.vhost: unknown vhost {vhost!r}")
        if (vhost, name) in out:
            raise ConfigDocumentError(f"{where}.name: bridge {name!r} is defined twice")
        try:
            definition = parse_shovel(name, entry.get("value"), vhost)
        except DefinitionError as exc:
            field = "value" if exc.field == "value" else f"value.{exc.field}"
            raise ConfigDocumentError(f"{where}.{field}: {redact(exc.message)}") from None
        out[(vhost, name)] = {"name": name, "vhost": vhost, "value": definition.document}
    return [out[key] for key in sorted(out)]


#: upstreams (and upstream sets) one document defines at most, and policies
UPSTREAMS_MAX = 256
POLICIES_MAX = 256
UPSTREAM_COMPONENTS = ("federation-upstream", "federation-upstream-set")


def _entry_name(entry: object, where: str, allowed: set[str]) -> tuple[str, dict[str, Any]]:
    if not isinstance(entry, dict):
        raise ConfigDocumentError(f"{where}: must be an object with name, vhost and value")
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ConfigDocumentError(f"{where}.{unknown[0]}: unknown key")
    try:
        return parse_name(entry.get("name")), entry
    except DefinitionError as exc:
        raise ConfigDocumentError(f"{where}.name: {exc.message}") from None


def _entry_vhost(entry: dict[str, Any], where: str, doc: dict[str, Any]) -> str:
    vhost = parse_vhost_name(entry.get("vhost", "/"), f"{where}.vhost")
    vhosts = doc.get("vhosts")
    if vhosts is not None and vhost not in vhosts:
        raise ConfigDocumentError(f"{where}.vhost: unknown vhost {vhost!r}")
    return vhost


def _federation_upstreams(raw: object, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Federation upstreams and upstream sets as RabbitMQ's definitions list its
    parameters: ``name``, ``vhost``, ``component`` (``federation-upstream``, the
    default, or ``federation-upstream-set``) and ``value``, the JSON
    ``rabbitmqctl set_parameter`` takes. Errors name the key, never a password."""
    if not isinstance(raw, list):
        raise ConfigDocumentError(
            "federation_upstreams: must be a list of {name, vhost, component, value}"
        )
    if len(raw) > UPSTREAMS_MAX:
        raise ConfigDocumentError(f"federation_upstreams: at most {UPSTREAMS_MAX}")
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for i, item in enumerate(raw):
        where = f"federation_upstreams[{i}]"
        name, entry = _entry_name(item, where, {"name", "vhost", "value", "component"})
        vhost = _entry_vhost(entry, where, doc)
        component = entry.get("component", UPSTREAM_COMPONENTS[0])
        if component not in UPSTREAM_COMPONENTS:
            raise ConfigDocumentError(
                f"{where}.component: must be one of {', '.join(UPSTREAM_COMPONENTS)}"
            )
        if (vhost, component, name) in out:
            raise ConfigDocumentError(f"{where}.name: {component} {name!r} is defined twice")
        try:
            if component == UPSTREAM_COMPONENTS[0]:
                parse_upstream(name, entry.get("value"), vhost)
            else:
                parse_upstream_set(name, entry.get("value"))
        except DefinitionError as exc:
            field = exc.field if exc.field.startswith("value") else f"value.{exc.field}"
            raise ConfigDocumentError(f"{where}.{field}: {redact(exc.message)}") from None
        out[(vhost, component, name)] = {
            "name": name,
            "vhost": vhost,
            "component": component,
            "value": entry.get("value"),
        }
    return [out[key] for key in sorted(out)]


def _policies(raw: object, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Policies as RabbitMQ's definitions list them: ``name``, ``vhost``, ``pattern``,
    ``apply-to``, ``definition`` and ``priority``; only federating ones are
    Rookery's so far, and a definition with other keys is refused by name."""
    if not isinstance(raw, list):
        raise ConfigDocumentError("policies: must be a list of {name, vhost, pattern, definition}")
    if len(raw) > POLICIES_MAX:
        raise ConfigDocumentError(f"policies: at most {POLICIES_MAX}")
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for i, item in enumerate(raw):
        where = f"policies[{i}]"
        name, entry = _entry_name(item, where, {"name", "vhost", *POLICY_KEYS})
        vhost = _entry_vhost(entry, where, doc)
        if (vhost, name) in out:
            raise ConfigDocumentError(f"{where}.name: policy {name!r} is defined twice")
        value = {k: v for k, v in entry.items() if k not in ("name", "vhost")}
        try:
            policy = parse_policy(name, value, vhost)
        except DefinitionError as exc:
            raise ConfigDocumentError(f"{where}.{exc.field}: {exc.message}") from None
        out[(vhost, name)] = {
            "name": name,
            "vhost": vhost,
            "pattern": policy.pattern.pattern,
            "apply-to": policy.apply_to,
            "priority": policy.priority,
            "definition": value["definition"],
        }
    return [out[key] for key in sorted(out)]


def _public_upstream(entry: dict[str, Any]) -> dict[str, Any]:
    value = entry.get("value")
    if entry.get("component") != UPSTREAM_COMPONENTS[0] or not isinstance(value, dict):
        return entry
    uris = [u.redacted for u in parse_uris(value["uri"], "uri")]
    shown = uris if isinstance(value["uri"], list) else uris[0]
    return {**entry, "value": {**value, "uri": shown}}


def redacted_document(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` as a person may see it: its bridges' and upstreams' URIs without
    their passwords."""
    if not doc.get("bridges") and not doc.get("federation_upstreams"):
        return doc
    out = dict(doc)
    if doc.get("bridges"):
        out["bridges"] = [
            {**b, "value": parse_shovel(b["name"], b["value"], b["vhost"]).public()}
            for b in doc["bridges"]
        ]
    if doc.get("federation_upstreams"):
        out["federation_upstreams"] = [_public_upstream(u) for u in doc["federation_upstreams"]]
    return out


def validate_document(doc: object) -> dict[str, Any]:
    """Check a configuration document; return it normalised, or raise
    :class:`ConfigDocumentError` naming the first bad key."""
    if not isinstance(doc, dict):
        raise ConfigDocumentError("the configuration must be a JSON object")
    unknown = sorted(set(doc) - set(DOCUMENT_KEYS))
    if unknown:
        raise ConfigDocumentError(f"{unknown[0]}: unknown key (known: {', '.join(DOCUMENT_KEYS)})")
    out: dict[str, Any] = {}
    try:
        if "heartbeat" in doc:
            out["heartbeat"] = _heartbeat(doc["heartbeat"])
        if "known_hosts" in doc:
            out["known_hosts"] = _known_hosts(doc["known_hosts"])
        if "limits" in doc:
            out["limits"] = limits_document(parse_limits(doc["limits"], "limits", minimum=1))
        if "vhosts" in doc:
            out["vhosts"] = _vhosts(doc["vhosts"])
        if "vhost_limits" in doc:
            out["vhost_limits"] = _vhost_limits(doc["vhost_limits"], out)
        if "users" in doc:
            out["users"] = _users(doc["users"])
        if "permissions" in doc:
            out["permissions"] = _permissions(doc["permissions"], out)
        if "bridges" in doc:
            out["bridges"] = _bridges(doc["bridges"], out)
        if "federation_upstreams" in doc:
            out["federation_upstreams"] = _federation_upstreams(doc["federation_upstreams"], out)
        if "policies" in doc:
            out["policies"] = _policies(doc["policies"], out)
    except ConfigError as exc:
        raise ConfigDocumentError(str(exc)) from None
    return out


def document_checksum(doc: dict[str, Any]) -> str:
    """First 16 hex digits of SHA-256 over the canonical JSON of ``doc``."""
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
