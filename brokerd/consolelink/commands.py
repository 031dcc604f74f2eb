"""The console's commands: config.apply, root.enable/disable, state.dump, queue.move,
queues.rebalance, cluster.forget, queues.grow/shrink.

Every command is answered with an ``ack``. The console retries until it has
one, so the broker remembers the last 256 command ids and answers a repeat
with the first answer instead of executing twice. Most are answered at once;
``cluster.forget`` waits for the root and for a majority of the members, and
``queues.grow``/``queues.shrink`` for the root's answer per queue, so their
ack is a future the link sends when it resolves, reading other messages
meanwhile (a repeat of its id while it runs gets the same future).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections import OrderedDict
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from brokerd.cluster.config import ClusterConfig, ClusterConfigError, HostPort, parse_host
from brokerd.config import BrokerConfig, parse_limits, parse_vhost_limits
from brokerd.configdoc import ConfigDocumentError, document_checksum, validate_document
from brokerd.consolelink import inforce, messages
from brokerd.consolelink.host import HostRefused
from brokerd.model.auth import Permission, User

if TYPE_CHECKING:
    from brokerd.consolelink.host import ConsoleHost

log = logging.getLogger("brokerd.console")

REMEMBERED_COMMANDS = 256


class CommandError(Exception):
    """A command that cannot run; the message becomes the ack's ``error``."""


#: every command the broker runs (docs/protocol.md, "Console to broker")
COMMANDS = (
    "config.apply",
    "root.enable",
    "root.disable",
    "state.dump",
    "queue.move",
    "queues.rebalance",
    "cluster.forget",
    "queues.grow",
    "queues.shrink",
)
#: commands that change the quorum groups, and the action each asks of the root
GROUP_CHANGES = {"queues.grow": "grow", "queues.shrink": "shrink"}
#: what ``handle`` returns: the ack, or (a command that waits) the ack to come
Answer = dict[str, Any] | asyncio.Future[dict[str, Any]]
#: an AMQP short string (a vhost, a queue name) holds at most this many bytes
SHORTSTR_MAX = 255


def text_arg(command: str, args: dict[str, Any], key: str) -> str:
    """``args[key]``, a non-empty string that fits an AMQP short string: the console
    checks the same, so anything else comes from a console that does not."""
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise CommandError(f"{command} needs {key!r}, a non-empty string")
    if len(value.encode("utf-8", "surrogatepass")) > SHORTSTR_MAX:
        raise CommandError(f"{command} {key!r} is longer than {SHORTSTR_MAX} bytes")
    return value


def address_arg(command: str, args: dict[str, Any]) -> str:
    """``args["address"]``, a member's ``host:port`` (port 5672 when left out, as ``brokerd
    ctl cluster forget`` takes it), normalised as the members list it."""
    value = text_arg(command, args, "address")
    try:
        address = parse_host(value, f"{command} 'address'")
    except ClusterConfigError as exc:
        raise CommandError(str(exc)) from None
    if not isinstance(address, HostPort):
        raise CommandError(f"{command} 'address' must be HOST:PORT, not a link socket")
    return str(address)


BROKER_PARTS = ("limits", "vhosts", "vhost_limits", "users", "permissions")
CLUSTER_PARTS = ("heartbeat", "known_hosts")


def merge_broker_config(baseline: BrokerConfig, doc: dict[str, Any]) -> BrokerConfig:
    """The broker configuration a validated document gives over ``baseline`` (the
    broker's own file): parts it carries replace the file's, parts it omits are the
    file's, so the result depends on the document alone, never on what an earlier
    version left behind. Without a ``permissions`` part, the file's permissions of
    the remaining users apply. (A vhost an earlier version added stays on the broker
    until it restarts: ``install_config`` only adds vhosts, removing one would drop
    its queues.)"""
    vhosts = list(baseline.vhosts)
    for name in doc.get("vhosts", []):
        if name not in vhosts:
            vhosts.append(name)
    users = baseline.users
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
        permissions = [p for p in baseline.permissions if p[0] in names and p[1] in vhosts]
    # the document was validated: parsing its normalised parts again cannot fail
    limits = baseline.limits
    if "limits" in doc:
        limits = parse_limits(doc["limits"], "limits", minimum=1)
    vhost_limits = baseline.vhost_limits
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
        store=baseline.store,
        vhost_limits=vhost_limits,
        tls=baseline.tls,
        explicit=baseline.explicit,
    )


def merge_cluster_config(baseline: ClusterConfig, doc: dict[str, Any]) -> ClusterConfig:
    """The cluster configuration a validated document gives over ``baseline`` (the
    cluster file): heartbeat timing and known hosts from the document when it has
    them, else the file's."""
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
    return dataclasses.replace(baseline, **changes)


