"""What the server shows and takes orders through: ``ctl`` status and commands on
the control socket (``control.py``), and the console link's host interface
(``brokerd.consolelink.host.ConsoleHost``). ``Server`` mixes this in; the state
it reads is the server's own."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from brokerd.cluster.config import ClusterConfigError, parse_host
from brokerd.cluster.knownhosts import MembershipError
from brokerd.consolelink import inforce
from brokerd.consolelink.host import HostRefused
from brokerd.protocol.moving import MoveError, check_restorable
from brokerd.server import bridging, dump, federating, queueops
from brokerd.server.amqp import AMQPProtocol
from brokerd.server.control import ControlError
from brokerd.tls import TLSSettings

if TYPE_CHECKING:
    from brokerd.server.app import Server

#: how long ``brokerd ctl cluster forget`` waits for the root and for a majority
FORGET_WAIT = 15.0


#: bridge and federation link rows one status carries at most (the console's bound)
BRIDGE_ROWS_MAX = 256


class Surface:
    """Status, ``ctl`` commands and the console's orders, over the server's state."""

    def server_properties(self: Server) -> dict[str, Any]:
        # a standalone server's name is its own (RabbitMQ's is its node name): federation
        # tells sites apart by it, and a loop ends only where the names differ
        name = (
            self.cluster_config.name
            if self.cluster_config is not None
            else f"rookery@{socket.gethostname()}:{self.port or self.tls_port or 0}"
        )
        # lane_probes: this server echoes ``cluster.lane-probe`` (a peer probes only
        # servers that say so, so a rolling upgrade never rebuilds links to old ones)
        properties: dict[str, Any] = {"spid": self.spid, "cluster_name": name, "lane_probes": 1}
        group = self.cluster.hostgroup if self.cluster is not None else None
        if group is not None:
            # a link that reached this host's port learns whose it is, and its workers
            properties |= {"host": group.host_id, "host_links": list(group.links)}
        return properties

    def cluster_summary(self: Server) -> dict[str, Any]:
        """The cluster view for dumps; a standalone server has no root and no peers."""
        if self.cluster is not None:
            return self.cluster.summary()
        return {"role": "standalone", "root": None, "peers_active": 0, "peers_known": 0}

    @property
    def status_interval(self: Server) -> float:
        """Seconds between console statuses: the cluster heartbeat, or 1 s standalone."""
        return self.cluster.config.heartbeat_interval if self.cluster is not None else 1.0

    def counts(self: Server) -> dict[str, int]:
        """Current sizes for the console's ``counts`` (walks connections and vhosts)."""
        channels = [
            ch
            for proto in self.connections.values()
            if proto.machine is not None
            for ch in proto.machine.channels.values()
        ]
        totals = self.broker.totals()
        return {
            "connections": len(self.connections),
            "channels": len(channels),
            "consumers": totals["consumers"],
            "vhosts": totals["vhosts"],
            "exchanges": totals["exchanges"],
            "queues": totals["queues"],
            "bindings": totals["bindings"],
            "messages_ready": totals["messages_ready"],
            "messages_unacked": sum(ch.unacked_count for ch in channels),
        }

    def status(self: Server) -> dict[str, Any]:
        """``brokerd ctl status --json``: identity, cluster view, counts."""
        counts = {
            "port": self.port,
            "tls_port": self.tls_port,
            "address": self.address,
            "started": self.started,
            "rates": self.rates,
            **self.counts(),  # the broker's totals() and the connection counts
            "totals": self.broker.counters(),
            "store": self.store.describe(),
            "blocked": dict(self._blocks),
            "resources": self.resources.status(),
            "loop": self.loopwatch.describe(),
            "settings": self.settings_in_force(),
            "console": None
            if self.console is None
            else {
                "url": self.console.url,
                "connected": self.console.connected,
                "config_version": self.console.commands.config_version,
                "config_checksum": self.console.commands.config_checksum,
            },
        }
        if self.cluster is not None:
            config = self.cluster.config
            heartbeat = {
                "interval": config.heartbeat_interval,
                "timeout": config.heartbeat_timeout,
                "open_timeout": config.open_timeout,
            }
            status = self.cluster.status()
            alarms = status.get("alarms", []) + self.resources.alarm_list()
            return {**status, "alarms": alarms, "heartbeat": heartbeat, **counts}
        return {
            "alarms": self.resources.alarm_list(),
            "spid": self.spid,
            "type": "standalone",
            "is_root": False,
            "root": None,
            "ready": True,
            "root_enabled": False,
            "peers": [],
            "checksum": None,
            **counts,
        }

    def control(
        self: Server, request: dict[str, Any]
    ) -> dict[str, Any] | Awaitable[dict[str, Any]]:
        """Answer one control-socket request (see brokerd/ctl/); a queue move is
        answered once it ends (a coroutine)."""
        command = request["command"]
        if command == "status":
            return self.status()
        if command == "dump":
            return {"dump": self.state_dump()}
        args = request.get("args") or []
        if command == "queues" and len(args) == 2 and args[0] in ("grow", "shrink"):
            if self.cluster is None:
                raise ControlError(f"'queues {args[0]}' needs a clustered broker (--cluster)")
            return self._regroup(args[0], args[1])
        if command == "queues" and args == ["rebalance"]:
            return self._queue_op(queueops.rebalance, self.cluster, None)
        if command == "queues":
            return {"spid": self.spid, "queues": dump.queue_table(self)}
        if command == "connections":
            return {"spid": self.spid, "connections": dump.connection_table(self)}
        if command == "bridges":
            return bridging.control(self, args)
        if command == "federation":
            return federating.control(self, args)
        if command == "queue" and len(args) == 3 and args[0] == "move":
            if not all(isinstance(a, str) and a for a in args):
                raise ControlError("queue move takes a queue name and a primary's spid")
            return self._queue_move(args[1], args[2])
        if command == "ready":
            return self.readiness()
        if command == "cluster" and args and args[0] in ("members", "forget"):
            if self.cluster is None:
                raise ControlError(f"'cluster {args[0]}' needs a clustered broker (--cluster)")
            if args == ["members"]:
                return self.cluster.operations.member_table()
            if len(args) == 2 and isinstance(args[1], str):
                return self._forget(args[1])
            raise ControlError("cluster forget takes one HOST:PORT")
        if command in ("root", "fault"):
            if self.cluster is None:
                raise ControlError(f"'{command}' needs a clustered broker (started with --cluster)")
            args = request.get("args") or []
            try:
                if command == "root" and args in (["enable"], ["disable"]):
                    return self.cluster.set_root_enabled(args[0] == "enable")
                if command == "fault" and len(args) == 2 and args[0] == "cut-link":
                    return self.cluster.cut_link(args[1])
                if command == "fault" and args == ["heal"]:
                    return self.cluster.heal()
            except ValueError as exc:
                raise ControlError(str(exc)) from None
            raise ControlError(f"bad arguments for '{command}': {args}")
        raise ControlError(f"unknown command '{command}'")

    def _adopt(
        self: Server, state: dict[str, Any], sock: socket.socket
    ) -> Callable[[], Awaitable[None]]:
        """A sibling hands this worker a connection: MoveError unless its user and
        vhost are here; else what starts serving it, once the sibling let go."""
        check_restorable(self.broker, state)
        if self._stopping is not None and self._stopping.is_set():
            raise MoveError("this worker is stopping")

        async def start() -> None:
            loop = asyncio.get_running_loop()
            await loop.connect_accepted_socket(lambda: AMQPProtocol(self, state), sock=sock)

        return start

    async def _forget(self: Server, address: str) -> dict[str, Any]:
        assert self.cluster is not None
        try:
            host = str(parse_host(address, "cluster forget"))
            return await self.cluster.member_changes.forget(host, FORGET_WAIT)
        except (ClusterConfigError, MembershipError) as exc:
            raise ControlError(str(exc)) from None

    async def _regroup(self: Server, action: str, address: str) -> dict[str, Any]:
        assert self.cluster is not None
        try:
            host = str(parse_host(address, f"queues {action}"))
        except ClusterConfigError as exc:
            raise ControlError(str(exc)) from None
        return await self.cluster.group_changes.change(action, host, FORGET_WAIT)

    def readiness(self: Server) -> dict[str, Any]:
        """``brokerd ctl ready`` (a Kubernetes readiness probe): ready once this server
        serves clients and has caught up: a root is known, it holds the root's state,
        its copy of the shared queues is whole, and it is a member (not joining)."""
        cluster = self.cluster
        if cluster is None:
            return {"ready": True, "reason": "standalone"}
        if not cluster.ready:
            return {"ready": False, "reason": cluster.not_ready_reason or "cluster not ready"}
        if cluster.member_changes.joining:
            return {"ready": False, "reason": "joining: not admitted to the cluster yet"}
        if not cluster.copy_complete():
            return {"ready": False, "reason": "catching up: its copy of the shared queues"}
        return {"ready": True, "reason": "ready"}

    def _queue_op(self: Server, op: Any, *args: Any) -> Any:
        try:
            return op(*args)
        except queueops.QueueOpError as exc:
            raise ControlError(str(exc)) from None

    async def _queue_move(self: Server, name: str, to: str) -> dict[str, Any]:
        try:
            return await queueops.move_and_wait(self.cluster, None, name, to)
        except queueops.QueueOpError as exc:
            raise ControlError(str(exc)) from None

    # -- the console link's host (brokerd.consolelink.host.ConsoleHost) -----------

    @property
    def worker_of(self: Server) -> tuple[str, int, int] | None:
        address = self.options.host_address
        if address is None:
            return None
        return address, self.options.worker_index, self.options.host_workers

    @property
    def server_type(self: Server) -> str:
        """primary or secondary: what a clustered server was started as."""
        return self.options.server_type

    @property
    def cluster_checksum(self: Server) -> str | None:
        return self.cluster.checksum if self.cluster is not None else None

    def cluster_status(self: Server) -> dict[str, Any] | None:
        """The cluster controller's status; None for a standalone server."""
        return self.cluster.status() if self.cluster is not None else None

    def resource_status(self: Server) -> dict[str, Any]:
        return self.resources.status()

    def resource_alarms(self: Server) -> list[dict[str, Any]]:
        return self.resources.alarm_list()

    def loop_status(self: Server) -> dict[str, Any]:
        return self.loopwatch.describe()

    def bridge_status(self: Server) -> list[dict[str, Any]]:
        """The bridges' and the federation links' rows (a link is a bridge too)."""
        rows = self.bridges.status() if self.bridges is not None else []
        if self.federation is not None:
            rows += self.federation.status()
        return rows[:BRIDGE_ROWS_MAX]

    def bridged_total(self: Server) -> int:
        total = self.bridges.forwarded_total() if self.bridges is not None else 0
        if self.federation is not None:
            total += self.federation.forwarded_total()
        return total

    def cluster_members(self: Server) -> dict[str, Any] | None:
        """``brokerd ctl cluster members --json`` (the console's ``view.members``)."""
        return self.cluster.operations.member_table() if self.cluster is not None else None

    def settings_in_force(self: Server) -> dict[str, Any]:
        """The configuration in force and where each part came from (file, the
        console's document, default): ``ctl status`` and the console's drift view."""
        if self.console is not None:
            return self.console.commands.in_force()
        return inforce.in_force(self.config, self.cluster_config, None)

    @property
    def tls_settings(self: Server) -> TLSSettings | None:
        return self.listeners.tls

    def state_dump(self: Server) -> str:
        """The full state dump (SIGUSR1, ``brokerd ctl dump``, the console's state.dump)."""
        return dump.full(self)

    def set_root_enabled(self: Server, enabled: bool) -> bool:
        """The console's root.enable / root.disable: the control socket's ``root``
        command; what it refuses is refused with the same text."""
        try:
            result = self.control({"command": "root", "args": ["enable" if enabled else "disable"]})
        except ControlError as exc:
            raise HostRefused(str(exc)) from None
        return result["root_enabled"]  # type: ignore[index]

    def move_queue(self: Server, vhost: str, name: str, to: str) -> dict[str, Any]:
        """The console's queue.move: asked of the root, answered at once."""
        try:
            return queueops.request_move(self.cluster, vhost, name, to)
        except queueops.QueueOpError as exc:
            raise HostRefused(str(exc)) from None

    async def forget_member(self: Server, address: str) -> dict[str, Any]:
        """The console's cluster.forget: ``brokerd ctl cluster forget``, refused alike."""
        if self.cluster is None:
            raise HostRefused("cluster.forget needs a clustered broker (--cluster)")
        try:
            return await self._forget(address)
        except ControlError as exc:
            raise HostRefused(str(exc)) from None

    async def change_groups(self: Server, action: str, address: str) -> dict[str, Any]:
        """The console's queues.grow|shrink: ``brokerd ctl queues grow|shrink``."""
        if self.cluster is None:
            raise HostRefused(f"queues.{action} needs a clustered broker (--cluster)")
        try:
            return await self._regroup(action, address)
        except ControlError as exc:
            raise HostRefused(str(exc)) from None

    def rebalance_queues(self: Server, vhost: str) -> dict[str, Any]:
        """The console's queues.rebalance."""
        try:
            return queueops.rebalance(self.cluster, vhost)
        except queueops.QueueOpError as exc:
            raise HostRefused(str(exc)) from None
