"""``MemberChanges`` (brokerd/cluster/members.py) over a fake host: what the root
admits and refuses, which sets a server takes, and a joiner's asking."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from brokerd.cluster import knownhosts
from brokerd.cluster.config import ClusterConfig
from brokerd.cluster.knownhosts import KnownHosts
from brokerd.cluster.members import JOIN_RETRY, MemberChanges
from brokerd.cluster.messages import Status
from brokerd.cluster.peers import Peer
from brokerd.cluster.wiring import entries as rep
from brokerd.model.errors import AMQPError

A, B, C, D = "a:1", "b:1", "c:1", "d:1"


@dataclass
class Host:
    """The few members of a ClusterController that MemberChanges reads and calls."""

    spid: str = "self"
    address: str = A
    type: str = "primary"
    known: set[str] = field(default_factory=lambda: {A, B, C})
    own_addresses: set[str] = field(default_factory=lambda: {A})
    peers: dict[str, Peer] = field(default_factory=dict)
    now: float = 100.0
    root_spid: str | None = "root"
    synced: bool = True
    hostgroup: Any = None
    node: str = ""
    join: str | None = None
    members_version: int = 0
    members_record: dict[str, Any] = field(default_factory=dict)
    checksum: str = ""
    alarms: dict[str, str] = field(default_factory=dict)
    requests: list[Any] = field(default_factory=list)
    statuses_sent: int = 0

    def __post_init__(self) -> None:
        self.config = ClusterConfig("c", "/", "secret-secret", "cluster", ())
        self.standing = SimpleNamespace(
            active=lambda peer, now: now - peer.last_seen < 3.0, term=SimpleNamespace(number=7)
        )
        self.wiring = SimpleNamespace(
            request=lambda entry, done: self.requests.append((entry, done))
        )

    def clock(self) -> float:
        return self.now

    def set_known(self, known: set[str], checksum: str) -> tuple[set[str], set[str]]:
        self.known, self.checksum = known, checksum
        return set(), set()

    def evaluate(self) -> None:
        return None

    def tell(self, now: float, *, ask: bool) -> None:
        self.statuses_sent += 1

    def root(self) -> str | None:
        return self.root_spid

    def in_sync(self, root: str) -> bool:
        return self.synced

    def spawn(self, coro: Any) -> None:
        coro.close()

    def raise_alarm(self, kind: str, message: str) -> None:
        self.alarms[kind] = message

    def clear_alarm(self, kind: str) -> None:
        self.alarms.pop(kind, None)


def heard(host: Host, spid: str, address: str, known: KnownHosts | None = None, **kw: Any) -> Peer:
    """A peer at ``address`` whose latest status (just now) carries ``known``."""
    peer = Peer(spid, address=address, aliases={address}, last_seen=host.now, node=f"n-{spid}")
    record = known.to_dict() if known is not None and known.version else {}
    peer.status = Status(spid, "primary", 1.0, "", True, None, False, True, address, members=record)
    peer.link = SimpleNamespace(up=kw.get("link_up", True), address=address)
    host.peers[spid] = peer
    return peer


def change(changes: MemberChanges, action: str, address: str) -> AMQPError | Any:
    return changes.change(rep.member_change("/", action, address, "", "origin"))


def test_the_root_admits_a_joiner_it_hears_and_reaches(tmp_path: Path) -> None:
    host = Host()
    changes = MemberChanges(host, tmp_path)  # type: ignore[arg-type]
    heard(host, "b", B)
    assert isinstance(change(changes, "join", D), AMQPError), "nobody heard at d"
    heard(host, "d", D, link_up=False)
    refused = change(changes, "join", D)
    assert isinstance(refused, AMQPError) and "cannot reach" in refused.text
    heard(host, "d", D)
    entry = change(changes, "join", D)
    new = rep.known_hosts_of(entry)
    assert new.key == (1, 7) and new.hosts == (A, B, C, D) and new.node_of(D) == "n-d"


def test_one_change_at_a_time_until_a_majority_holds_the_last(tmp_path: Path) -> None:
    host = Host()
    changes = MemberChanges(host, tmp_path)  # type: ignore[arg-type]
    heard(host, "b", B)
    heard(host, "d", D)
    changes.applied(change(changes, "join", D))  # the root took it: version 1 of 4
    heard(host, "e", "e:1")
    refused = change(changes, "join", "e:1")
    assert isinstance(refused, AMQPError) and "1 of 4 members only" in refused.text
    current = changes.current
    heard(host, "b", B, current)  # b's status says it holds version 1: 2 of 4
    assert isinstance(change(changes, "join", "e:1"), AMQPError)
    heard(host, "d", D, current)  # 3 of 4: a majority
    assert rep.known_hosts_of(change(changes, "join", "e:1")).version == 2


def test_a_forget_is_refused_for_a_running_server_and_the_root(tmp_path: Path) -> None:
    host = Host()
    changes = MemberChanges(host, tmp_path)  # type: ignore[arg-type]
    heard(host, "b", B)
    peer_c = heard(host, "c", C)
    refused = change(changes, "forget", C)
    assert isinstance(refused, AMQPError) and "running" in refused.text
    refused = change(changes, "forget", A)
    assert isinstance(refused, AMQPError) and "is the root" in refused.text
    peer_c.last_seen = host.now - 10  # stopped
    new = rep.known_hosts_of(change(changes, "forget", C))
    assert new.hosts == (A, B) and new.forgotten == ((C, "n-c"),)
    changes.applied(rep.members_entry("/", new))
    assert changes.forgotten(C, "n-c", member=False) is not None
    assert "remove its data directory" in (changes.forgotten("x:9", "n-c", member=False) or "")
    assert changes.forgotten(C, "n-new", member=False) is None, "a new disk is a new server"


def test_a_server_takes_only_a_later_set_and_keeps_it(tmp_path: Path) -> None:
    host = Host()
    changes = MemberChanges(host, tmp_path)  # type: ignore[arg-type]
    later = KnownHosts.initial([A, B, C]).admitted(D, "n-d", 3)
    changes.from_status(heard(host, "b", B), later.to_dict())
    assert changes.current == later and host.known == {A, B, C, D}
    assert host.members_version == 1 and host.statuses_sent == 1
    older_term = KnownHosts.initial([A, B, C]).admitted("e:1", "n-e", 2)  # (1, 2) < (1, 3)
    changes.from_status(heard(host, "c", C), older_term.to_dict())
    assert changes.current == later
    changes.from_status(heard(host, "c", C), {"version": "x"})  # malformed: ignored
    assert knownhosts.load(tmp_path).known == later, "kept on disk"
    again = MemberChanges(Host(), tmp_path)  # type: ignore[arg-type]
    assert again.current == later and again.host.known == {A, B, C, D}


def test_a_joiner_asks_once_in_sync_and_again_after_a_refusal(tmp_path: Path) -> None:
    host = Host(address=D, own_addresses=set())
    changes = MemberChanges(host, tmp_path, join=A)  # type: ignore[arg-type]
    assert changes.joining
    host.synced = False
    changes.tick()
    assert host.requests == [], "not before it holds the root's state"
    host.synced = True
    changes.tick()
    changes.tick()
    assert len(host.requests) == 1, "one question at a time"
    entry, done = host.requests[0]
    assert dict(entry.props) == {"action": "join", "host": D, "node": host.node}
    done(SimpleNamespace(text="the root cannot reach d:1"), None)
    assert "cannot reach" in host.alarms["join"]
    changes.tick()
    assert len(host.requests) == 1, "it waits before asking again"
    host.now += JOIN_RETRY * host.config.heartbeat_interval
    changes.tick()
    assert len(host.requests) == 2
    host.requests[1][1](None, None)
    assert "join" not in host.alarms
    changes.from_status(
        heard(host, "a", A), KnownHosts.initial([A, B, C]).admitted(D, "", 1).to_dict()
    )
    assert not changes.joining


def test_a_server_of_a_host_of_workers_never_asks_to_join(tmp_path: Path) -> None:
    host = Host(address="unix:/w1", own_addresses=set(), hostgroup=object())
    changes = MemberChanges(host, tmp_path, join=A)  # type: ignore[arg-type]
    changes.tick()
    assert not changes.joining and host.requests == []


@pytest.mark.parametrize("damaged", ['{"node": 1}', "[]", '{"node": "n", "known": {"hosts": []}}'])
def test_a_damaged_members_file_stops_the_start(tmp_path: Path, damaged: str) -> None:
    (tmp_path / knownhosts.MEMBERS_FILE).write_text(damaged)
    with pytest.raises(knownhosts.MembershipError):
        MemberChanges(Host(), tmp_path)  # type: ignore[arg-type]
