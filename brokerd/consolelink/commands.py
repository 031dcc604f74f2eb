"""The console's commands: config.apply, root.enable/disable, state.dump.

Every command is answered with an ``ack``. The console retries until it has
one, so the broker remembers the last 256 command ids and answers a repeat
with the first answer instead of executing twice.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from brokerd.cluster.config import ClusterConfig, parse_host
from brokerd.config import BrokerConfig, parse_limits, parse_vhost_limits
from brokerd.configdoc import ConfigDocumentError, document_checksum, validate_document
from brokerd.consolelink import messages
from brokerd.model.auth import Permission, User
from brokerd.server import dump
from brokerd.server.control import ControlError

if TYPE_CHECKING:
    from brokerd.server.app import Server

log = logging.getLogger("brokerd.console")

REMEMBERED_COMMANDS = 256


class CommandError(Exception):
    """A command that cannot run; the message becomes the ack's ``error``."""


def merge_broker_config(current: BrokerConfig, doc: dict[str, Any]) -> BrokerConfig:
    """The broker configuration after a validated document: parts it carries
    replace the current ones, parts it omits stay. Users without a
    ``permissions`` part keep the permissions they had."""
    vhosts = list(current.vhosts)
    for name in doc.get("vhosts", []):
        if name not in vhosts:
            vhosts.append(name)
    users = current.users
    if "users" in doc:
        users = [
            User(
                u["name"], u["password_hash"], tuple(u["tags"]), loopback_only=u["name"] == "guest"
            )
            for u in doc["users"]
        ]
    if "permissions" in doc:
        permissions = [
            (p["user"], p["vhost"], Permission(p["configure"], p["write"], p["read"]))
            for p in doc["permissions"]
        ]
    else:
        names = {u.name for u in users}
        permissions = [p for p in current.permissions if p[0] in names and p[1] in vhosts]
    # the document was validated: parsing its normalised parts again cannot fail
    limits = parse_limits(doc["limits"], "limits", minimum=1) if "limits" in doc else current.limits
    vhost_limits = current.vhost_limits
    if "vhost_limits" in doc:
        vhost_limits = {
            name: parse_vhost_limits(entry, f"vhost_limits.{name}")
            for name, entry in doc["vhost_limits"].items()
        }
    return BrokerConfig(
        vhosts=vhosts,
        users=users,
        permissions=permissions,
        limits=limits,
        vhost_limits=vhost_limits,
    )


def merge_cluster_config(current: ClusterConfig, doc: dict[str, Any]) -> ClusterConfig:
    """The cluster configuration after a validated document (heartbeat, known hosts)."""
    changes: dict[str, Any] = {}
    if "heartbeat" in doc:
        heartbeat = doc["heartbeat"]
        changes.update(
            heartbeat_interval=heartbeat["interval"],
            heartbeat_timeout=heartbeat["timeout"],
            open_timeout=heartbeat["open_timeout"],
        )
    if "known_hosts" in doc:
        changes["known_hosts"] = tuple(
            parse_host(address, "known_hosts") for address in doc["known_hosts"]
        )
    return dataclasses.replace(current, **changes)


class ConsoleCommands:
    """Runs the console's commands against one server; lives as long as the server,
    so the applied configuration version survives reconnects."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.config_version: int | None = None
        self.config_checksum: str | None = None
        self._answers: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """The ack for a parsed ``command`` message; a repeated id gets the first ack."""
        command_id = message["id"]
        previous = self._answers.get(command_id)
        if previous is not None:
            log.info("console command id=%s repeated: answering as before", command_id)
            return previous
        name = message["command"]
        try:
            result = self.execute(name, message.get("args") or {})
            answer = messages.ack(command_id, True, result)
        except CommandError as exc:
            log.warning("console command %s id=%s refused: %s", name, command_id, exc)
            answer = messages.ack(command_id, False, error=str(exc))
        else:
            log.info("console command %s id=%s done", name, command_id)
        self._answers[command_id] = answer
        while len(self._answers) > REMEMBERED_COMMANDS:
            self._answers.popitem(last=False)
        return answer

    def execute(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name == "config.apply":
            return self.apply(args)
        if name in ("root.enable", "root.disable"):
            try:
                result = self.server.control({"command": "root", "args": [name[5:]]})
            except ControlError as exc:
                raise CommandError(str(exc)) from None
            return {"root_enabled": result["root_enabled"]}
        if name == "state.dump":
            return {"dump": dump.full(self.server)}
        raise CommandError(
            f"unknown command {name!r} (known: config.apply, root.enable, root.disable, state.dump)"
        )

    def apply(self, args: dict[str, Any]) -> dict[str, Any]:
        """config.apply: validate the whole document, then apply every part live."""
        version = args.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise CommandError("config.apply needs 'version', a positive integer")
        if self.config_version is not None and version < self.config_version:
            raise CommandError(
                f"configuration version {version} is older than the applied version "
                f"{self.config_version}"
            )
        if "config" not in args:
            raise CommandError("config.apply needs 'config', the configuration document")
        try:
            doc = validate_document(args["config"])
        except ConfigDocumentError as exc:
            raise CommandError(f"config: {exc}") from None
        server = self.server
        applied: list[str] = []
        skipped: list[str] = []
        broker_parts = [
            p for p in ("limits", "vhosts", "vhost_limits", "users", "permissions") if p in doc
        ]
        if broker_parts:
            server.install_config(merge_broker_config(server.config, doc))
            applied += broker_parts
        cluster_parts = [p for p in ("heartbeat", "known_hosts") if p in doc]
        if cluster_parts and server.cluster_config is None:
            skipped += cluster_parts  # a standalone broker has no cluster to retime
        elif cluster_parts:
            assert server.cluster_config is not None
            server.reconfigure_cluster(merge_cluster_config(server.cluster_config, doc))
            applied += cluster_parts
        self.config_version = version
        self.config_checksum = document_checksum(doc)
        log.warning(
            "console configuration applied version=%d checksum=%s applied=%s skipped=%s",
            version,
            self.config_checksum,
            ",".join(applied) or "-",
            ",".join(skipped) or "-",
        )
        return {
            "config_version": version,
            "config_checksum": self.config_checksum,
            "applied": applied,
            "skipped": skipped,
        }
