"""Queue, exchange and binding entries for the console, and full-or-delta snapshots.

Pure: entries are built from the model and compared with what the previous
status carried, so a broker with a thousand idle queues sends a few bytes per
heartbeat instead of a thousand entries (docs/protocol.md, "Broker to console").
"""

from __future__ import annotations

import base64
import datetime
import decimal
from collections.abc import Iterable, Mapping
from typing import Any

from brokerd.model.broker import Broker
from brokerd.model.exchange import Exchange
from brokerd.model.interfaces import QueueType
from brokerd.model.queue import Queue
from brokerd.model.queuetypes import reported_type

SECTIONS = ("queues", "exchanges", "bindings")
#: a full snapshot every this many statuses, so a console that missed a delta heals
FULL_EVERY = 30

Key = tuple[Any, ...]
Entry = dict[str, Any]
Snapshot = dict[str, dict[Key, Entry]]


def jsonable(value: Any) -> Any:
    """AMQP field values (bytes, decimals, timestamps, nested tables) as JSON values."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(raw).decode()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    return str(value)


def consumer_servers(queue: Queue, spid: str) -> dict[str, int]:
    """Where a master queue's consumers are connected: {spid: count}, this server's own
    under ``spid``. A consumer from another server is a ``RemoteConsumer`` (duck typed:
    ``remote`` and ``out.spid``, so the link need not import the cluster)."""
    spread: dict[str, int] = {}
    for consumer in queue.consumers:
        server = consumer.out.spid if getattr(consumer, "remote", False) else spid
        spread[server] = spread.get(server, 0) + 1
    return spread


def queue_entry(queue: Queue, shared: bool, spid: str = "") -> Entry:
    """A queue as the console sees it. ``master``: this server holds its messages (every
    local queue; a shared queue only on its owner, a proxy elsewhere: its ``messages``
    are not here and its ``consumers`` are this server's own). A shared master also says
    where its consumers are (``consumer_servers``) and which servers hold a copy, each
    in sync or not (``replicas``: [] for a classic queue); other entries leave them
    out, so a thousand private queues cost no more than before. ``replica_states`` is
    duck typed (``SharedQueue``) so the link need not import the cluster."""
    master = bool(getattr(queue, "local", True))
    entry: Entry = {
        "vhost": queue.vhost,
        "name": queue.name,
        "durable": queue.durable,
        "exclusive": queue.exclusive,
        "auto_delete": queue.auto_delete,
        "shared": shared,
        "master": master,
        "messages": queue.message_count,
        "unacked": queue.unacked,
        "consumers": len(queue.consumers),
        "enqueued": queue.stats_in,
        "delivered": queue.stats_out,
        "arguments": jsonable(queue.arguments),
        # classic, quorum or replicated: how the cluster keeps a shared one; any other,
        # the type its declare named
        "type": reported_type(queue),
    }
    if shared and master:
        entry["consumer_servers"] = consumer_servers(queue, spid)
        replica_states = getattr(queue, "replica_states", None)
        replicas = replica_states() if replica_states is not None else None
        if replicas is not None:
            # an in-sync replica's lag is the root's whole stream's, not this queue's: it
            # moves with any traffic, and would put every replicated queue in every delta
            entry["replicas"] = [r if not r["in_sync"] else {**r, "behind": 0} for r in replicas]
    return entry


def binding_kind(destination: Any) -> str | None:
    """``queue`` or ``exchange``; None for a stand-in of another server's private queue
    (a meta-binding: that server reports the real binding)."""
    if isinstance(destination, QueueType):  # any queue type (a stand-in only pushes)
        return "queue"
    if isinstance(destination, Exchange):
        return "exchange"
    return None


def collect(broker: Broker, cluster_vhost: str | None = None, spid: str = "") -> Snapshot:
    """Every queue, exchange and binding of the broker, keyed as the protocol keys them.

    ``cluster_vhost`` is the clustered vhost (None when standalone): its
    non-exclusive queues are the shared, cluster-wide ones, and its exchanges and
    the bindings of shared queues and exchanges are wiring every server holds
    (``shared``). ``spid`` is this server's, for ``consumer_servers``.
    """
    snapshot: Snapshot = {section: {} for section in SECTIONS}
    queues, exchanges, bindings = (snapshot[s] for s in SECTIONS)
    for vname, vhost in broker.vhosts.items():
        clustered = vname == cluster_vhost
        for queue in vhost.queues.values():
            queues[(vname, queue.name)] = queue_entry(
                queue, clustered and not queue.exclusive, spid
            )
        for exchange in vhost.exchanges.values():
            exchanges[(vname, exchange.name)] = {
                "vhost": vname,
                "name": exchange.name,
                "type": exchange.type_name,
                "durable": exchange.durable,
                "auto_delete": exchange.auto_delete,
                "internal": exchange.internal,
                "shared": clustered,
                "arguments": jsonable(exchange.arguments),
            }
            for binding in exchange.bindings.values():
                destination = binding.destination
                kind = binding_kind(destination)
                if kind is None:
                    continue
                key = (vname, exchange.name, destination.name, kind, binding.routing_key)
                bindings[key] = {
                    "vhost": vname,
                    "source": exchange.name,
                    "destination": destination.name,
                    "destination_type": kind,
                    "routing_key": binding.routing_key,
                    "shared": clustered and not (kind == "queue" and destination.exclusive),
                    "arguments": jsonable(binding.arguments),
                }
    return snapshot


def delta(previous: Mapping[Key, Entry], current: Mapping[Key, Entry]) -> dict[str, list[Any]]:
    """What changed between two sections: entries to upsert and keys to remove."""
    upsert = [entry for key, entry in current.items() if previous.get(key) != entry]
    remove = [list(key) for key in previous if key not in current]
    return {"upsert": upsert, "remove": remove}


class SnapshotTracker:
    """Remembers what the console was last sent on one connection.

    A new tracker per websocket connection: the first status is always full.
    """

    def __init__(self, full_every: int = FULL_EVERY) -> None:
        self.full_every = full_every
        self._sent: Snapshot | None = None
        self._since_full = 0
        self._want_full = True

    def request_full(self) -> None:
        """The console asked for a ``resync``: the next status is full."""
        self._want_full = True

    def next(self, snapshot: Snapshot) -> tuple[bool, dict[str, Any]]:
        """The sections of the next status: (full, {section: list or delta})."""
        full = self._want_full or self._sent is None or self._since_full >= self.full_every
        if full:
            body: dict[str, Any] = {s: list(snapshot[s].values()) for s in SECTIONS}
            self._since_full = 1
            self._want_full = False
        else:
            assert self._sent is not None
            body = {s: delta(self._sent[s], snapshot[s]) for s in SECTIONS}
            self._since_full += 1
        self._sent = snapshot
        return full, body


def keys(entries: Iterable[Entry], section: str) -> list[Key]:
    """The protocol key of each entry of a section (for consoles and tests)."""
    if section == "bindings":
        fields: tuple[str, ...] = (
            "vhost",
            "source",
            "destination",
            "destination_type",
            "routing_key",
        )
    else:
        fields = ("vhost", "name")
    return [tuple(entry[f] for f in fields) for entry in entries]