class ConsoleCommands:
    """Runs the console's commands against one host (the server); lives as long as it,
    so the applied configuration survives reconnects.

    A configuration document is laid over the broker's own files (its baseline:
    ``brokerd.toml`` and the cluster file as last read), so a missing key means
    the file's value, whatever an earlier version set. :meth:`running` says which
    console version the live configuration comes from; every hello and status
    carries it, and it is what the console's convergence compares.
    """

    def __init__(self, host: ConsoleHost) -> None:
        self.host = host
        #: the last document applied in this run, its version, checksum and push serial
        self.config_version: int | None = None
        self.config_checksum: str | None = None
        self.config_serial: int | None = None
        self._doc: dict[str, Any] | None = None
        #: the broker's own configurations, and the objects apply() put in force over them
        self._file_config: BrokerConfig | None = None
        self._file_cluster: ClusterConfig | None = None
        self._installed_config: BrokerConfig | None = None
        self._installed_cluster: ClusterConfig | None = None
        self._answers: OrderedDict[str, dict[str, Any]] = OrderedDict()
        #: commands still running (cluster.forget, queues.grow|shrink), by id: a retry
        #: waits for the same ack
        self._running: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._in_force: tuple[tuple[Any, Any, Any], dict[str, Any]] | None = None

    def running(self) -> tuple[int | None, str | None]:
        """(version, checksum) of the console document the live configuration comes
        from, or (None, None) when it is the broker's own files: nothing applied in
        this run, or a SIGHUP re-read ``brokerd.toml`` over a document with broker
        parts (users, vhosts, permissions, limits)."""
        doc = self._doc
        if doc is None:
            return None, None
        host = self.host
        if host.config is not self._installed_config:
            if any(part in doc for part in BROKER_PARTS):
                return None, None
            # the document has no broker part: the reloaded file is what it means
            self._file_config = self._installed_config = host.config
        if host.cluster_config is not self._installed_cluster:
            return None, None
        return self.config_version, self.config_checksum

    def applied_document(self) -> dict[str, Any] | None:
        """The console document the live configuration comes from (None when the
        broker's own files rule, as ``running`` says)."""
        return self._doc if self.running() != (None, None) else None

    def in_force(self) -> dict[str, Any]:
        """The configuration in force and where each part came from (``inforce``)."""
        host = self.host
        applied = self.applied_document()
        # made again only when one of its inputs was replaced (they are never mutated)
        inputs = (host.config, host.cluster_config, applied)
        cached = self._in_force
        if cached is None or any(a is not b for a, b in zip(cached[0], inputs, strict=True)):
            cached = self._in_force = (inputs, inforce.in_force(*inputs))
        return cached[1]

    def _baselines(self) -> tuple[BrokerConfig, ClusterConfig | None]:
        """The broker's own configurations: what it read from its files, unless what is
        in force now is what an earlier apply() installed over them."""
        host = self.host
        if self._file_config is None or host.config is not self._installed_config:
            self._file_config = host.config
        if self._file_cluster is None or host.cluster_config is not self._installed_cluster:
            self._file_cluster = host.cluster_config
        return self._file_config, self._file_cluster

    def handle(self, message: dict[str, Any]) -> Answer:
        """The ack for a parsed ``command`` message; a repeated id gets the first ack.
        A command that waits (cluster.forget, queues.grow|shrink) returns a future of
        its ack instead, so the link can go on reading while it runs (needs a running
        event loop)."""
        command_id = message["id"]
        previous = self._answers.get(command_id)
        if previous is not None:
            log.info("console command id=%s repeated: answering as before", command_id)
            return previous
        running = self._running.get(command_id)
        if running is not None:
            log.info("console command id=%s repeated while it runs: one answer", command_id)
            return running
        name = message["command"]
        try:
            result = self.execute(name, message.get("args") or {})
        except CommandError as exc:
            answer = self._refused(name, command_id, exc)
        else:
            if inspect.isawaitable(result):
                future = asyncio.ensure_future(self._finish(name, command_id, result))
                self._running[command_id] = future
                return future
            answer = messages.ack(command_id, True, result)
            log.info("console command %s id=%s done", name, command_id)
        self._remember(command_id, answer)
        return answer

    async def _finish(
        self, name: str, command_id: str, result: Awaitable[dict[str, Any]]
    ) -> dict[str, Any]:
        """The ack of a command that waits, remembered like any other once it ends."""
        try:
            answer = messages.ack(command_id, True, await result)
            log.info("console command %s id=%s done", name, command_id)
        except CommandError as exc:
            answer = self._refused(name, command_id, exc)
        except Exception as exc:
            # answered all the same: a console left without an ack retries for a minute
            log.exception("console command %s id=%s failed", name, command_id)
            answer = messages.ack(command_id, False, error=f"{name} failed: {exc}")
        finally:
            self._running.pop(command_id, None)
        self._remember(command_id, answer)
        return answer

    @staticmethod
    def _refused(name: str, command_id: str, exc: CommandError) -> dict[str, Any]:
        log.warning("console command %s id=%s refused: %s", name, command_id, exc)
        return messages.ack(command_id, False, error=str(exc))

    def _remember(self, command_id: str, answer: dict[str, Any]) -> None:
        self._answers[command_id] = answer
        while len(self._answers) > REMEMBERED_COMMANDS:
            self._answers.popitem(last=False)

    def execute(
        self, name: str, args: dict[str, Any]
    ) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """Run command ``name``: its result, or an awaitable of it (cluster.forget,
        queues.grow/shrink)."""
        if name == "config.apply":
            return self.apply(args)
        if name in ("root.enable", "root.disable"):
            try:
                enabled = self.host.set_root_enabled(name == "root.enable")
            except HostRefused as exc:
                raise CommandError(str(exc)) from None
            return {"root_enabled": enabled}
        if name == "state.dump":
            return {"dump": self.host.state_dump()}
        if name == "queue.move":
            vhost, queue, to = (text_arg(name, args, key) for key in ("vhost", "queue", "to"))
            try:
                return self.host.move_queue(vhost, queue, to)
            except HostRefused as exc:
                raise CommandError(str(exc)) from None
        if name == "queues.rebalance":
            try:
                return self.host.rebalance_queues(text_arg(name, args, "vhost"))
            except HostRefused as exc:
                raise CommandError(str(exc)) from None
        if name == "cluster.forget":
            # answered once a majority of the remaining members holds the new set (or
            # the wait is over: ``committed`` false)
            address = self._member_arg(name, args, "cluster members to forget")
            return self._refusable(self.host.forget_member(address))
        if name in GROUP_CHANGES:
            # answered once the root answered for every queue (its new group or why not)
            address = self._member_arg(name, args, "quorum groups to change")
            return self._refusable(self.host.change_groups(GROUP_CHANGES[name], address))
        raise CommandError(f"unknown command {name!r} (known: {', '.join(COMMANDS)})")

    def _member_arg(self, name: str, args: dict[str, Any], what: str) -> str:
        """The member ``address`` a command about the cluster's members names; refused
        on a worker of a host, whose local cluster is its host's workers, no cluster
        the console manages."""
        address = address_arg(name, args)
        if self.host.worker_of is not None:
            raise CommandError(f"{name}: a worker of a host has no {what}")
        return address

    @staticmethod
    async def _refusable(result: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        """A command that waits: what the host answers, its refusal as the ack's error."""
        try:
            return await result
        except HostRefused as exc:
            raise CommandError(str(exc)) from None

    def _check_order(self, version: int, serial: Any) -> int | None:
        """A push older than the one applied must not roll the broker back (a late
        retry): pushes are ordered by ``serial`` when the console sends one (a version
        may be pushed again later), else by version number."""
        if serial is not None:
            if not isinstance(serial, int) or isinstance(serial, bool) or serial < 1:
                raise CommandError("config.apply 'serial' must be a positive integer")
            if self.config_serial is not None and serial < self.config_serial:
                raise CommandError(
                    f"configuration push {serial} is older than the applied push "
                    f"{self.config_serial}"
                )
            return serial
        if self.config_version is not None and version < self.config_version:
            raise CommandError(
                f"configuration version {version} is older than the applied version "
                f"{self.config_version}"
            )
        return None

    def apply(self, args: dict[str, Any]) -> dict[str, Any]:
        """config.apply: validate the whole document, then put it in force over the
        broker's own files (every part: a part it lacks goes back to the file's)."""
        version = args.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise CommandError("config.apply needs 'version', a positive integer")
        serial = self._check_order(version, args.get("serial"))
        if "config" not in args:
            raise CommandError("config.apply needs 'config', the configuration document")
        try:
            doc = validate_document(args["config"])
        except ConfigDocumentError as exc:
            raise CommandError(f"config: {exc}") from None
        host = self.host
        file_config, file_cluster = self._baselines()
        applied = [p for p in BROKER_PARTS if p in doc]
        skipped: list[str] = []
        broker_config = merge_broker_config(file_config, doc)
        host.install_config(broker_config)
        self._installed_config = broker_config
        cluster_parts = [p for p in CLUSTER_PARTS if p in doc]
        if file_cluster is None or host.worker_of is not None:
            # a standalone broker has no cluster to retime, and a host's workers keep
            # their own (their local cluster is the host's, written at its start)
            skipped += cluster_parts
        else:
            cluster_config = merge_cluster_config(file_cluster, doc)
            host.reconfigure_cluster(cluster_config)
            self._installed_cluster = host.cluster_config
            applied += cluster_parts
        host.configure_bridges(doc.get("bridges"))
        host.configure_federation(doc.get("federation_upstreams"), doc.get("policies"))
        applied += [p for p in ("bridges", "federation_upstreams", "policies") if p in doc]
        self._doc = doc
        self.config_version = version
        self.config_serial = serial
        self.config_checksum = document_checksum(doc)
        # kept with the durable wiring: after a restart the broker runs it again at
        # once, even before (or without) the console answering
        host.keep_console_config({"version": version, "serial": serial, "config": doc})
        log.warning(
            "console configuration applied version=%d checksum=%s applied=%s skipped=%s "
            "(missing parts: the broker's own files)",
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
