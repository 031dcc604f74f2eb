"""The console link's JSON messages (docs/protocol.md, "Console link").

Builders turn the server's state into ``hello``/``status``/``ack`` bodies;
``parse`` checks what the console sends. No sockets here.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import brokerd

if TYPE_CHECKING:
    from brokerd.server.app import Server

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


def hello(server: Server, config_version: int | None, config_checksum: str | None) -> dict:
    cluster = server.cluster_config
    return {
        "type": "hello",
        "spid": server.spid,
        "name": server.address,
        "address": server.address,
        "broker_type": server.options.server_type if cluster is not None else "standalone",
        "version": brokerd.__version__,
        "start_time": server.started,
        "cluster": cluster.name if cluster is not None else None,
        "checksum": server.cluster.checksum if server.cluster is not None else None,
        "heartbeat_interval": server.status_interval,
        "config_version": config_version,
        "config_checksum": config_checksum,
    }


def view(server: Server) -> dict[str, Any]:
    """The cluster as this server sees it (a standalone broker: ready, no peers)."""
    resources = server.resources
    if server.cluster is None:
        return {
            "is_root": False,
            "root": None,
            "ready": True,
            "root_enabled": False,
            "quorum": None,
            "vote": None,
            "reason": "standalone",
            "checksum": None,
            "alarms": resources.alarm_list(),
            "resources": resources.status(),
            "peers": [],
        }
    status = server.cluster.status()
    return {
        **{
            key: status.get(key)
            for key in ("is_root", "root", "ready", "root_enabled", "quorum", "vote", "reason")
        },
        "checksum": status["checksum"],
        "alarms": status.get("alarms", []) + resources.alarm_list(),
        "resources": resources.status(),
        "peers": [{key: peer.get(key) for key in PEER_FIELDS} for peer in status["peers"]],
        # the cluster under load: flow control, each link's backlog, unsettled forwards
        # and replica lag, the status-echo round trips and the event loop's lag
        "flow": status.get("flow"),
        "lanes": status.get("lanes"),
        "echo_rtt": status.get("echo_rtt"),
        "loop": server.loopwatch.describe(),
    }


def status(
    server: Server,
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
        "view": view(server),
        "counts": server.counts(),
        "totals": server.broker.counters(),
        "rates": dict(server.rates),
        "config_version": running[0],
        "config_checksum": running[1],
        **sections,
    }


def ack(
    command_id: str,
    ok: bool,
    result: dict[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    return {"type": "ack", "id": command_id, "ok": ok, "result": result, "error": error}
