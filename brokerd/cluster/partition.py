"""A server left in a minority sends its clients away (RabbitMQ's ``pause_minority``).

With no root the cluster is not ready: publishers are blocked and new clients
wait in connection.open (DESIGN.md). That is right when no majority exists
anywhere: the primaries this server cannot hear have ended (their ports refuse
connections), so nothing can confirm until they are back. It is wrong when
they are merely silent: a partition, or a cable. Then the ones it cannot hear
may be a majority that has elected a root and is serving, and a client held
here waits for its own blocked timeout before it tries them.

So a server that had a root, has lost it, hears fewer than a quorum of the
known primaries, and cannot hear enough *silent* ones to be a majority without
it (more than half the known primaries) is *partitioned*: after a short grace
it closes its client connections with 320 and refuses new ones at once, naming
the cause, as a detached server does (``Standing._settle_readiness``). Clients
given the other servers' addresses resume there within the heartbeat timeout
plus one election. It serves again as soon as it has a root.

A server that never had a root (starting, or a whole-cluster restart) keeps
DESIGN.md's waiting: its peers may simply not be up yet.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from brokerd.cluster.peers import server_key

if TYPE_CHECKING:
    from brokerd.cluster.link import Link
    from brokerd.cluster.peers import Peer


@dataclass
class Partition:
    """Whether this server is partitioned off in a minority, and since when."""

    #: why (the 320 text), while partitioned; None otherwise
    reason: str | None = None
    #: when the minority was first seen (the grace runs from here)
    since: float | None = None

    def check(
        self,
        *,
        had_root: bool,
        root: str | None,
        voters: int,
        known: int,
        ended: Callable[[], int],
        now: float,
        grace: float,
    ) -> str | None:
        """The reason this server is partitioned now (None: it is not). ``voters``:
        the active primaries it hears, itself included if it is one; ``known``: the
        known primaries; ``ended``: how many known primaries' processes have ended
        (asked only when the rest holds: it looks at every peer)."""
        silent = 0
        if root is None and had_root and 2 * voters <= known:
            silent = known - voters - ended()
        if 2 * silent <= known:
            self.since = None
            self.reason = None
            return None
        if self.since is None:
            self.since = now
        if now - self.since < grace:
            return self.reason
        self.reason = (
            f"partitioned: this server hears {voters} of {known} known primaries, and the "
            f"{silent} it cannot hear may be a majority serving without it: "
            "connect to another server"
        )
        return self.reason


def ended_hosts(
    names: Collection[str],
    peers: Iterable[Peer],
    active: Iterable[Peer],
    links: Mapping[str, Link],
) -> int:
    """How many of the known hosts ``names`` (this server's own left out) belong to
    servers whose process has ended: no ``active`` peer answers to the name, and
    its link's port refuses, or the latest run of the server that answered to it
    is gone (``Membership.check_gone``). A restarted server's earlier records stay
    gone, and its new one may never have answered to the name (a duplicate link is
    not tried again), so runs are told apart by their callback address, as the
    views do (``operations.servers``; spids sort by start time). A silent server
    (cut off, paused) has not ended."""

    peers = list(peers)
    heard: set[str] = set()
    for peer in active:
        heard |= peer.aliases
    latest: dict[str, Peer] = {}
    for peer in peers:
        key = server_key(peer)
        if key not in latest or latest[key].spid < peer.spid:
            latest[key] = peer
    ended = 0
    for name in names:
        if name in heard:
            continue
        link = links.get(name)
        runs = [latest[server_key(p)] for p in peers if name in p.aliases]
        if (link is not None and not link.up and link.refused) or (
            runs and all(run.gone for run in runs)
        ):
            ended += 1
    return ended
