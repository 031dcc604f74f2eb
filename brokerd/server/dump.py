"""State dumps for SIGUSR1 (full, multi-line) and SIGUSR2 (one line), and the queue
table ``brokerd ctl queues`` prints."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.cluster.messages import LINK_PROPERTY
from brokerd.cluster.operations import address_of, retired_spids, worker_name
from brokerd.model.queuetypes import reported_type
from brokerd.server.host import ServerState
from brokerd.server.resources import format_bytes

if TYPE_CHECKING:
    from brokerd.cluster.controller import ClusterController
    from brokerd.server.amqp import AMQPProtocol


class DumpHost(ServerState, Protocol):
    """What a dump reads of the server (``brokerd.server.app.Server``)."""

    @property
    def connections(self) -> Mapping[int, AMQPProtocol]: ...

    @property
    def rates(self) -> Mapping[str, float]: ...

    @property
    def blocked_reason(self) -> str | None: ...

    def bridge_status(self) -> list[dict[str, Any]]: ...


def one_line(server: DumpHost) -> str:
    totals = server.broker.totals()
    queues = [q for v in server.broker.vhosts.values() for q in v.queues.values()]
    unacked = sum(
        ch.unacked_count
        for proto in server.connections.values()
        if proto.machine is not None
        for ch in proto.machine.channels.values()
    )
    cluster = server.cluster_summary()
    res = server.resources.status()
    memory, disk = res["memory"], res["disk"]
    free = "-" if disk["free"] is None else format_bytes(disk["free"]).replace(" ", "")
    alarms = ",".join(a["kind"] for a in server.resources.alarm_list()) or "-"
    return (
        f"spid={server.spid} role={cluster['role']} root={cluster['root'] or '-'} "
        f"peers={cluster['peers_active']}/{cluster['peers_known']} "
        f"checksum={cluster.get('checksum') or '-'} "
        f"connections={len(server.connections)} queues={len(queues)} "
        f"ready={totals['messages_ready']} unacked={unacked} "
        f"in={server.rates['published']:.1f}/s out={server.rates['delivered']:.1f}/s "
        f"mem={format_bytes(memory['used']).replace(' ', '')}"
        f"/{format_bytes(memory['limit']).replace(' ', '')} "
        f"disk_free={free}/{format_bytes(disk['limit']).replace(' ', '')} alarms={alarms}"
    )


def full(server: DumpHost) -> str:
    broker = server.broker
    lines = ["=== brokerd state dump ===", one_line(server)]
    lines.append(f"cluster: {server.cluster_summary()}")
    res = server.resources.status()
    memory, disk = res["memory"], res["disk"]
    lines.append(
        f"memory: used={memory['used']} limit={memory['limit']} total={memory['total']} "
        f"watermark={memory['watermark'] if memory['watermark'] is not None else 'absolute'} "
        f"alarm={memory['alarm']}"
    )
    lines.append(
        f"disk: path={disk['path']} free={disk['free']} limit={disk['limit']} alarm={disk['alarm']}"
    )
    store = server.store.describe()
    lines.append(
        f"store: segments={store['segments']} commits={store['commits']} "
        f"write_failures={store['write_failures']} segments_freed={store['segments_freed']} "
        f"records_copied={store['records_copied']} corrupt={store['corrupt']}"
    )
    lag = server.loopwatch.lag.describe()
    lines.append(
        f"event loop: lag_p50_ms={lag['p50_ms']} lag_p99_ms={lag['p99_ms']} "
        f"lag_max_ms={lag['max_ever_ms']}"
    )
    cluster = server.cluster
    if cluster is not None:
        echo = cluster.echo_rtt.describe()
        lines.append(
            f"status echoes: rtt_p50_ms={echo['p50_ms']} rtt_p99_ms={echo['p99_ms']} "
            f"rtt_max_ms={echo['max_ms']} samples={echo['count']}"
        )
        causes = cluster.flow.describe()
        lines.append(
            "flow control: "
            + (
                " ".join(f"{c}=paused:{v['paused']} ({v['reason']})" for c, v in causes.items())
                or "off"
            )
        )
        orphans = cluster.queues.orphans.describe()
        if orphans["kept"]:
            lines.append(
                f"orphans: {orphans['kept']} forwards kept for {orphans['for_seconds']}s: "
                + "; ".join(
                    f"{name} {q['kept']} ({q['waits'] or 'routable'})"
                    for name, q in orphans["queues"].items()
                )
            )
        retired = retired_spids(cluster)  # a restarted peer's old spid: no row of its own
        for spid, lane in sorted(cluster.lanes_status().items()):
            if spid in retired:
                continue
            lines.append(
                f"  link {spid} state={lane['state']} backlog={lane.get('backlog', 0)} "
                f"control_backlog={lane.get('control_backlog', 0)} "
                f"unsettled={lane['unsettled']} replica_lag={lane['replica_lag']} "
                f"probes={lane.get('probes', 0)} probes_owed={lane.get('probes_owed', 0)}"
            )
    if server.blocked_reason is not None:
        lines.append(f"publishers blocked: {server.blocked_reason}")
    lines.append(f"connections: {len(server.connections)}")
    for proto in server.connections.values():
        conn = proto.machine
        if conn is None:
            continue
        d = conn.describe()
        paused = ",".join(sorted(cluster.flow.held_by(conn.id))) if cluster is not None else ""
        pauses = cluster.flow.pauses.get(conn.id, 0) if cluster is not None else 0
        lines.append(
            f"  connection {d['id']} peer={d['peer']} user={d['user']} vhost={d['vhost']} "
            f"state={d['state']} client={d['client']} channels={d['channels']} "
            f"in={d['messages_in']} out={d['messages_out']}"
            + (f" flow={paused}" if paused else "")
            + (f" flow_pauses={pauses}" if pauses else "")
            + (f" reading=stopped({','.join(sorted(holds))})" if (holds := proto.holds) else "")
            + _link_lane(cluster, conn.id, conn.cluster_link)
        )
        for ch in conn.channels.values():
            c = ch.describe()
            lines.append(
                f"    channel {c['number']} consumers={c['consumers']} unacked={c['unacked']} "
                f"prefetch={c['prefetch']} confirm={c['confirm']} tx={c['tx']} flow={c['flow']}"
            )
            for consumer in ch.consumers.values():
                lines.append(
                    f"      consumer {consumer.tag} queue={consumer.queue.name} "
                    f"no_ack={consumer.no_ack} unacked={consumer.unacked}"
                )
    for vhost in broker.vhosts.values():
        lines.append(f"vhost {vhost.name}")
        for ex in vhost.exchanges.values():
            lines.append(
                f"  exchange {ex.name or '(default)'} type={ex.type_name} durable={ex.durable} "
                f"auto_delete={ex.auto_delete} internal={ex.internal} in={ex.stats_in}"
            )
        for q in vhost.queues.values():
            lines.append(
                f"  queue {q.name} ready={q.message_count} consumers={q.consumer_count} "
                f"durable={q.durable} exclusive={q.exclusive} auto_delete={q.auto_delete} "
                f"in={q.stats_in} out={q.stats_out} dropped={q.stats_dropped} "
                f"expired={q.stats_expired} dead_lettered={q.stats_dead_lettered} "
                f"corrupt={q.stats_corrupt}{_placement(q)}"
            )
        for b in vhost.binding_list():
            kind = "queue" if hasattr(b.destination, "messages") else "exchange"
            lines.append(
                f"  binding {b.source.name} -> {kind} {b.destination.name} "
                f"key={b.routing_key!r} args={b.arguments or {}}"
            )
    for row in server.bridge_status():  # federation links among them
        # URIs redacted by the runner: a dump goes to logs and tickets
        lines.append(
            f"bridge {row['vhost']} {row['name']} state={row['state']} "
            f"reason={row['reason']!r} src={row['src_uri']} dest={row['dest_uri']} "
            f"forwarded={row['forwarded']} acknowledged={row['acknowledged']} "
            f"in_flight={row['in_flight']} sessions={row['sessions']}"
        )
    lines.append("=== end of dump ===")
    return "\n".join(lines)


def _placement(queue: object) -> str:
    """A shared queue's place in the cluster (duck typed: ``SharedQueue``)."""
    owner_spid = getattr(queue, "owner_spid", None)
    if owner_spid is None:
        return ""
    role = "master" if getattr(queue, "local", False) else "proxy"
    text = f" type={getattr(queue, 'kind', '-')} owner={owner_spid() or '-'} role={role}"
    replicas = replica_states(queue)
    if replicas is not None and getattr(queue, "replicated_kind", False):
        text += f" replicas={replica_marks(replicas)}"
    group = getattr(queue, "group", None)
    if group is not None:
        text += f" group={','.join(group)}"
    return text


