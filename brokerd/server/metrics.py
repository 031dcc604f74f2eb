"""Prometheus ``/metrics`` for brokerd, read from the model at scrape time.

Nothing is counted for Prometheus on the message path: a custom collector
walks the same counters the console link uses (``Broker.counters``, the
per-queue ``stats_*``) when a scrape comes. Names follow RabbitMQ's
Prometheus plugin where a metric means the same thing; Rookery's own (cluster
role, logins, lossy drops) are ``rookery_*``. The HTTP side is a few lines
on the broker's own event loop, so a scrape never reads the model from
another thread; it answers ``GET /metrics`` and nothing else.

Memory and disk come from the resource monitor's latest reading (ten a
second), not from a new one per scrape.

Dead-lettering follows RabbitMQ 3.10's global counters: one family per
reason (expired, rejected, maxlen), labelled with the queue type and the
dead-letter strategy (``at_most_once`` with a DLX, ``disabled`` without).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from brokerd.bridges.runner import BLOCKED, RUNNING, STARTING, TERMINATED
from brokerd.model.auth import is_loopback
from brokerd.server.host import ServerState

if TYPE_CHECKING:
    from brokerd.cluster.config import ClusterConfig
    from brokerd.server.login import LoginService

log = logging.getLogger("brokerd.metrics")

#: Broker.counters() key -> (RabbitMQ plugin name without _total, help)
GLOBAL_COUNTERS = {
    "published": ("rabbitmq_global_messages_received", "Messages published by clients"),
    "routed": ("rabbitmq_global_messages_routed", "Message copies routed to queues"),
    "delivered": ("rabbitmq_global_messages_delivered", "Deliveries and basic.get-oks"),
    "acked": ("rabbitmq_global_messages_acknowledged", "Deliveries acknowledged by clients"),
    "redelivered": ("rabbitmq_global_messages_redelivered", "Deliveries with redelivered set"),
    "returned": (
        "rabbitmq_global_messages_unroutable_returned",
        "Unroutable mandatory messages returned to publishers",
    ),
}

BRIDGE_STATES = (STARTING, RUNNING, BLOCKED, TERMINATED)

MAX_REQUEST_BYTES = 8192
REQUEST_TIMEOUT = 5.0


class MetricsHost(ServerState, Protocol):
    """What a scrape reads of the server (``brokerd.server.app.Server``)."""

    @property
    def logins(self) -> LoginService: ...

    @property
    def cluster_config(self) -> ClusterConfig | None: ...

    def counts(self) -> dict[str, int]: ...

    def bridge_status(self) -> list[dict[str, Any]]: ...


class BrokerCollector(Collector):
    """Builds every metric family from the server's model when scraped."""

    def __init__(self, server: MetricsHost) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        server = self.server
        counts = server.counts()
        for key, name, help_text in (
            ("connections", "rabbitmq_connections", "Open AMQP connections"),
            ("channels", "rabbitmq_channels", "Open channels"),
            ("consumers", "rabbitmq_consumers", "Consumers"),
            ("queues", "rabbitmq_queues", "Queues"),
            ("exchanges", "rookery_exchanges", "Exchanges, predeclared ones included"),
            ("bindings", "rookery_bindings", "Bindings"),
        ):
            yield GaugeMetricFamily(name, help_text, value=counts[key])
        # the console link's totals (a fixed set), plus the redelivery count
        counters = {**server.broker.counters(), "redelivered": server.broker.messages_redelivered}
        for key, (name, help_text) in GLOBAL_COUNTERS.items():
            yield CounterMetricFamily(name, help_text, value=counters.get(key, 0))
        yield from self._resources()
        yield from self._queues()
        yield from self._exchanges()
        yield from self._cluster()
        yield from self._bridges()
        logins = server.logins
        yield CounterMetricFamily(
            "rookery_login_checks", "Password checks run (cached logins excluded)", logins.checks
        )
        yield CounterMetricFamily("rookery_login_refused", "Logins refused", logins.refused)

    def _bridges(self) -> Iterator[Metric]:
        """Each bridge's state (one series per state, 1 for the current one, as an
        alert wants: ``rookery_bridge_state{state="running"} == 0 for 5m``), what it
        moved, and what is in flight."""
        rows = self.server.bridge_status()
        labels = ["vhost", "name"]
        state = GaugeMetricFamily(
            "rookery_bridge_state", "Bridge state (1: the current one)", labels=[*labels, "state"]
        )
        forwarded = CounterMetricFamily(
            "rookery_bridge_forwarded",
            "Messages a bridge published to its destination",
            labels=labels,
        )
        acknowledged = CounterMetricFamily(
            "rookery_bridge_acknowledged",
            "Messages a bridge acknowledged at its source (moved for good)",
            labels=labels,
        )
        in_flight = GaugeMetricFamily(
            "rookery_bridge_in_flight", "Published, not confirmed yet", labels=labels
        )
        backlog = GaugeMetricFamily(
            "rookery_bridge_backlog",
            "Messages in a bridge's source queue, when last asked",
            labels=labels,
        )
        for row in rows:
            key = [row["vhost"], row["name"]]
            if row.get("backlog") is not None:
                backlog.add_metric(key, row["backlog"])
            for name in BRIDGE_STATES:
                state.add_metric([*key, name], 1.0 if row["state"] == name else 0.0)
            forwarded.add_metric(key, row["forwarded"])
            acknowledged.add_metric(key, row["acknowledged"])
            in_flight.add_metric(key, row["in_flight"])
        yield from (state, forwarded, acknowledged, in_flight, backlog)

    def _resources(self) -> Iterator[Metric]:
        status = self.server.resources.status()
        memory, disk = status["memory"], status["disk"]
        yield GaugeMetricFamily(
            "rabbitmq_process_resident_memory_bytes",
            "Memory used in bytes (resident set size)",
            value=memory["used"],
        )
        yield GaugeMetricFamily(
            "rabbitmq_resident_memory_limit_bytes",
            "Memory high watermark in bytes",
            value=memory["limit"],
        )
        yield GaugeMetricFamily(
            "rabbitmq_alarms_memory_used_watermark",
            "1 if the memory alarm is in effect (publishers blocked)",
            value=int(memory["alarm"]),
        )
        if disk["free"] is not None:
            yield GaugeMetricFamily(
                "rabbitmq_disk_space_available_bytes",
                "Disk space available in bytes (the data directory's filesystem)",
                value=disk["free"],
            )
        yield GaugeMetricFamily(
            "rabbitmq_disk_space_available_limit_bytes",
            "Free disk space low watermark in bytes",
            value=disk["limit"],
        )
        yield GaugeMetricFamily(
            "rabbitmq_alarms_free_disk_space_watermark",
            "1 if the free disk space alarm is in effect (publishers blocked)",
            value=int(disk["alarm"]),
        )
        store = self.server.store
        yield CounterMetricFamily(
            "rookery_store_corrupt_records",
            "Journal records that failed their CRC or framing check when read back",
            value=store.corrupt,
        )
        yield GaugeMetricFamily(
            "rookery_alarms_store_integrity",
            "1 if a message was found corrupt on disk since the broker started",
            value=int(store.corrupt > 0),
        )

    def _queues(self) -> Iterator[Metric]:
        labels = ["vhost", "queue"]
        ready = GaugeMetricFamily(
            "rabbitmq_queue_messages_ready", "Messages ready for delivery", labels=labels
        )
        unacked = GaugeMetricFamily(
            "rabbitmq_queue_messages_unacked",
            "Messages delivered and not yet acknowledged",
            labels=labels,
        )
        total = GaugeMetricFamily(
            "rabbitmq_queue_messages", "Ready plus unacknowledged messages", labels=labels
        )
        consumers = GaugeMetricFamily("rabbitmq_queue_consumers", "Consumers", labels=labels)
        published = CounterMetricFamily(
            "rabbitmq_queue_messages_published",
            "Message copies enqueued (or handed straight to a consumer)",
            labels=labels,
        )
        delivered = CounterMetricFamily(
            "rookery_queue_messages_delivered", "Deliveries and get-oks", labels=labels
        )
        expired = CounterMetricFamily(
            "rookery_queue_messages_expired", "Messages expired (message TTL)", labels=labels
        )
        dead_lettered = CounterMetricFamily(
            "rookery_queue_messages_dead_lettered",
            "Copies dead-lettered to the queue's dead-letter exchange",
            labels=labels,
        )
        corrupt = CounterMetricFamily(
            "rookery_queue_messages_corrupt",
            "Messages whose record failed its check when read back from disk (not delivered)",
            labels=labels,
        )
        for vhost in self.server.broker.vhosts.values():
            for queue in vhost.queues.values():
                key = [vhost.name, queue.name]
                ready.add_metric(key, queue.message_count)
                unacked.add_metric(key, queue.unacked)
                total.add_metric(key, queue.message_count + queue.unacked)
                consumers.add_metric(key, queue.consumer_count)
                published.add_metric(key, queue.stats_in)
                delivered.add_metric(key, queue.stats_out)
                expired.add_metric(key, queue.stats_expired)
                dead_lettered.add_metric(key, queue.stats_dead_lettered)
                corrupt.add_metric(key, queue.stats_corrupt)
        yield from (ready, unacked, total, consumers, published, delivered, expired, dead_lettered)
        yield corrupt
        yield from self._dead_lettered()

    def _dead_lettered(self) -> Iterator[Metric]:
        counts: dict[tuple[str, str], int] = {}
        for vhost in self.server.broker.vhosts.values():
            for key, count in vhost.dead_letters.counts.items():
                counts[key] = counts.get(key, 0) + count
        for reason in ("expired", "rejected", "maxlen"):
            family = CounterMetricFamily(
                f"rabbitmq_global_messages_dead_lettered_{reason}",
                f"Messages dead-lettered for the reason {reason}",
                labels=["queue_type", "dead_letter_strategy"],
            )
            for strategy in ("at_most_once", "disabled"):
                family.add_metric(
                    ["rabbit_classic_queue", strategy], counts.get((reason, strategy), 0)
                )
            yield family

    def _exchanges(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            "rookery_exchange_messages_dropped",
            "Messages an x-lossy exchange dropped on purpose",
            labels=["vhost", "exchange"],
        )
        for vhost in self.server.broker.vhosts.values():
            for exchange in vhost.exchanges.values():
                lost = getattr(exchange.muxer, "dropped", None)
                if isinstance(lost, int):
                    dropped.add_metric([vhost.name, exchange.name], lost)
        yield dropped

    def _cluster(self) -> Iterator[Metric]:
        summary = self.server.cluster_summary()
        role = GaugeMetricFamily(
            "rookery_cluster_role",
            "This server's role (1 for the current one: standalone, root, primary, secondary)",
            labels=["role"],
        )
        role.add_metric([str(summary.get("role"))], 1)
        yield role
        root = summary.get("root")
        yield GaugeMetricFamily(
            "rookery_cluster_is_root",
            "1 if this server is the cluster root",
            value=int(summary.get("role") == "root"),
        )
        yield GaugeMetricFamily(
            "rookery_cluster_has_root", "1 if the cluster has a root", value=int(root is not None)
        )
        yield GaugeMetricFamily(
            "rookery_cluster_peers_active",
            "Peers whose statuses arrive in time",
            value=summary.get("peers_active", 0),
        )
        yield GaugeMetricFamily(
            "rookery_cluster_peers_known", "Peers known", value=summary.get("peers_known", 0)
        )
        yield from self._load()
        info = GaugeMetricFamily(
            "rookery_identity_info", "This server's spid and cluster", labels=["spid", "cluster"]
        )
        cluster = self.server.cluster_config
        info.add_metric([self.server.spid, cluster.name if cluster else "standalone"], 1)
        yield info

    def _load(self) -> Iterator[Metric]:
        """The cluster under load: the links' lanes, flow control, the event loop's
        lag and the status-echo round trips (issue 21's observability)."""
        lag = self.server.loopwatch.lag
        loop = GaugeMetricFamily(
            "rookery_event_loop_lag_seconds",
            "How late the event loop woke, over its last minute (quantile 1 is the max)",
            labels=["quantile"],
        )
        for q in (0.5, 0.99):
            loop.add_metric([str(q)], lag.percentile(q * 100) or 0.0)
        loop.add_metric(["1"], max(lag.samples, default=0.0))
        yield loop
        cluster = self.server.cluster
        if cluster is None:
            return
        echo = GaugeMetricFamily(
            "rookery_cluster_echo_rtt_seconds",
            "Status-echo round trips to the peers (the root's lease rests on them), recent window",
            labels=["quantile"],
        )
        window = cluster.echo_rtt
        for q in (0.5, 0.99):
            echo.add_metric([str(q)], window.percentile(q * 100) or 0.0)
        echo.add_metric(["1"], max(window.samples, default=0.0))
        yield echo
        backlog = GaugeMetricFamily(
            "rookery_cluster_link_backlog_bytes",
            "Bytes queued on the link's lane to a peer, not yet taken by the transport",
            labels=["peer", "lane"],
        )
        unsettled = GaugeMetricFamily(
            "rookery_cluster_unsettled_forwards",
            "Forwards to a peer not settled yet",
            labels=["peer"],
        )
        lag_events = GaugeMetricFamily(
            "rookery_cluster_replica_lag_events",
            "On the root: replication events a replica has not acked",
            labels=["peer"],
        )
        for spid, lane in cluster.lanes_status().items():
            backlog.add_metric([spid, "data"], lane.get("backlog", 0))
            backlog.add_metric([spid, "control"], lane.get("control_backlog", 0))
            unsettled.add_metric([spid], lane.get("unsettled", 0))
            if lane.get("replica_lag") is not None:
                lag_events.add_metric([spid], lane["replica_lag"])
        yield backlog
        yield unsettled
        yield lag_events
        flow = cluster.flow
        causes = GaugeMetricFamily(
            "rookery_flow_control_paused_connections",
            "Connections flow control holds unread, by cause",
            labels=["cause"],
        )
        for cause, held in flow.held.items():
            causes.add_metric([cause], len(held))
        yield causes
        episodes = CounterMetricFamily(
            "rookery_flow_control_episodes",
            "Times each flow-control cause came on",
            labels=["cause"],
        )
        for cause, count in flow.episodes.items():
            episodes.add_metric([cause], count)
        yield episodes


