"""A simulated cluster of real ``Membership`` objects on a fake clock and network.

    net = Net(3, seed=1)
    net.run(5)                      # heartbeats and messages, in time order
    net.pause(0); net.run(2); net.resume(0)
    net.kill(1)                     # its connections close, its port refuses
    net.cut(0, 2)                   # like ``brokerd ctl fault cut-link`` both ways

Messages take a random delay (``delay``) and keep their order per link, as on
TCP. A paused server reads nothing and beats no more; what is sent to it waits
and is read, in order, after ``resume`` (which may first let it evaluate from
its stale view, as a server does when a timer or a client runs before the
sockets are read). A killed server's last messages still arrive; then each
peer sees both connections close and the reconnection refused. ``check``
(default: at most one server acting as root) runs after every event, asking
every running server to evaluate, as a client could at any moment.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Any

from brokerd.cluster.config import parse_cluster_config
from brokerd.cluster.membership import Membership
from brokerd.cluster.messages import LINK_PROPERTY
from brokerd.cluster.probes import LaneProbe
from tests.support.fakes import Clock, Conn, User


class SimLink:
    """The outgoing side of a link from ``src`` to ``dst`` (indexes)."""

    def __init__(self, net: Net, src: int, dst: int) -> None:
        self.net, self.src, self.dst = net, src, dst
        self.address = f"h{dst}:1"
        self.peer_spid: str | None = f"s{dst}"
        self.state = "up"
        self.refused = False
        self.backlog = 0
        self.pending = False
        self.discovery = False
        self.server_properties = {"spid": f"s{dst}", "lane_probes": 1}
        self.probe = LaneProbe()
        #: why the link was dropped (``probes``: a stalled data lane), in order
        self.dropped: list[str] = []

    @property
    def up(self) -> bool:
        return self.state == "up"

    def post(self, kind: str, body: bytes, control: bool = False) -> bool:
        if not self.up:
            return False
        self.net.send(self.src, self.dst, kind, body)
        return True

    def drop(self, reason: str) -> None:
        """Dropped and at once connected again (the simulated network reconnects)."""
        self.dropped.append(reason)
        self.probe.restart()

    def retry_now(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class Member(Membership):
    """Membership recording what the planes would see."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.root_changes: list[tuple[float, str | None, str | None]] = []
        self.detaches: list[tuple[float, str]] = []

    def root_changed(self, old: str | None, new: str | None) -> None:
        self.root_changes.append((self.clock(), old, new))


def conn_id(src: int, dst: int) -> int:
    """The id at ``dst`` of the inbound connection of ``src``'s link."""
    return 100 * (src + 1) + dst


