"""An in-memory cluster for unit tests of the message plane: real brokers, real
planes and queues, a fake membership and a network the test pumps by hand."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from brokerd.cluster.plane.transport import DATA
from brokerd.cluster.queues.service import QueueService
from brokerd.cluster.queues.shared import SharedQueue
from brokerd.config import default_config
from brokerd.model.broker import Broker
from brokerd.model.message import Message
from brokerd.model.queue import Queue

_CONFIG = default_config()
_USERS = _CONFIG.user_database()  # hashing guest's password once, not per server


@dataclass
class Config:
    vhost: str = "/"
    open_timeout: float = 10.0
    heartbeat_timeout: float = 3.0
    heartbeat_interval: float = 1.0
    #: these tests make shared queues directly and place them by hand (``Net.place``,
    #: as the root's state log would): replicated ones whatever their durability
    default_queue_type: str | None = "replicated"


class Link:
    """The outgoing side of a link: posts wait in the network until pumped."""

    def __init__(self, net: Net, src: str, dst: str) -> None:
        self.net, self.src, self.dst = net, src, dst
        self.backlog = 0

    @property
    def up(self) -> bool:
        return (self.src, self.dst) not in self.net.cut

    def post(self, kind: str, body: bytes, urgent: bool = False) -> bool:
        if not self.up:
            return False
        self.net.wire.append((self.src, self.dst, kind, body))
        return True


class Members:
    """What the plane asks of membership."""

    def __init__(self, net: Net, spid: str) -> None:
        self.net = net
        self.spid = spid
        self.config = Config()
        self.now = 100.0
        self.not_ready_reason = ""
        self.alarms: dict[str, str] = {}
        #: elected and holding the lease (a suspended root does not act)
        self.acting = True
        #: stepping down to stop, and root enabled (a planned hand-over is neither)
        self.stopping = False
        self.root_enabled = True

    @property
    def address(self) -> str:
        """Its known-hosts address: its spid, in this net."""
        return self.spid

    def clock(self) -> float:
        return self.now

    def state_term(self) -> int:
        """The term of the state log followed (one log here: the net's placements)."""
        return 1

    @property
    def current_root(self) -> str | None:
        return self.net.root

    def link_to(self, spid: str | None) -> Link | None:
        if spid is None or spid == self.spid or spid not in self.net.servers:
            return None
        link = Link(self.net, self.spid, spid)
        link.backlog = self.net.backlog.get((self.spid, spid), 0)
        return link if link.up else None

    def in_sync(self, root: str) -> bool:
        return True

    def known_primaries(self, now: float) -> int:
        """Every server of the net is a listed primary."""
        return len(self.net.servers)

    def is_active(self, spid: str) -> bool:
        return spid in self.net.servers

    def address_of(self, spid: str) -> str:
        """A server's address is its spid here (a group names spids)."""
        return spid

    def replica_peers(self) -> list[str]:
        """Every other server with a link up (the net's servers are all primaries)."""
        return [s for s in self.net.servers if s != self.spid and self.link_to(s) is not None]

    def raise_alarm(self, kind: str, message: str) -> None:
        self.alarms[kind] = message

    def clear_alarm(self, kind: str) -> None:
        self.alarms.pop(kind, None)


@dataclass
class Server:
    spid: str
    broker: Broker
    members: Members
    queues: QueueService


@dataclass
class Net:
    """Servers by spid, the root, messages in flight and cut links."""

    servers: dict[str, Server] = field(default_factory=dict)
    root: str | None = None
    wire: deque[tuple[str, str, str, bytes]] = field(default_factory=deque)
    cut: set[tuple[str, str]] = field(default_factory=set)
    #: bytes a link's data lane holds queued, as a test sets them (0 otherwise)
    backlog: dict[tuple[str, str], int] = field(default_factory=dict)
    #: the state log's last entry number (placements and fences)
    log_seq: int = 0

    def add(self, spid: str) -> Server:
        config = _CONFIG
        broker = Broker(_USERS, config.vhosts, config.limits)
        members = Members(self, spid)
        queues = QueueService(members, broker, "/")  # type: ignore[arg-type]
        vhost = broker.vhosts["/"]

        def make(name: str, vhost_name: str, **kwargs: Any) -> Queue:
            if kwargs.get("exclusive_owner") is not None:
                return Queue(name, vhost_name, **kwargs)
            return queues.make_queue(name, vhost_name, **kwargs)

        vhost.queue_factory = make
        server = self.servers[spid] = Server(spid, broker, members, queues)
        return server

    def join(self, spid: str, queue: str = "q") -> Server:
        """A new primary: it holds the queue's wiring and placement, follows the root,
        and the others' links to it come up (it joins their replica sets and is sent
        their snapshots)."""
        server = self.add(spid)
        server.broker.vhosts["/"].declare_queue(queue, connection_id=0)
        server.queues.root_changed(None, self.root)
        placed = self.queue(self.root, queue)  # type: ignore[arg-type]
        self.queue(spid, queue).place(placed.owner, placed.epoch, None, placed.placed_seq)
        for other in self.servers:
            if other != spid:
                self.servers[other].queues.link_ready(spid)
        return server

    def declare(
        self, name: str, owner: str | None = None, group: tuple[str, ...] | None = None
    ) -> None:
        """Wiring is global: the queue exists on every server (as wiring replication
        does), placed on ``owner`` (default: the root) as the root's declare places it;
        ``group``: the servers keeping its copies (a quorum group; None: all)."""
        for server in self.servers.values():
            server.broker.vhosts["/"].declare_queue(name, connection_id=0)
            self.queue(server.spid, name).group = group
        self.place(name, owner or self.root)  # type: ignore[arg-type]
        self.pump()  # the owner's reset of the replicas' copies

    def place(self, name: str, owner: str) -> None:
        """A ``queue.place`` entry applied by every server, in turn."""
        epoch = max(self.queue(s, name).epoch for s in self.servers) + 1
        self.log_seq += 1
        for spid in self.servers:
            self.queue(spid, name).place(owner, epoch, None, self.log_seq)

    def fail_over(self, dead: str) -> None:
        """What the root orders for the replicated queues ``dead`` owned: the fence,
        applied everywhere, then each queue on the survivor with the furthest copy
        (synced first, then the earliest spid), as ``placing.Placer`` chooses: of the
        queue's group, if it has one."""
        servers = self.servers.values()
        under_way = [s for s in servers if s.spid != dead and s.queues.is_fenced(dead)]
        if under_way:  # the root orders no second fence while one is under way
            replica = under_way[0].queues.copies
            generation, seq = replica.fences_of(dead), replica.fence_seq[dead]
        else:
            generation = 1 + max(s.queues.copies.fences_of(dead) for s in servers)
            self.log_seq += 1
            seq = self.log_seq
        for server in servers:
            server.queues.fence(dead, generation, seq)  # applied once per server
        owners = {dead}
        reports = {
            spid: s.queues.copies.fenced_report(owners).get(dead, {})
            for spid, s in self.servers.items()
        }
        names = {
            name
            for s in self.servers.values()
            for name, q in s.broker.vhosts["/"].queues.items()
            if getattr(q, "owner", None) == dead
        }
        for name in sorted(names):
            group = self.queue(next(iter(self.servers)), name).group
            ranked = sorted(
                (spid for spid in self.servers if group is None or spid in group),
                key=lambda spid: (
                    tuple(reports[spid].get(name, (False, -1))),
                    [-ord(c) for c in spid],
                ),
            )
            self.place(name, ranked[-1])

    def queue(self, spid: str, name: str) -> SharedQueue:
        return self.servers[spid].broker.vhosts["/"].queues[name]  # type: ignore[return-value]

    def elect(self, root: str) -> None:
        old, self.root = self.root, root
        for server in self.servers.values():
            server.queues.root_changed(old, root)
        self.seen()
        self.pump()

    def seen(self) -> None:
        """Every server hears every other's status (each takes the others as replicas
        of its stream, as the heartbeat's ``primary_seen`` does)."""
        for spid, server in self.servers.items():
            for other in self.servers:
                if other != spid:
                    server.queues.primary_seen(other)

    def flush(self) -> None:
        for server in self.servers.values():
            server.queues.flush()

    def pump(self, limit: int = 10_000) -> int:
        """Flush every plane and deliver what is in flight until the network is quiet."""
        moved = 0
        for _ in range(limit):
            self.flush()
            if not self.wire:
                return moved
            src, dst, kind, body = self.wire.popleft()
            if (src, dst) in self.cut or dst not in self.servers:
                continue
            if kind == DATA:
                self.servers[dst].queues.receive(src, body)
            moved += 1
        raise AssertionError("the network did not go quiet")

    def step(self, count: int) -> None:
        """Deliver at most ``count`` messages in flight (a partial pump)."""
        self.flush()
        for _ in range(count):
            if not self.wire:
                return
            src, dst, kind, body = self.wire.popleft()
            if (src, dst) not in self.cut and dst in self.servers and kind == DATA:
                self.servers[dst].queues.receive(src, body)

    def kill(self, spid: str) -> None:
        """kill -9: the server and what is in flight from it vanish; the others see it
        go inactive and, if it was root, elect the first one left."""
        del self.servers[spid]
        self.wire = deque(m for m in self.wire if m[0] != spid)
        for server in self.servers.values():
            server.queues.peer_lost(spid, "inactive")
        if self.root == spid:
            self.elect(min(self.servers))
        self.fail_over(spid)
        self.pump()

    def drop_link(self, a: str, b: str) -> None:
        """Both links between a and b drop: what was on them is lost, sessions end."""
        self.wire = deque(m for m in self.wire if {m[0], m[1]} != {a, b})
        for x, y in ((a, b), (b, a)):
            self.servers[x].queues.peer_lost(y, "link down")

    def lose(self, a: str, b: str) -> None:
        """What is in flight between a and b vanishes and only a sees the session end
        (a link cut one way, b seen inactive by a alone); b goes on as if nothing
        happened, and the links stay up."""
        self.wire = deque(m for m in self.wire if {m[0], m[1]} != {a, b})
        self.servers[a].queues.peer_lost(b, "link cut")
        self.servers[a].queues.link_ready(b)

    def tick(self, seconds: float = 1.0) -> None:
        """Time passes; every plane's heartbeat tick runs, then the network settles."""
        for server in self.servers.values():
            server.members.now += seconds
            server.queues.tick()
        self.pump()


class Sink:
    """A consumer (ConsumerSink) that records deliveries; ready while under its prefetch."""

    def __init__(self, tag: str, prefetch: int = 0, no_ack: bool = False, conn: int = 1) -> None:
        self.tag = tag
        self.exclusive = False
        self.no_local = False
        self.no_ack = no_ack
        self.connection_id = conn
        self.prefetch = prefetch
        self.window = prefetch
        self.got: list[tuple[Message, bool]] = []
        self.unacked: list[Message] = []
        self.cancels = 0

    def ready(self) -> bool:
        return not self.prefetch or len(self.unacked) < self.prefetch

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        self.got.append((message, redelivered))
        if not self.no_ack:
            self.unacked.append(message)

    def cancelled(self, queue: Queue) -> None:
        self.cancels += 1

    def bodies(self) -> list[bytes]:
        return [m.body for m, _ in self.got]


class Waiter:
    """A PublishWaiter that records the answers a publish gets."""

    def __init__(self) -> None:
        self.answers: list[tuple[bool, int]] = []
        self.deferred = 0

    def defer(self) -> Any:
        self.deferred += 1
        return lambda ok, routed: self.answers.append((ok, routed))

    def confirmed(self) -> bool:
        """What a channel would answer: ack once every deferral answered ok (at once
        if none was deferred)."""
        return len(self.answers) == self.deferred and all(ok for ok, _ in self.answers)


def message(body: bytes, publisher: int = 1) -> Message:
    return Message("", "q", b"", body, publisher, 1)
