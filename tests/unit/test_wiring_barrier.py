"""A server that lacks a name may be behind the root: it catches up first (a barrier).

Two ``WiringReplication`` objects, root and follower, over an ordered in-memory
link. The root orders an exchange declare (its broadcast is on the way); the
follower, asked for that exchange by a client, sends a barrier; the root answers it
at once, without ordering anything, and the answer comes after the declare on the
same ordered link: when the follower resumes the client's method, it has the
declare. A root, or a server that follows no root, does not wait.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from pamqp import commands

from brokerd.cluster.wiring import entries as rep
from brokerd.cluster.wiring import statelog as sl
from brokerd.cluster.wiring.replication import STATE, WiringReplication


class Members:
    """What wiring replication asks of membership, two servers on one ordered link."""

    def __init__(self, spid: str, wire: deque[tuple[str, str, str, bytes]]) -> None:
        self.spid = spid
        self.wire = wire
        self.config = SimpleNamespace(vhost="/", open_timeout=10.0, heartbeat_timeout=3.0)
        self.is_root = spid == "root"
        self.standing = SimpleNamespace(term=SimpleNamespace(number=1))  # the root's term

    def root_now(self) -> bool:
        return self.is_root

    def root(self) -> str:
        return "root"

    def term_of(self, spid: str) -> int:
        return 1

    def clock(self) -> float:
        return 0.0

    def post(self, spid: str, kind: str, body: bytes, *_a: Any) -> bool:
        self.wire.append((self.spid, spid, kind, body))
        return True

    def _send_all(self, kind: str, body: bytes) -> None:
        self.post("follower" if self.spid == "root" else "root", kind, body)

    def evaluate(self) -> None:
        return None

    def synced(self, spid: str) -> None:
        return None


def pair() -> tuple[WiringReplication, WiringReplication, deque[tuple[str, str, str, bytes]]]:
    wire: deque[tuple[str, str, str, bytes]] = deque()
    root = WiringReplication(Members("root", wire), None, None)  # type: ignore[arg-type]
    follower = WiringReplication(Members("follower", wire), None, None)  # type: ignore[arg-type]
    root.became_root()
    follower.synced_root, follower.synced_term = "root", 1
    return root, follower, wire


def deliver(servers: dict[str, WiringReplication], wire: deque[Any]) -> None:
    while wire:
        src, dst, kind, body = wire.popleft()
        servers[dst].receive(src, kind, body)


def test_a_follower_resumes_after_everything_ordered_before_its_barrier() -> None:
    root, follower, wire = pair()
    method = commands.Exchange.Declare(exchange="x", exchange_type="fanout")
    method.raw_payload = None
    entry = rep.entry_for(method, "/", origin="root")
    assert root._order(entry, None)[0] is True  # type: ignore[index]
    assert [kind for *_x, kind, _b in wire] == [STATE]  # the declare, on its way
    conn = SimpleNamespace(vhost=SimpleNamespace(name="/"))
    resumed: list[int] = []
    assert follower.catch_up(conn, lambda: resumed.append(follower.last_seq))  # type: ignore[arg-type]
    deliver({"root": root, "follower": follower}, wire)
    assert resumed == [1]  # it had applied the declare (seq 1) when it resumed
    assert root.last_seq == 1 and [e.op for e in root.log] == [sl.EXCHANGE_DECLARE]  # not ordered


def test_a_root_or_a_server_following_none_does_not_wait() -> None:
    root, follower, _wire = pair()
    conn = SimpleNamespace(vhost=SimpleNamespace(name="/"))
    assert not root.catch_up(conn, lambda: None)  # type: ignore[arg-type]
    follower.synced_root = None
    assert not follower.catch_up(conn, lambda: None)  # type: ignore[arg-type]
    other = SimpleNamespace(vhost=SimpleNamespace(name="other"))
    follower.synced_root = "root"
    assert not follower.catch_up(other, lambda: None)  # type: ignore[arg-type]


def test_a_follower_takes_entries_of_the_term_it_synced_in_only() -> None:
    """Entries of another term are not its log's: a root acting again in a later term
    may have followed another root meanwhile (its log replaced); one of an earlier
    term is a root that lost its majority. A later term means syncing again."""
    root, follower, wire = pair()
    servers = {"root": root, "follower": follower}
    method = commands.Exchange.Declare(exchange="x", exchange_type="fanout")
    method.raw_payload = None
    root._order(rep.entry_for(method, "/", origin="root"), None)
    deliver(servers, wire)
    assert follower.last_seq == 1 and follower.synced_root == "root"
    assert follower.in_sync("root", 1) and not follower.in_sync("root", 2)
    for term, resync in ((0, False), (2, True)):
        root.members.standing.term.number = term  # type: ignore[attr-defined]
        method = commands.Exchange.Declare(exchange=f"y{term}", exchange_type="fanout")
        method.raw_payload = None
        root._order(rep.entry_for(method, "/", origin="root"), None)
        deliver(servers, wire)
        assert follower.last_seq == 1, term  # not applied
        assert (follower.synced_root is None) is resync, term
