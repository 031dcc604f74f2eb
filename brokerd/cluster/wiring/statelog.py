"""The cluster state log: ordered wiring changes, compaction and replay (seed 000).

Wiring changes (exchange and shared-queue declares/deletes, bindings,
meta-bindings for private queues, and where each shared queue lives: its
owner, issue 23) are ordered by the root with sequence numbers. Every
primary keeps the log; a joining server receives the compacted log and
replays it. These functions are pure: compaction must never change what a
replay builds, which tests/unit/test_statelog.py checks with hypothesis.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

EXCHANGE_DECLARE = "exchange.declare"
EXCHANGE_DELETE = "exchange.delete"
QUEUE_DECLARE = "queue.declare"
QUEUE_DELETE = "queue.delete"
QUEUE_BIND = "queue.bind"
QUEUE_UNBIND = "queue.unbind"
EXCHANGE_BIND = "exchange.bind"
EXCHANGE_UNBIND = "exchange.unbind"
META_BIND = "meta.bind"
META_UNBIND = "meta.unbind"
SERVER_GONE = "server.gone"
#: a server's replication stream is fenced (``spid``): the queues it owns fail over,
#: and it streams again under its next generation (every fence counts)
SERVER_FENCE = "server.fence"
#: a shared queue's owner changes (``spid``; "" while it is unavailable); a declare
#: carries its first owner in ``spid`` too
QUEUE_PLACE = "queue.place"
#: a bridge of the configuration document runs on a server (``spid``; "": on none),
#: ordered by the root as a queue's owner is (``ownership.bridges``); ``name`` is
#: the bridge's, ``vhost`` its vhost
BRIDGE_PLACE = "bridge.place"
#: a quorum queue's group changes (``props.group``: the members' addresses, the owner's
#: first); asked of the root with ``props.request`` "shrink" and ``props.address``
QUEUE_GROUP = "queue.group"
#: the cluster's members (``knownhosts.KnownHosts``, the whole set in ``props``), ordered
#: by the root one change at a time; the latest replaces every earlier one
MEMBERS = "cluster.members"
#: not in the log: a server asks the root to admit (``props.action`` "join") or
#: forget ("forget") a member; the root checks it and orders the ``MEMBERS`` it leads to
MEMBER_CHANGE = "cluster.member-change"
#: not a change: a server asks the root where the state stands, and has applied
#: everything ordered before it once the answer comes (on the same ordered link as
#: the state); never ordered, never in the log
BARRIER = "barrier"

OPS = (
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_BIND,
    QUEUE_UNBIND,
    EXCHANGE_BIND,
    EXCHANGE_UNBIND,
    META_BIND,
    META_UNBIND,
    SERVER_GONE,
    QUEUE_PLACE,
    SERVER_FENCE,
    BRIDGE_PLACE,
    MEMBERS,
    QUEUE_GROUP,
)


def freeze(value: Any) -> Any:
    """A hashable, order-independent form of an AMQP field table."""
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


@dataclass(frozen=True)
class Entry:
    """One ordered wiring change.

    ``name`` is the exchange or queue; for bindings ``source`` is the
    exchange and ``name`` the destination (queue or exchange); meta-bindings
    carry the ``spid`` of the server holding the private queue. ``props``
    holds declare flags and arguments as a frozen table.
    """

    seq: int
    op: str
    vhost: str = "/"
    name: str = ""
    source: str = ""
    routing_key: str = ""
    arguments: tuple[Any, ...] = ()
    props: tuple[Any, ...] = ()
    spid: str = ""
    #: the encoded AMQP method frame payload this entry came from (the binary bucket)
    frame: bytes = field(default=b"", compare=False)
    #: the server that asked for the change
    origin: str = field(default="", compare=False)

    def binding_key(self) -> tuple[Any, ...]:
        return (self.vhost, self.source, self.name, self.routing_key, self.arguments, self.spid)


Fact = tuple[Any, ...]


@dataclass
class Wiring:
    """What replaying a log builds: the cluster-wide exchanges, queues and bindings.

    Bindings are keyed ``(vhost, source exchange, destination, routing key,
    arguments, spid)``; ``spid`` is only set for meta-bindings.
    """

    exchanges: dict[tuple[str, str], tuple[Any, ...]] = field(default_factory=dict)
    queues: dict[tuple[str, str], tuple[Any, ...]] = field(default_factory=dict)
    queue_bindings: set[Fact] = field(default_factory=set)
    exchange_bindings: set[Fact] = field(default_factory=set)
    meta_bindings: set[Fact] = field(default_factory=set)
    #: shared queues with an owner of their own: (vhost, name) -> (owner, props)
    owners: dict[tuple[str, str], tuple[str, tuple[Any, ...]]] = field(default_factory=dict)
    #: fences ordered per server (its stream's generation is their number)
    fenced: dict[str, int] = field(default_factory=dict)
    #: where each bridge runs: (vhost, name) -> (spid, props)
    bridges: dict[tuple[str, str], tuple[str, tuple[Any, ...]]] = field(default_factory=dict)
    #: quorum groups changed since their declare: (vhost, name) -> props
    groups: dict[tuple[str, str], tuple[Any, ...]] = field(default_factory=dict)
    #: the latest members entry's props (empty: the cluster file's set still)
    members: tuple[Any, ...] = ()

    def apply(self, entry: Entry) -> tuple[list[Fact], list[Fact]]:
        """Apply one entry; returns the facts it added and removed.

        Entries that refer to missing objects change nothing (the root
        validates before ordering, so this only matters for replays of
        arbitrary logs in tests).
        """
        op, vhost, name = entry.op, entry.vhost, entry.name
        added: list[Fact] = []
        removed: list[Fact] = []
        if op == EXCHANGE_DECLARE:
            if (vhost, name) not in self.exchanges:
                self.exchanges[(vhost, name)] = entry.props
                added.append(("x", vhost, name))
        elif op == EXCHANGE_DELETE:
            if self.exchanges.pop((vhost, name), None) is not None:
                removed.append(("x", vhost, name))
                for kind, bindings, touches in (
                    ("qb", self.queue_bindings, lambda b: b[1] == name),
                    ("mb", self.meta_bindings, lambda b: b[1] == name),
                    ("xb", self.exchange_bindings, lambda b: name in (b[1], b[2])),
                ):
                    doomed = {b for b in bindings if b[0] == vhost and touches(b)}
                    bindings -= doomed
                    removed += [(kind, *b) for b in doomed]
        elif op == QUEUE_DECLARE:
            if (vhost, name) not in self.queues:
                self.queues[(vhost, name)] = entry.props
                added.append(("q", vhost, name))
                if entry.spid:
                    self.owners[(vhost, name)] = (entry.spid, ())
                    added.append(("o", vhost, name))
        elif op == QUEUE_PLACE:
            if (vhost, name) in self.queues:
                if (vhost, name) in self.owners:
                    removed.append(("o", vhost, name))
                self.owners[(vhost, name)] = (entry.spid, entry.props)
                added.append(("o", vhost, name))
        elif op == QUEUE_DELETE:
            if self.queues.pop((vhost, name), None) is not None:
                removed.append(("q", vhost, name))
                if self.owners.pop((vhost, name), None) is not None:
                    removed.append(("o", vhost, name))
                if self.groups.pop((vhost, name), None) is not None:
                    removed.append(("g", vhost, name))
                doomed = {b for b in self.queue_bindings if b[0] == vhost and b[2] == name}
                self.queue_bindings -= doomed
                removed += [("qb", *b) for b in doomed]
        elif op in (QUEUE_BIND, EXCHANGE_BIND, META_BIND):
            kind, bindings = self._bindings(op)
            exists = (
                (vhost, name) in self.queues
                if op == QUEUE_BIND
                else self.has_exchange(vhost, name) or op == META_BIND
            )
            key = entry.binding_key()
            if exists and self.has_exchange(vhost, entry.source) and key not in bindings:
                bindings.add(key)
                added.append((kind, *key))
        elif op in (QUEUE_UNBIND, EXCHANGE_UNBIND, META_UNBIND):
            kind, bindings = self._bindings(op)
            key = entry.binding_key()
            if key in bindings:
                bindings.discard(key)
                removed.append((kind, *key))
        elif op == SERVER_FENCE:
            generation = int(dict(entry.props).get("generation", 1))
            if generation > self.fenced.get(entry.spid, 0):
                self.fenced[entry.spid] = generation
                added.append(("f", entry.spid, generation))  # every fence is kept
        elif op == BRIDGE_PLACE:
            if (vhost, name) in self.bridges:
                removed.append(("b", vhost, name))
            self.bridges[(vhost, name)] = (entry.spid, entry.props)
            added.append(("b", vhost, name))
        elif op == QUEUE_GROUP:
            if (vhost, name) in self.queues:
                if (vhost, name) in self.groups:
                    removed.append(("g", vhost, name))
                self.groups[(vhost, name)] = entry.props
                added.append(("g", vhost, name))
        elif op == MEMBERS:
            if self.members:
                removed.append(("m",))
            self.members = entry.props
            added.append(("m",))
        elif op == SERVER_GONE:
            doomed = {b for b in self.meta_bindings if b[5] == entry.spid}
            self.meta_bindings -= doomed
            removed += [("mb", *b) for b in doomed]
        else:
            raise ValueError(f"unknown state log operation {op!r}")
        return added, removed

    def has_exchange(self, vhost: str, name: str) -> bool:
        """Declared in the log, or predeclared on every server (``amq.*``)."""
        return name.startswith("amq.") or (vhost, name) in self.exchanges

    def _bindings(self, op: str) -> tuple[str, set[Fact]]:
        if op.startswith("queue."):
            return "qb", self.queue_bindings
        if op.startswith("exchange."):
            return "xb", self.exchange_bindings
        return "mb", self.meta_bindings


def replay(entries: Iterable[Entry]) -> Wiring:
    wiring = Wiring()
    for entry in entries:
        wiring.apply(entry)
    return wiring


def compact(entries: Iterable[Entry]) -> list[Entry]:
    """The shortest log that replays to the same wiring.

    An entry survives while a fact it created is still there: a delete
    cancels the declare before it and every binding hanging off it, an
    unbind cancels its bind, and an entry that changed nothing is dropped.
    """
    wiring = Wiring()
    creator: dict[Fact, Entry] = {}
    for entry in entries:
        added, removed = wiring.apply(entry)
        for fact in removed:
            creator.pop(fact, None)
        for fact in added:
            creator[fact] = entry
    unique = {id(e): e for e in creator.values()}
    return sorted(unique.values(), key=lambda e: e.seq)