class Net:
    def __init__(
        self,
        size: int = 3,
        *,
        seed: int = 0,
        interval: float = 1.0,
        timeout: float = 3.0,
        delay: tuple[float, float] = (0.0005, 0.02),
    ) -> None:
        self.config = parse_cluster_config(
            {
                "secret": "cluster-secret",
                "known_hosts": [f"h{i}:1" for i in range(size)],
                "heartbeat": {"interval": interval, "timeout": timeout},
            }
        )
        self.clock = Clock(1000.0)
        self.rng = random.Random(seed)
        self.delay = delay
        self.events: list[tuple[float, int, str, tuple[Any, ...]]] = []
        self._seq = 0
        self.last_on_link: dict[tuple[int, int], float] = {}
        self.paused: set[int] = set()
        self.dead: set[int] = set()
        self.backlog: dict[int, list[tuple[str, tuple[Any, ...]]]] = {i: [] for i in range(size)}
        self.check: Callable[[Net], None] = Net.at_most_one_root
        self.nodes: list[Member] = []
        for i in range(size):
            # wall clocks that disagree by seconds: only one server's values are compared
            skew = self.rng.uniform(-5, 5)
            node = Member(
                self.config,
                spid=f"s{i}",
                server_type="primary",
                start_time=float(i + 1),
                address=f"h{i}:1",
                clock=self.clock,
                wall=lambda skew=skew: self.clock.now + 1e9 + skew,
                fault_injection=True,
            )
            node.on_detach = lambda reason, node=node: node.detaches.append((node.clock(), reason))
            node.listed = True
            node.own_addresses = {f"h{i}:1"}
            node.standing.started = self.clock.now - 10  # past the start-up window
            self.nodes.append(node)
        for i, node in enumerate(self.nodes):
            for j in range(size):
                if i != j:
                    link = SimLink(self, i, j)
                    node.links[link.address] = link  # type: ignore[assignment]
                    peer = node._peer(f"s{j}")
                    peer.link = link  # type: ignore[assignment]
                    peer.aliases.add(link.address)
        for i in range(size):
            for j in range(size):
                if i != j:
                    self.nodes[j].admit(self._link_conn(i, j))
        for i in range(size):
            self._at(self.clock.now + self.rng.random() * interval, "beat", (i,))

    def _link_conn(self, src: int, dst: int) -> Conn:
        props = {
            "spid": f"s{src}",
            "type": "primary",
            "callback": "",
            "start_time": float(src + 1),
            "checksum": self.config.checksum,
        }
        return Conn(conn_id(src, dst), User("cluster"), client_properties={LINK_PROPERTY: props})

    # -- events --------------------------------------------------------------------

    def _at(self, when: float, kind: str, args: tuple[Any, ...]) -> None:
        self._seq += 1
        heapq.heappush(self.events, (when, self._seq, kind, args))

    def send(self, src: int, dst: int, kind: str, body: bytes) -> None:
        when = max(
            self.clock.now + self.rng.uniform(*self.delay),
            self.last_on_link.get((src, dst), 0.0),
        )
        self.last_on_link[(src, dst)] = when
        self._at(when, "message", (dst, src, kind, body))

    def run(self, seconds: float) -> None:
        """Process every event due within ``seconds``, in time order."""
        end = self.clock.now + seconds
        while self.events and self.events[0][0] <= end:
            when, _, kind, args = heapq.heappop(self.events)
            self.clock.now = max(self.clock.now, when)
            self._handle(kind, args)
            self.check(self)
        self.clock.now = end

    def _handle(self, kind: str, args: tuple[Any, ...]) -> None:
        index = args[0]
        if index in self.dead:
            return
        if index in self.paused:
            if kind != "beat":  # its timer fires once it runs again (see resume)
                self.backlog[index].append((kind, args))
            return
        node = self.nodes[index]
        if kind == "beat":
            self._at(self.clock.now + node.beat(), "beat", (index,))
        elif kind == "message":
            _, src, message_kind, body = args
            node.receive(conn_id(src, index), message_kind, body)
        elif kind == "close":
            _, src = args
            peer = node.peers[f"s{src}"]
            link = peer.link
            assert link is not None
            link.state = "retrying"
            link.refused = True
            node._link_down(link, "unreachable: ConnectionRefusedError")  # type: ignore[arg-type]
            node.closed(self._link_conn(src, index))  # type: ignore[arg-type]

    # -- faults --------------------------------------------------------------------

    def pause(self, index: int) -> None:
        if index not in self.dead:
            self.paused.add(index)

    def resume(self, index: int, *, stale_first: bool = True) -> None:
        """Run again: optionally evaluate from the stale view first (a timer or a
        client before the sockets), then read what waited, then beat if overdue."""
        self.paused.discard(index)
        node = self.nodes[index]
        if stale_first:
            node.evaluate()
            self.check(self)
        waiting, self.backlog[index] = self.backlog[index], []
        for kind, args in waiting:
            self._handle(kind, args)
            self.check(self)
        if not any(k == "beat" and a[0] == index for _, _, k, a in self.events):
            self._at(self.clock.now, "beat", (index,))  # overdue: its timer fires now

    def kill(self, index: int) -> None:
        """kill -9: what it sent still arrives, then its connections close and its
        port refuses (at every peer, after that peer has read the rest)."""
        self.dead.add(index)
        self.paused.discard(index)
        self.backlog[index] = []
        for j in range(len(self.nodes)):
            if j != index:
                last = self.last_on_link.get((index, j), self.clock.now)
                self._at(max(last, self.clock.now) + 0.0001, "close", (j, index))

    def cut(self, a: int, b: int) -> None:
        self.nodes[a].cut.add(f"s{b}")
        self.nodes[b].cut.add(f"s{a}")

    def heal(self) -> None:
        for node in self.nodes:
            node.cut.clear()

    # -- views ---------------------------------------------------------------------

    def running(self) -> list[int]:
        return [i for i in range(len(self.nodes)) if i not in self.dead | self.paused]

    def acting(self) -> list[int]:
        """Servers that would act as root if asked now (they evaluate first, as
        ``root_now`` does)."""
        return [i for i in self.running() if self.nodes[i].evaluate().is_root]

    @staticmethod
    def at_most_one_root(net: Net) -> None:
        acting = net.acting()
        assert len(acting) <= 1, f"two roots at {net.clock.now:.3f}: {acting}"

    def root(self) -> int | None:
        """The index of the only acting root, if exactly one."""
        acting = self.acting()
        return acting[0] if len(acting) == 1 else None

    def run_until(self, predicate: Callable[[], Any], limit: float, step: float = 0.001) -> float:
        """Run in small steps until ``predicate()``; returns the time it took."""
        start = self.clock.now
        while not predicate():
            assert self.clock.now - start < limit, f"not within {limit}s"
            self.run(step)
        return self.clock.now - start
