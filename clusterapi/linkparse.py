"""Checking broker-link messages (docs/protocol.md, "Console link") before anything is stored.

Every reader names the field it refuses (``status.queues[3].messages``) in a
:class:`LinkProtocolError`; the link consumer closes the socket with code 4400
and that text as the reason. Nothing here touches the database.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clusterapi.models import Broker

PROTOCOL_VERSION = 1


class LinkProtocolError(ValueError):
    """A malformed broker-link message; the text is the close reason."""


def require(msg: dict[str, Any], key: str, kinds: type | tuple[type, ...], where: str) -> Any:
    if key not in msg:
        raise LinkProtocolError(f"{where}.{key} is missing")
    value = msg[key]
    if not is_a(value, kinds):
        raise LinkProtocolError(f"{where}.{key} has the wrong type")
    return value


def optional(
    msg: dict[str, Any], key: str, kinds: type | tuple[type, ...], where: str, default: Any
) -> Any:
    value = msg.get(key)
    if value is None:
        return default
    if not is_a(value, kinds):
        raise LinkProtocolError(f"{where}.{key} has the wrong type")
    return value


def is_a(value: Any, kinds: type | tuple[type, ...]) -> bool:
    # JSON booleans are ints to Python: never accept one where a number is wanted
    if isinstance(value, bool):
        return kinds is bool or (isinstance(kinds, tuple) and bool in kinds)
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return isinstance(value, kinds)


def number(msg: dict[str, Any], key: str, where: str, default: float = 0.0) -> float:
    return float(optional(msg, key, (int, float), where, default))


def count(msg: dict[str, Any], key: str, where: str) -> int:
    value = msg.get(key)
    if type(value) is int:  # the common case, checked first: a status has 5 per queue
        return value
    return optional(msg, key, int, where, 0)


def text(msg: dict[str, Any], key: str, where: str, limit: int = 255) -> str:
    value = optional(msg, key, str, where, "")
    if len(value) > limit:
        raise LinkProtocolError(f"{where}.{key} is longer than {limit} characters")
    return value


def epoch(value: float, where: str) -> dt.datetime:
    """Epoch seconds from a broker as an aware datetime."""
    if not 0 <= value < 1e11:
        raise LinkProtocolError(f"{where} is not a time in epoch seconds")
    return dt.datetime.fromtimestamp(value, tz=dt.UTC)


def parse_envelope(msg: Any) -> str:
    """Check ``v`` and return ``type``."""
    if not isinstance(msg, dict):
        raise LinkProtocolError("a message must be a JSON object")
    if msg.get("v") != PROTOCOL_VERSION:
        raise LinkProtocolError(f"unsupported protocol version {msg.get('v')!r} (expected 1)")
    kind = msg.get("type")
    if not isinstance(kind, str) or not kind:
        raise LinkProtocolError("message.type is missing")
    return kind


@dataclass(frozen=True)
class Hello:
    spid: str
    name: str
    address: str
    broker_type: str
    version: str
    start_time: dt.datetime | None
    cluster: str
    checksum: str
    heartbeat_interval: float
    config_version: int | None
    config_checksum: str
    #: ``{"document", "sources"}``: the configuration it runs (None: not reported)
    in_force: dict[str, Any] | None = None
    #: a worker of ``brokerd --workers``: its host's address, its index, the host's
    #: worker count ("" / None: a broker of its own)
    host: str = ""
    worker: int | None = None
    workers: int | None = None


def parse_in_force(msg: dict[str, Any], where: str) -> dict[str, Any] | None:
    """``in_force`` of a hello or status, checked (``clusterapi.inforce.parse``)."""
    if msg.get("in_force") is None:
        return None
    from clusterapi import inforce  # it imports this module's error

    return inforce.parse(msg["in_force"], where)


def parse_hello(msg: dict[str, Any]) -> Hello:
    name = require(msg, "name", str, "hello").strip()
    if not name or len(name) > 255:
        raise LinkProtocolError("hello.name must be 1 to 255 characters")
    broker_type = require(msg, "broker_type", str, "hello")
    if broker_type not in dict(Broker.TYPE_CHOICES):
        raise LinkProtocolError(
            f"hello.broker_type {broker_type!r} is not one of primary, secondary, standalone"
        )
    interval = number(msg, "heartbeat_interval", "hello", 1.0)
    if not 0 < interval <= 3600:
        raise LinkProtocolError("hello.heartbeat_interval must be in (0, 3600] seconds")
    start = optional(msg, "start_time", (int, float), "hello", None)
    config_version = optional(msg, "config_version", int, "hello", None)
    host = text(msg, "host", "hello")
    worker = optional(msg, "worker", int, "hello", None)
    workers = optional(msg, "workers", int, "hello", None)
    if host and (
        worker is None or workers is None or not 1 <= workers <= 256 or not 0 <= worker < workers
    ):
        raise LinkProtocolError(
            "hello of a host's worker needs 'worker' (0 to workers - 1) and 'workers' (1 to 256)"
        )
    if not host and (worker is not None or workers is not None):
        raise LinkProtocolError("hello.worker and hello.workers need hello.host")
    return Hello(
        spid=require(msg, "spid", str, "hello")[:64],
        name=name,
        address=text(msg, "address", "hello"),
        broker_type=broker_type,
        version=text(msg, "version", "hello", 64),
        start_time=None if start is None else epoch(start, "hello.start_time"),
        cluster=text(msg, "cluster", "hello"),
        checksum=text(msg, "checksum", "hello", 64),
        heartbeat_interval=interval,
        config_version=config_version,
        config_checksum=text(msg, "config_checksum", "hello", 64),
        in_force=parse_in_force(msg, "hello"),
        host=host,
        worker=worker,
        workers=workers,
    )


@dataclass
class Section:
    """Queues, exchanges or bindings of one status: a full list or a delta."""

    upsert: list[dict[str, Any]]
    remove: list[tuple[str, ...]]


def section(msg: dict[str, Any], key: str, full: bool, key_len: int) -> Section | None:
    raw = msg.get(key)
    if raw is None:
        return None
    if full:
        if not isinstance(raw, list):
            raise LinkProtocolError(f"status.{key} must be a list in a full status")
        return Section(upsert=entries(raw, key), remove=[])
    if not isinstance(raw, dict):
        raise LinkProtocolError(f"status.{key} must be an object with upsert/remove in a delta")
    upsert = optional(raw, "upsert", list, f"status.{key}", [])
    remove = optional(raw, "remove", list, f"status.{key}", [])
    keys = []
    for i, item in enumerate(remove):
        if (
            not isinstance(item, list)
            or len(item) != key_len
            or not all(isinstance(part, str) for part in item)
        ):
            raise LinkProtocolError(f"status.{key}.remove[{i}] must be a list of {key_len} strings")
        keys.append(tuple(item))
    return Section(upsert=entries(upsert, key), remove=keys)


def entries(raw: list[Any], key: str) -> list[dict[str, Any]]:
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise LinkProtocolError(f"status.{key}[{i}] must be an object")
    return raw


# -- status parts ---------------------------------------------------------------------


def running_config(msg: dict[str, Any]) -> tuple[int | None, str] | None:
    """The console configuration a status says the broker runs (None: a broker too old
    to say, whose hello and acks stay the only word on it)."""
    if "config_checksum" not in msg:
        return None
    version = optional(msg, "config_version", int, "status", None)
    return version, text(msg, "config_checksum", "status", 64)


def quorum_text(view: dict[str, Any], peers: Sequence[Any], self_primary: bool) -> str:
    """The view's quorum as text: kept if the broker sent text, else described from its peers
    (``self_primary``: the reporting broker is a primary and counts itself)."""
    quorum = view.get("quorum")
    if isinstance(quorum, str):
        return quorum[:255]
    if quorum is None:
        return ""
    primaries = [p for p in peers if isinstance(p, dict) and p.get("type") == "primary"]
    active = sum(1 for p in primaries if p.get("active"))
    known = len(primaries) + self_primary
    active += self_primary
    word = "quorum" if quorum else "no quorum"
    return f"{word} ({active} of {known} primaries active)" if known else word


def peer(raw: Any, i: int) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise LinkProtocolError(f"status.view.peers[{i}] must be an object")
    rtt = raw.get("rtt_ms")
    return {
        "spid": str(raw.get("spid") or ""),
        "address": str(raw.get("address") or ""),
        "active": bool(raw.get("active")),
        "rtt_ms": rtt if is_a(rtt, (int, float)) else None,
    }


def broker_alarms(raw: list[Any]) -> list[tuple[str, str, dt.datetime | None]]:
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
            raise LinkProtocolError(f"status.view.alarms[{i}] must be an object with a kind")
        since = item.get("since")
        out.append(
            (
                item["kind"][:64],
                str(item.get("message") or ""),
                epoch(float(since), f"status.view.alarms[{i}].since")
                if is_a(since, (int, float))
                else None,
            )
        )
    return out


def arguments(entry: dict[str, Any], where: str) -> dict[str, Any]:
    value = entry.get("arguments")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LinkProtocolError(f"{where}.arguments must be an object")
    return value


def key_text(entry: dict[str, Any], key: str, where: str, required: bool = True) -> str:
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise LinkProtocolError(f"{where}.{key} must be a string")
    if len(value) > 255:
        raise LinkProtocolError(f"{where}.{key} is longer than 255 characters")
    return value


#: a queue's consumers are spread over at most this many servers (a cluster's size)
MAX_CONSUMER_SERVERS = 256


def consumer_servers(entry: dict[str, Any], where: str) -> dict[str, int]:
    """A shared master's ``{spid: consumers}``, servers without consumers left out
    (so a lookup by spid finds only servers that have some)."""
    raw = optional(entry, "consumer_servers", dict, where, {})
    if len(raw) > MAX_CONSUMER_SERVERS:
        raise LinkProtocolError(f"{where}.consumer_servers has more than 256 servers")
    spread = {}
    for spid, n in raw.items():
        if not spid or len(spid) > 64 or isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise LinkProtocolError(
                f"{where}.consumer_servers must map spids (1 to 64 characters) to counts"
            )
        if n:
            spread[spid] = n
    return spread


#: a queue has at most a copy on every other server of its cluster
MAX_REPLICAS = MAX_CONSUMER_SERVERS


def replicas(entry: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A shared master's replica set, ``[{spid, in_sync, behind}]``: checked field by
    field and rebuilt (no other key is stored), since the pages and the API show it."""
    raw = optional(entry, "replicas", list, where, [])
    if len(raw) > MAX_REPLICAS:
        raise LinkProtocolError(f"{where}.replicas has more than {MAX_REPLICAS} servers")
    out = []
    for i, replica in enumerate(raw):
        spid = replica.get("spid") if isinstance(replica, dict) else None
        in_sync = replica.get("in_sync") if isinstance(replica, dict) else None
        behind = replica.get("behind") if isinstance(replica, dict) else None
        if (
            not isinstance(spid, str)
            or not 1 <= len(spid) <= 64
            or not isinstance(in_sync, bool)
            or not is_a(behind, int)
            or behind < 0
        ):
            raise LinkProtocolError(
                f"{where}.replicas[{i}] must be {{spid (1 to 64 characters), in_sync (bool), "
                "behind (a count)}"
            )
        out.append({"spid": spid, "in_sync": in_sync, "behind": behind})
    return out


