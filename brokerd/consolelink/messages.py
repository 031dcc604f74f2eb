"""The console link's JSON messages (docs/protocol.md, "Console link").

Builders turn the host's state (``ConsoleHost``: the server) into
``hello``/``status``/``ack`` bodies; ``parse`` checks what the console sends.
No sockets here.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import brokerd

if TYPE_CHECKING:
    from brokerd.consolelink.host import ConsoleHost

VERSION = 1
#: the console may send configuration documents; anything bigger is malformed
MAX_MESSAGE = 4 * 1024 * 1024
#: websocket close code for a message that breaks the protocol
CLOSE_MALFORMED = 4400
PEER_FIELDS = ("spid", "type", "address", "active", "link", "last_seen_age", "rtt_ms")


class MalformedMessage(ValueError):
    """The console sent something that is not a protocol message; the link closes 4400."""


def encode(message: dict[str, Any]) -> str:
    return json.dumps({"v": VERSION, **message}, separators=(",", ":"), default=str)


def parse(text: str | bytes) -> dict[str, Any]:
    """One console message: a JSON object with ``"v": 1`` and a string ``type``."""
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError:
            raise MalformedMessage("message is not UTF-8") from None
    try:
        message = json.loads(text)
    except ValueError:
        raise MalformedMessage("message is not JSON") from None
    if not isinstance(message, dict):
        raise MalformedMessage("message is not a JSON object")
    if message.get("v") != VERSION:
        raise MalformedMessage(f"unsupported protocol version {message.get('v')!r}")
    if not isinstance(message.get("type"), str):
        raise MalformedMessage("message has no 'type'")
    if message["type"] == "command":
        command_id = message.get("id")
        if not isinstance(command_id, str) or not command_id or len(command_id) > 200:
            raise MalformedMessage("command needs an 'id' string (1 to 200 characters)")
        if not isinstance(message.get("command"), str):
            raise MalformedMessage(f"command {command_id} needs a 'command' name")
        args = message.setdefault("args", {})
        if args is None:
            message["args"] = {}
        elif not isinstance(args, dict):
            raise MalformedMessage(f"command {command_id}: 'args' must be an object")
    return message


def hello(host: ConsoleHost, config_version: int | None, config_checksum: str | None) -> dict:
    """Who this broker is. A worker of a host is ``worker-K@HOST:PORT`` and names its
    host (``host``, ``worker``, ``workers``): the console groups a host's workers, and
    the host's local cluster is no cluster the console manages (``standalone``)."""
    cluster = host.cluster_config
    worker = host.worker_of
    if worker is not None:
        address, index, workers = worker
        return {
            **_identity(host, config_version, config_checksum),
            "name": f"worker-{index}@{address}",
            "address": address,
            "broker_type": "standalone",
            "cluster": None,
            "checksum": None,
            "host": address,
            "worker": index,
            "workers": workers,
        }
    return {
        **_identity(host, config_version, config_checksum),
        "name": host.address,
        "address": host.address,
        "broker_type": host.server_type if cluster is not None else "standalone",
        "cluster": cluster.name if cluster is not None else None,
        "checksum": host.cluster_checksum,
    }


def _identity(
    host: ConsoleHost, config_version: int | None, config_checksum: str | None
) -> dict[str, Any]:
    return {
        "type": "hello",
        "spid": host.spid,
        "version": brokerd.__version__,
        "start_time": host.started,
        "heartbeat_interval": host.status_interval,
        "config_version": config_version,
        "config_checksum": config_checksum,
    }


def view(host: ConsoleHost) -> dict[str, Any]:
    """The cluster as this server sees it (a standalone broker: ready, no peers; a
    worker of a host: as standalone, with its local cluster's readiness and alarms)."""
    status = host.cluster_status()
    if status is not None and host.worker_of is not None:
        return {
            "is_root": False,
            "root": None,
            "ready": bool(status.get("ready")),
            "root_enabled": False,
            "quorum": None,
            "vote": None,
            "reason": f"worker of {host.worker_of[0]}",
            "checksum": None,
            "alarms": status.get("alarms", []) + host.resource_alarms(),
            "resources": host.resource_status(),
            "peers": [],
            "bridges": host.bridge_status(),
            "loop": host.loop_status(),
        }
    if status is None:
        return {
            "is_root": False,
            "root": None,
            "ready": True,
            "root_enabled": False,
            "quorum": None,
            "vote": None,
            "reason": "standalone",
            "checksum": None,
            "alarms": host.resource_alarms(),
            "resources": host.resource_status(),
            "peers": [],
            "bridges": host.bridge_status(),
        }
    return {
        **{
            key: status.get(key)
            for key in ("is_root", "root", "ready", "root_enabled", "quorum", "vote", "reason")
        },
        "checksum": status["checksum"],
        "alarms": status.get("alarms", []) + host.resource_alarms(),
        "resources": host.resource_status(),
        "peers": [{key: peer.get(key) for key in PEER_FIELDS} for peer in status["peers"]],
        "bridges": host.bridge_status(),
        # the members as ``ctl cluster members`` lists them: a few rows, every status, so
        # the console shows the root's (or the freshest) view without asking
        "members": host.cluster_members(),
        # the cluster under load: flow control, each link's backlog, unsettled forwards
        # and replica lag, the status-echo round trips and the event loop's lag
        "flow": status.get("flow"),
        "lanes": status.get("lanes"),
        "echo_rtt": status.get("echo_rtt"),
        "loop": host.loop_status(),
    }


def status(
    host: ConsoleHost,
    seq: int,
    full: bool,
    sections: dict[str, Any],
    now: float | None = None,
    running: tuple[int | None, str | None] = (None, None),
) -> dict[str, Any]:
    """One status; ``running`` is the console configuration (version, checksum) the
    live configuration comes from (``ConsoleCommands.running``), in every status so
    that the console's convergence follows restarts and reloads, not old acks."""
    return {
        "type": "status",
        "seq": seq,
        "time": time.time() if now is None else now,
        "full": full,
        "view": view(host),
        "counts": host.counts(),
        # published, routed, delivered; and bridged: what its bridges forwarded
        "totals": {**host.broker.counters(), "bridged": host.bridged_total()},
        "rates": dict(host.rates),
        "config_version": running[0],
        "config_checksum": running[1],
        **sections,
    }


def stopping(spid: str, reason: str) -> dict[str, Any]:
    """Sent first on a planned stop (SIGTERM, SIGINT): the link closing next is not
    a crash."""
    return {"type": "stopping", "spid": spid, "reason": reason}


def ack(
    command_id: str,
    ok: bool,
    result: dict[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    return {"type": "ack", "id": command_id, "ok": ok, "result": result, "error": error}