def replica_states(queue: object) -> list[dict[str, Any]] | None:
    """A shared master's replicas with their in-sync state (duck typed:
    ``SharedQueue.replica_states``); None where this server does not know them."""
    states = getattr(queue, "replica_states", None)
    return states() if states is not None else None


def replica_marks(replicas: list[dict[str, Any]]) -> str:
    """``spid:in-sync:behind,...`` (``syncing`` for one that does not hold every message
    yet), ``-`` for none: one token, so a dump line stays ``key=value`` words."""
    return (
        ",".join(
            f"{r['spid']}:{'in-sync' if r['in_sync'] else 'syncing'}:{r['behind']}"
            for r in replicas
        )
        or "-"
    )


def connection_table(server: ServerState) -> list[dict[str, Any]]:
    """Every AMQP connection as ``brokerd ctl connections`` lists it: the machine's
    ``describe()``, whether it is a cluster link (a peer's lane, not a client), and
    the flow-control causes pausing it now."""
    cluster = getattr(server, "cluster", None)
    rows = []
    for proto in server.connections.values():
        conn = proto.machine
        if conn is None:
            continue
        row = conn.describe()
        row["link"] = isinstance(conn.client_properties.get(LINK_PROPERTY), dict)
        row["flow"] = sorted(cluster.flow.held_by(conn.id)) if cluster is not None else []
        rows.append(row)
    return rows


