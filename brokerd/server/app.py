"""The brokerd server: listener, timers, signals and graceful shutdown."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import logging
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brokerd.bridges.federation_service import FederationService
from brokerd.bridges.service import BridgeService
from brokerd.cluster.config import (
    ClusterConfig,
    ClusterConfigError,
    SocketPath,
    load_cluster_config,
)
from brokerd.cluster.controller import ClusterController, ClusterExchange
from brokerd.cluster.hostgroup import HostGroup, worker_socket
from brokerd.cluster.identity import make_spid
from brokerd.cluster.messages import CLUSTER_EXCHANGE, LINK_PROPERTY
from brokerd.cluster.wiring.recovered import shared_wiring
from brokerd.config import BrokerConfig, ConfigError, load_config
from brokerd.consolelink.link import ConsoleLink
from brokerd.model.auth import Permission, User, hash_password
from brokerd.model.broker import Broker
from brokerd.model.errors import CONNECTION_FORCED
from brokerd.model.exchange import Exchange
from brokerd.model.throttle import LoginThrottle
from brokerd.protocol import ConnectionState
from brokerd.server import bridging, dump, federating
from brokerd.server.amqp import AMQPProtocol
from brokerd.server.control import serve_control
from brokerd.server.handoff import HandoffListener, Mover, handoff_path
from brokerd.server.hostshare import HostShare, SharedLoginThrottle
from brokerd.server.listeners import ListenerError, make_listeners
from brokerd.server.login import LoginService, default_concurrency
from brokerd.server.loopwatch import LoopWatch
from brokerd.server.metrics import MetricsServer
from brokerd.server.resources import ResourceMonitor
from brokerd.server.surface import Surface
from brokerd.server.worker import host_stopping
from brokerd.store.disk import DiskStore

#: a ticker turn this late (seconds since the last) follows a stall: the sockets are
#: read for ``STALL_READ`` seconds before heartbeats are judged (``Server._ticker``)
TICK_STALL = 1.5
STALL_READ = 0.05

log = logging.getLogger("brokerd.server")

#: how long a stopping server waits for its clients' close-ok before it drops them:
#: a client that answers at all answers within milliseconds, and SIGTERM must end
#: the process in well under two seconds when nothing is in flight
SHUTDOWN_GRACE = 1.0


@dataclass
class ServerOptions:
    bind: str = "0.0.0.0"
    #: the plain AMQP port (None: no plain listener) and the AMQPS port (None: none)
    port: int | None = 5672
    tls_port: int | None = None
    data_dir: Path = Path("var/brokerd")
    config_file: Path | None = None
    cluster_file: Path | None = None
    server_type: str = "primary"
    #: a member's address to join a running cluster through (``--join``)
    join: str | None = None
    fault_injection: bool = False
    #: the console's broker endpoint (ws:// or wss://) and its shared token
    console_url: str | None = None
    console_token: str = ""
    #: wss:// only: the CA bundle that verifies the console (None: the system's trust store)
    console_cafile: Path | None = None
    #: Prometheus /metrics port (None: off) and the address it binds (loopback by default)
    metrics_port: int | None = None
    metrics_bind: str = "127.0.0.1"
    #: a worker of ``brokerd --workers`` (brokerd/host/): its siblings bind the same
    #: ports, link to it at ``link_socket``, and clients know the host as ``host_address``
    reuse_port: bool = False
    link_socket: Path | None = None
    host_address: str | None = None
    #: the supervising parent's state file: says whether the whole host is stopping
    host_state: Path | None = None
    #: the host's workers: each takes this share of the memory high watermark
    host_workers: int = 1
    #: the file the host's workers count connections and failed logins in, and this
    #: worker's slot in it (``hostshare.py``; None: not a worker)
    host_share: Path | None = None
    worker_index: int = 0
    #: a worker's metrics, for the parent's one endpoint (None: --metrics-port, or none)
    metrics_socket: Path | None = None
    #: a worker of a host in a cluster of hosts: every worker's TCP link port, by
    #: index, and the host's id for this start (``cluster/hostgroup.py``)
    link_ports: tuple[int, ...] = ()
    host_id: str = ""


class Server(Surface):
    """One broker process. It is the host its parts are handed: the console link's
    ``ConsoleHost`` (brokerd/consolelink/host.py), and ``AMQPHost``, ``DumpHost``,
    ``MetricsHost`` in amqp.py, dump.py and metrics.py; each names only what its
    part reads, and this class satisfies them structurally."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.started = time.time()
        self.spid = make_spid(self.started)
        config = load_config(options.config_file)
        #: the broker configuration in force (file, then SIGHUP reloads and console applies)
        self.config = config
        self.cluster_config: ClusterConfig | None = None
        if options.cluster_file is not None:
            self.cluster_config = load_cluster_config(options.cluster_file)
            if options.link_ports:  # a host of a cluster: every host runs as many workers
                self.cluster_config = dataclasses.replace(
                    self.cluster_config, host_workers=options.host_workers
                )
        #: durable wiring and queue journals under the data directory
        self.store = DiskStore(
            options.data_dir / "store",
            segment_size=config.store.segment_size,
            compact_every=config.store.compact_interval,
            page_limit=config.store.queue_memory_limit,
        )
        self.broker = Broker(config.user_database(), config.vhosts, config.limits, self.store)
        self.broker.vhost_limits = dict(config.vhost_limits)
        self.cluster: ClusterController | None = None
        if self.cluster_config is not None:
            self._install_cluster_user(config)
        self.connections: dict[int, AMQPProtocol] = {}
        #: a worker's host: connections and failed logins counted with its siblings
        self.host_share: HostShare | None = None
        throttle: LoginThrottle | None = None
        if options.host_share is not None:
            self.host_share = HostShare(
                options.host_share, options.host_workers, options.worker_index
            )
            self.broker.host_counts = self.host_share
            throttle = SharedLoginThrottle(self.host_share)
        #: password checks off the loop; reads ``broker.users`` at each check (reloads swap it)
        self.logins = LoginService(
            lambda: self.broker.users,
            throttle=throttle,
            concurrency=max(1, default_concurrency() // max(options.host_workers, 1)),
        )
        #: messages per second over the last ticker second
        self.rates = {"published": 0.0, "routed": 0.0, "delivered": 0.0}
        self._last_counters = (time.monotonic(), self.broker.counters())
        #: host:port this server is known by (cluster callback, console name); set at start
        links_tls = self.cluster_config is not None and self.cluster_config.tls is not None
        self.address = f"{options.bind}:{options.tls_port if links_tls else options.port}"
        self.console: ConsoleLink | None = None
        self.metrics: MetricsServer | None = None
        #: the plain and AMQPS listeners (bound at start)
        self.listeners = make_listeners(options, config.tls, self.cluster_config)
        self.tls_port = options.tls_port
        self._stopping: asyncio.Event | None = None
        #: why this server is stopping (the signal), told to the console first
        self.stop_reason = "stop requested"
        self._control: asyncio.AbstractServer | None = None
        self.port = options.port
        self._cluster_secret_hash = ""
        #: why publishers are blocked, by cause (cluster not ready, links behind, memory, disk)
        self._blocks: dict[str, str] = {}
        self._blocks_scheduled = False
        #: memory high watermark and disk free limit (causes "memory" and "disk")
        self.resources = ResourceMonitor(
            lambda: self.broker.limits,
            options.data_dir,
            self.block_publishers,
            share=options.host_workers,
        )
        self.resources.other_alarms.append(self.store.alarm)
        #: how late the event loop runs (a late loop paces publishers: flow control)
        self.loopwatch = LoopWatch(self._loop_lag)
        #: a worker of a host: client connections move to the sibling holding their
        #: queues (``handoff.py``), and come in from siblings on its hand-over socket
        self.mover: Mover | None = None
        self.handoff: HandoffListener | None = None
        #: the shovels this server runs (``bridging``), and their local login
        self.bridges: BridgeService | None = None
        self.federation: FederationService | None = None
        self._bridge_password = ""
        self._bridge_password_hash = ""

    def _install_cluster_user(self, config: BrokerConfig) -> None:
        """The cluster vhost exists and the cluster user (password = secret) may use it."""
        cluster = self.cluster_config
        assert cluster is not None
        self.broker.add_vhost(cluster.vhost)
        if not getattr(self, "_cluster_secret_hash", ""):
            self._cluster_secret_hash = hash_password(cluster.secret)
        users = self.broker.users
        users.add_user(User(cluster.user, self._cluster_secret_hash, ("cluster",)))
        users.set_permission(cluster.user, cluster.vhost, Permission())

    @property
    def hooks(self) -> ClusterController | None:
        return self.cluster

    # -- lifecycle ----------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.options.data_dir.mkdir(parents=True, exist_ok=True)
        self._stopping = asyncio.Event()
        # the cluster's queue types go in before recovery declares the durable queues,
        # and recovery is done before any client can connect
        if self.cluster_config is not None:
            self._make_cluster(self.cluster_config)
        self.store.recover(self.broker)
        self.store.start()
        if self.cluster is not None:
            # each durable shared queue's last owner, for a whole-cluster restart
            shared = self.cluster.config.vhost
            self.cluster.placer.recovered_owners = self.store.wiring.owners(shared)
            self.cluster.placer.recovered_groups = self.store.wiring.groups(shared)
            vhost = self.broker.vhosts.get(shared)
            self.cluster.holds_state = vhost is not None and bool(shared_wiring(vhost))
            self.cluster.queues.on_owner = functools.partial(self.store.wiring.put_owner, shared)
        self.resources.start()
        self.loopwatch.start()
        # before the port listens: a client (or a test) that saw it listening may
        # signal at once, and a signal with no handler yet would end the process
        # (SIGHUP, SIGTERM) or, inherited as ignored from the parent, be lost
        for sig, handler in (
            (signal.SIGUSR1, self.dump_full),
            (signal.SIGUSR2, self.dump_line),
            (signal.SIGTERM, functools.partial(self.stop, "SIGTERM")),
            (signal.SIGINT, functools.partial(self.stop, "SIGINT")),
            (signal.SIGHUP, self.reload),
        ):
            loop.add_signal_handler(sig, handler)
        await self.listeners.start(lambda: AMQPProtocol(self))
        self.port, self.tls_port = self.listeners.port, self.listeners.tls_port
        # the address peers link to: the AMQPS port when links run over TLS
        links_tls = self.cluster_config is not None and self.cluster_config.tls is not None
        self.address = f"{self.listeners.host()}:{self.tls_port if links_tls else self.port}"
        if self.options.link_ports:
            self.address = f"{self.listeners.host()}:{self.listeners.link_port}"
        elif self.options.link_socket is not None:
            self.address = str(SocketPath(str(self.options.link_socket)))
        self._ticker_task = loop.create_task(self._ticker())
        self._control = await serve_control(self.options.data_dir, self.control)
        self.bridges = bridging.start(self)
        self.federation = federating.start(self)
        if self.handoff is not None:
            await self.handoff.start()
        if self.options.metrics_socket is not None:
            self.metrics = MetricsServer(self, "", 0, self.options.metrics_socket)
            await self.metrics.start()
        elif self.options.metrics_port is not None:
            self.metrics = MetricsServer(self, self.options.metrics_bind, self.options.metrics_port)
            try:
                await self.metrics.start()
            except OSError as exc:
                log.error(
                    "cannot listen for metrics on %s:%d: %s",
                    self.options.metrics_bind,
                    self.options.metrics_port,
                    exc.strerror,
                )
                raise
        if self.cluster is not None:
            self.cluster.address = self.address
            self.cluster.client_address = self.options.host_address
            await self.cluster.start()
        if self.options.console_url:
            self.console = ConsoleLink(
                self,
                self.options.console_url,
                self.options.console_token,
                self.options.console_cafile,
            )
            self._restore_console_config(self.console)
            self.console.start()
        log.info(
            "listening spid=%s bind=%s port=%s tls_port=%s data_dir=%s",
            self.spid,
            self.options.bind,
            "off" if self.port is None else self.port,
            "off" if self.tls_port is None else self.tls_port,
            self.options.data_dir,
        )

    def configure_bridges(self, bridges: list[dict[str, Any]] | None) -> None:
        bridging.configure(self, bridges)

    def configure_federation(
        self, upstreams: list[dict[str, Any]] | None, policies: list[dict[str, Any]] | None
    ) -> None:
        federating.configure(self, upstreams, policies)

    def keep_console_config(self, record: dict[str, Any]) -> None:
        """The console's configuration just applied, kept with the durable wiring."""
        self.store.wiring.put_setting("console_config", record)

    def _restore_console_config(self, console: ConsoleLink) -> None:
        """The last configuration the console applied (users, vhosts, permissions,
        limits, cluster timing), from the store: in force again before the console
        answers. The console still pushes its current version on hello."""
        stored = self.store.wiring.setting("console_config")
        if not isinstance(stored, dict):
            return
        try:
            result = console.commands.apply(stored)
        except Exception as exc:  # a document this version refuses: the files rule
            log.error("stored console configuration not applied: %s", exc)
            return
        # what the console pushes next is newer by definition (it may be a new console
        # whose push serials start again at 1)
        console.commands.config_serial = None
        log.warning("stored console configuration version=%s in force", result["config_version"])

    def _make_cluster(self, config: ClusterConfig) -> None:
        """The controller (not started: it learns its address once listening)."""
        self.cluster = ClusterController(
            config,
            spid=self.spid,
            server_type=self.options.server_type,
            start_time=self.started,
            address=self.address,
            fault_injection=self.options.fault_injection,
            on_ready_change=self._cluster_ready_changed,
            load=self.broker.totals,
            broker=self.broker,
            on_block=self.block_publishers,
            on_flow=self._flow,
            on_detach=self._cluster_detached,
            term_path=self.options.data_dir / "cluster" / "term.json",
            members_dir=self.options.data_dir / "cluster",
            join=self.options.join,
        )
        options = self.options
        if options.link_ports and options.link_socket is not None:  # a host of a cluster
            host_dir = options.link_socket.parent
            self.cluster.hostgroup = HostGroup(
                host_id=options.host_id,
                host_address=options.host_address or "",
                index=options.worker_index,
                sockets=tuple(
                    str(SocketPath(str(worker_socket(host_dir, k))))
                    for k in range(options.host_workers)
                ),
                links=tuple(f"{self.listeners.host()}:{port}" for port in options.link_ports),
            )
        if self.options.link_socket is not None:  # a worker of a host
            self.mover = Mover(self.cluster)
            self.handoff = HandoffListener(handoff_path(self.options.link_socket), self._adopt)
        vhost = self.broker.vhosts[config.vhost]
        vhost.exchanges[CLUSTER_EXCHANGE] = Exchange(
            CLUSTER_EXCHANGE, ClusterExchange.type_name, durable=True, muxer=ClusterExchange({})
        )

    def _cluster_ready_changed(self, ready: bool, reason: str) -> None:
        """Admit connections waiting in connection.open; block or unblock publishers."""
        if ready:
            for proto in list(self.connections.values()):
                if proto.machine is not None:
                    proto.machine.readmit()
                    proto.flush()
        self.block_publishers("cluster", None if ready else f"cluster not ready: {reason}")

    def _cluster_detached(self, reason: str) -> None:
        """This server cannot reach the root the others reach: send its clients to
        another server now (320) instead of holding them for as long as the cut lasts.
        Those waiting in connection.open are refused by admission, with the reason."""
        closed = 0
        for proto in list(self.connections.values()):
            conn = proto.machine
            if conn is None or isinstance(conn.client_properties.get(LINK_PROPERTY), dict):
                continue
            if conn.state is ConnectionState.AWAIT_ADMISSION:
                conn.readmit()  # admission now refuses it with 320 and the reason
            elif conn.state is ConnectionState.OPEN:
                conn.close(CONNECTION_FORCED, reason)
            else:
                continue
            proto.flush()
            closed += 1
        log.warning("detached: %d client connections sent elsewhere (%s)", closed, reason)

    def _loop_lag(self, lag: float) -> None:
        if self.cluster is not None:
            self.cluster.loop_lag(lag)

    def _flow(self, conn_id: int, paused: bool) -> None:
        """Flow control pauses (or resumes) reading from one connection: a client
        publishing into a backlog, or a peer's data lane (``brokerd.cluster.plane.flow``)."""
        proto = self.connections.get(conn_id)
        if proto is not None:
            proto.set_flow(paused)

    def block_publishers(self, cause: str, reason: str | None) -> None:
        """Set or clear one cause of blocking; client connections are blocked while
        any cause holds (connection.blocked, and a publish stops their reading)."""
        if reason is None:
            self._blocks.pop(cause, None)
        else:
            self._blocks[cause] = reason
        if not self._blocks_scheduled:
            # applied at the end of this loop turn: causes that hand over to each other
            # in one step (the root's link went down, then there is no root) never
            # flap a connection.unblocked in between
            self._blocks_scheduled = True
            asyncio.get_running_loop().call_soon(self._apply_blocks)

    def _apply_blocks(self) -> None:
        self._blocks_scheduled = False
        effective = next(iter(self._blocks.values()), None)
        for proto in list(self.connections.values()):
            conn = proto.machine
            if conn is None or conn.cluster_link or conn.state is not ConnectionState.OPEN:
                # cluster links carry the traffic that unblocks everyone; one still
                # opening may turn out to be a link, and a client is told at its open
                continue
            proto.set_blocked(effective)

    @property
    def blocked_reason(self) -> str | None:
        return next(iter(self._blocks.values()), None)

    async def serve_forever(self) -> None:
        await self.start()
        assert self._stopping is not None
        await self._stopping.wait()
        await self.shutdown()

    def stop(self, reason: str = "stop requested") -> None:
        log.info("stop requested spid=%s reason=%s", self.spid, reason)
        self.stop_reason = reason
        if self._stopping is not None:
            self._stopping.set()

    async def shutdown(self) -> None:
        """Hand root over, move the queues this server owns to the other primaries,
        stop accepting, close every client with 320, wait briefly for close-ok. Root
        and queues go first, while this server still listens: a peer that found the
        port refused with the links closed would take it for dead, the clients sent
        away find a root where they reconnect, and the queues move with nothing
        redelivered instead of failing over."""
        if self.console is not None:
            await self.console.announce_stop(self.stop_reason)
        if self.cluster is not None and not host_stopping(self.options.host_state):
            await self.cluster.hand_over()
            await self.cluster.move_queues_away()
        if self.bridges is not None:  # in flight goes back to their sources
            await self.bridges.close()
        if self.federation is not None:
            await self.federation.close()
        self.listeners.close()
        self.resources.stop()
        self.loopwatch.stop()
        if self._control is not None:
            self._control.close()
        if self.handoff is not None:
            await self.handoff.stop()
        if self.metrics is not None:
            self.metrics.close()
        if self.console is not None:
            await self.console.stop()
        if self.cluster is not None:
            await self.cluster.stop()
        for proto in list(self.connections.values()):
            if proto.machine is not None:
                proto.machine.close(CONNECTION_FORCED, "broker shutdown")
                proto.flush()
        deadline = time.monotonic() + SHUTDOWN_GRACE
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for proto in list(self.connections.values()):
            if proto.transport is not None:
                proto.transport.abort()
        self.logins.close()
        if self.host_share is not None:  # the parent clears this worker's slot when it ends
            self.broker.host_counts = None
            self.host_share.close()
        await self.store.close()  # what is appended is on disk before the process ends
        log.info("stopped spid=%s", self.spid)

    async def _ticker(self) -> None:
        ticked = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            if time.monotonic() - ticked > TICK_STALL:
                # the loop stalled (a pause, a long turn): what peers sent meanwhile waits
                # unread in the sockets; read it before any silence is judged
                await asyncio.sleep(STALL_READ)
            now = time.monotonic()
            for proto in list(self.connections.values()):
                proto.tick(now)
            if self.bridges is not None:
                self.bridges.tick()  # a placement, or the root link, changed
            if self.federation is not None:
                self.federation.tick()  # objects, bindings or the root changed
            ticked = now
            then, last = self._last_counters
            counters = self.broker.counters()
            span = max(now - then, 1e-6)
            self.rates = {k: (counters[k] - last[k]) / span for k in self.rates}
            self._last_counters = (now, counters)

    # -- signals ------------------------------------------------------------------

    def dump_full(self) -> None:
        for line in self.state_dump().splitlines():
            log.warning("dump %s", line)

    def dump_line(self) -> None:
        log.warning("status %s", dump.one_line(self))

    def reload(self) -> None:
        try:
            config = load_config(self.options.config_file)
        except ConfigError as exc:
            log.error("reload failed: %s", exc)
            return
        except Exception as exc:  # a file of the wrong shape (users = ["x"]): keep running
            log.error(
                "reload failed: %s: %s: %s", self.options.config_file, type(exc).__name__, exc
            )
            return
        self.install_config(config)
        self.listeners.reload(config.tls)
        log.info("reloaded config=%s users=%d", self.options.config_file, len(config.users))

    def install_config(self, config: BrokerConfig) -> None:
        """Put users, permissions, limits and vhosts in force live (SIGHUP, console).

        Vhosts are only ever added: removing one would drop its queues.
        Connections keep what they negotiated; new ones get the new limits.
        """
        self.config = config
        self.broker.users = config.user_database()
        self.broker.limits = config.limits
        if config.store.queue_memory_limit != self.store.page_limit:
            self.store.page_limit = config.store.queue_memory_limit
            for vhost in self.broker.vhosts.values():
                for queue in vhost.queues.values():
                    queue.page_limit = config.store.queue_memory_limit
        self.broker.vhost_limits = dict(config.vhost_limits)
        if self.host_share is not None:  # the vhosts the host counts may have changed
            with self.host_share.locked():
                self.host_share.publish(
                    self.broker.connection_count, self.broker._limited_connections()
                )
        if self.cluster_config is not None:
            self._install_cluster_user(config)
        for name in config.vhosts:
            self.broker.add_vhost(name)
        if self.bridges is not None:
            bridging.install_user(self)

    def reconfigure_cluster(self, config: ClusterConfig) -> None:
        """Heartbeat timing and known hosts from the console, applied live."""
        assert self.cluster is not None
        self.cluster_config = config
        self.cluster.reconfigure(config)


def run(options: ServerOptions) -> int:
    try:
        server = Server(options)
    except (ConfigError, ClusterConfigError, ListenerError) as exc:
        log.error("%s", exc)
        print(f"brokerd: {exc}", file=sys.stderr)
        return 2
    # deep queues hold millions of long-lived objects: collect the young
    # generation less often so the collector does not keep walking them
    gc.set_threshold(50_000, 20, 20)
    runner_kwargs: dict[str, Any] = {}
    try:
        import uvloop

        runner_kwargs["loop_factory"] = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    try:
        with asyncio.Runner(**runner_kwargs) as runner:
            runner.run(server.serve_forever())
    except OSError as exc:
        ports = "/".join(str(p) for p in (options.port, options.tls_port) if p is not None)
        log.error("cannot listen on %s:%s: %s", options.bind, ports, exc.strerror)
        return 1
    return 0