class MetricsServer:
    """``GET /metrics`` over HTTP/1.0 on the broker's loop (one request per connection)."""

    def __init__(
        self, server: MetricsHost, bind: str, port: int, unix_path: Path | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(server))
        self.bind = bind
        self.port = port
        #: a worker of ``brokerd --workers``: served on this socket, for the parent's
        #: one endpoint (``brokerd/host/metrics.py``), never on a port of its own
        self.unix_path = unix_path
        self._server: asyncio.AbstractServer | None = None

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def start(self) -> None:
        if self.unix_path is not None:
            self.unix_path.unlink(missing_ok=True)
            self._server = await asyncio.start_unix_server(self._handle, str(self.unix_path))
            self.unix_path.chmod(0o600)
            return
        self._server = await asyncio.start_server(self._handle, self.bind, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        if is_loopback(self.bind):
            log.info("metrics listening bind=%s port=%d (loopback only)", self.bind, self.port)
        else:
            log.warning(
                "metrics listening bind=%s port=%d: reachable from the network, without "
                "authentication (the default binds 127.0.0.1)",
                self.bind,
                self.port,
            )

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            writer.close()
            return
        if len(head) > MAX_REQUEST_BYTES:
            await self._reply(writer, 431, "text/plain", b"request header too large\n")
            return
        parts = head.split(b"\r\n", 1)[0].split()
        method = parts[0] if parts else b""
        path = parts[1].split(b"?", 1)[0] if len(parts) > 1 else b""
        if method not in (b"GET", b"HEAD"):
            await self._reply(writer, 405, "text/plain", b"only GET\n")
        elif path != b"/metrics":
            await self._reply(writer, 404, "text/plain", b"see /metrics\n")
        else:
            try:
                body = self.render()
            except Exception:  # a collector bug must not take the broker down
                log.exception("metrics scrape failed")
                await self._reply(writer, 500, "text/plain", b"scrape failed; see the log\n")
                return
            await self._reply(
                writer, 200, CONTENT_TYPE_LATEST, b"" if method == b"HEAD" else body, len(body)
            )

    @staticmethod
    async def _reply(
        writer: asyncio.StreamWriter,
        status: int,
        content_type: str,
        body: bytes,
        length: int | None = None,
    ) -> None:
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large"}
        head = (
            f"HTTP/1.0 {status} {reason.get(status, 'Error')}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n"
            "Connection: close\r\n\r\n"
        )
        try:
            writer.write(head.encode() + body)
            await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()