def queue_table(server: ServerState) -> list[dict[str, Any]]:
    """Every queue as ``brokerd ctl queues`` lists it: a shared queue with its type,
    its owner and this server's role (``master`` here, else ``proxy``: its messages
    are on the owner); any other queue is this server's own (``local``). ``replicas``:
    on a shared master, the servers holding a copy, each in sync or not ([] for a
    classic queue); null elsewhere (a proxy does not know, a local queue has none).
    ``moving``: the primary a move is handing the queue to (null: none under way).
    ``owner_address``, ``moving_address``: where those servers listen (``host:port``;
    null when this server does not know, as on a standalone broker).
    ``group``: the addresses of the primaries keeping a quorum queue's copies, when
    its ``x-quorum-initial-group-size`` leaves some out (null: every primary, or
    none for a classic queue)."""
    rows = []
    cluster = getattr(server, "cluster", None)  # (a test's stand-in may have none)

    def where(spid: str | None) -> str | None:
        return None if cluster is None or spid is None else address_of(cluster, spid)

    for vhost in server.broker.vhosts.values():
        for q in vhost.queues.values():
            owner_spid = getattr(q, "owner_spid", None)
            local = bool(getattr(q, "local", True))
            owner = owner_spid() if owner_spid is not None else server.spid
            moving = getattr(q, "moving", None)
            rows.append(
                {
                    "vhost": vhost.name,
                    "name": q.name,
                    "type": reported_type(q),
                    "shared": owner_spid is not None,
                    "owner": owner,
                    "owner_address": where(owner),
                    "role": "local" if owner_spid is None else ("master" if local else "proxy"),
                    "durable": q.durable,
                    "exclusive": q.exclusive,
                    "messages": q.message_count if local else None,
                    "consumers": q.consumer_count if local else len(q.consumers),
                    "replicas": replica_states(q),
                    "moving": moving,
                    "moving_address": where(moving),
                    # a cluster of hosts: the owner as worker-K@HOST:PORT (else null)
                    "owner_worker": None if cluster is None else worker_name(cluster, owner),
                    "group": list(group) if (group := getattr(q, "group", None)) else None,
                }
            )
    return sorted(rows, key=lambda r: (r["vhost"], r["name"]))


def _link_lane(cluster: ClusterController | None, conn_id: int, link: bool) -> str:
    """Which peer's link lane an inbound link connection carries, as membership has
    it (a link connection it does not know is refused what it sends)."""
    if cluster is None or not link:
        return ""
    spid = cluster.inbound.get(conn_id)
    if spid is None:
        return " link_of=unknown"
    return f" link_of={spid}/{cluster.lanes.get(conn_id, 'data')}"