def parse_stopping(msg: dict[str, Any]) -> tuple[str, str]:
    """``stopping``: the broker's spid and why it stops (``SIGTERM``...; may be empty)."""
    spid = require(msg, "spid", str, "stopping")
    if not 1 <= len(spid) <= 64:
        raise LinkProtocolError("stopping.spid must be 1 to 64 characters")
    reason = msg.get("reason", "")
    if reason is None:
        reason = ""
    if not isinstance(reason, str) or len(reason) > 200:
        raise LinkProtocolError("stopping.reason must be a string of at most 200 characters")
    return spid, reason


#: bridges one broker reports at most (brokerd's ``BRIDGES_MAX``)
MAX_BRIDGES = 256
#: a bridge's numbers, as its status reports them
BRIDGE_COUNTS = ("forwarded", "acknowledged", "requeued", "in_flight")


def bridges(view: dict[str, Any]) -> list[dict[str, Any]]:
    """The bridges a broker runs (``status.view.bridges``), each checked and reduced to
    what the console shows: name, vhost, state, reason, since, URIs (redacted by the
    broker), counts and rate."""
    raw = optional(view, "bridges", list, "status.view", [])
    if len(raw) > MAX_BRIDGES:
        raise LinkProtocolError(f"status.view.bridges: at most {MAX_BRIDGES}")
    out = []
    for i, item in enumerate(raw):
        where = f"status.view.bridges[{i}]"
        if not isinstance(item, dict):
            raise LinkProtocolError(f"{where} must be an object")
        since = item.get("since")
        row: dict[str, Any] = {
            "name": key_text(item, "name", where),
            "vhost": key_text(item, "vhost", where),
            "state": key_text(item, "state", where)[:32],
            "reason": str(item.get("reason") or "")[:1000],
            "since": float(since) if is_a(since, (int, float)) else None,
            "src_uri": str(item.get("src_uri") or "")[:1000],
            "dest_uri": str(item.get("dest_uri") or "")[:1000],
            "rate": number(item, "rate", where),
        }
        for key in BRIDGE_COUNTS:
            row[key] = count(item, key, where)
        backlog = item.get("backlog")
        # the source queue's depth when last asked (None: not known yet)
        row["backlog"] = backlog if is_a(backlog, int) and backlog >= 0 else None
        # a federation link (a bridge of a fixed shape): what it federates, from where
        if item.get("type") == "federation":
            row["federation"] = {
                key: str(item.get(key) or "")[:255] for key in ("kind", "object", "upstream")
            }
        out.append(row)
    return out
