"""A worker's host in a cluster of hosts (``brokerd --workers N --cluster FILE``).

The cluster file's known hosts name hosts (their client port, which the kernel
hands to any of their workers), but queues are owned by workers, so every
worker links to every worker: to its siblings over their Unix sockets, to the
other hosts' workers over each worker's own TCP link port, which the parent
chose once and keeps (``DATA_DIR/host/links.json``: a quorum group names its
members by those addresses, so they must outlive a restart).

A worker learns the other hosts' workers from the cluster: its link to a known
host lands on one of that host's workers, whose server properties carry its
host's id and every link address of that host (``host``, ``host_links``); it
links to each, and they link back. That first link only discovers (what it
reaches is chance: ``Membership._discovered`` retires it); a known host that
reaches a sibling, or itself, is this host's own name.

Hosts, not workers, are the failure domain. Every host of a cluster runs the
same number of workers: the count is in the checksum, so a host started with
another is refused (``config-mismatch``) like a different known-hosts list.
With W workers on each of H hosts a majority of the H·W workers is exactly a
majority of the hosts with each worker weighing 1/W, so the root's quorum
and the replication majorities, which count workers (H·W known primaries),
count hosts: one host cannot outvote the rest whatever its cores
(``tests/unit/test_host_quorum.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brokerd.cluster.peers import Peer


def worker_socket(host_dir: Path, index: int) -> Path:
    """Worker K's link socket in its host's directory (``DATA_DIR/host``)."""
    return host_dir / f"worker-{index}.sock"


@dataclass
class HostGroup:
    """This worker's host: its id, its siblings' sockets, its workers' link addresses."""

    #: made by the parent at each start; statuses and link properties carry it
    host_id: str
    #: the host's client address (what Connection.OpenOk and known hosts name)
    host_address: str
    #: this worker's index on its host
    index: int
    #: the Unix link socket of each worker of the host, by index (``unix:/...``)
    sockets: tuple[str, ...]
    #: the TCP link address of each worker of the host, by index
    links: tuple[str, ...]

    @property
    def workers(self) -> int:
        return len(self.links)

    @property
    def socket(self) -> str:
        return self.sockets[self.index]

    def sibling_sockets(self) -> list[str]:
        return [s for k, s in enumerate(self.sockets) if k != self.index]

    def is_sibling(self, host_id: object) -> bool:
        return host_id == self.host_id

    def socket_of(self, address: str) -> str | None:
        """A sibling's socket, by its TCP link address (None: not one of this host's)."""
        return self.sockets[self.links.index(address)] if address in self.links else None

    def own_link(self, address: str) -> bool:
        """One of this host's link addresses (a worker of ours, by TCP or socket)."""
        return address in self.links or address in self.sockets


def peer_host(peer: Peer) -> str:
    """The host id a peer's latest status names ("" before its first, or not a worker
    of a cluster of hosts): the election counts only peers it has statuses from."""
    return peer.status.host if peer.status is not None else ""


def known_hosts_count(
    known: Iterable[str], own: Iterable[str], names_by_host: Mapping[str, Iterable[str]]
) -> int:
    """The distinct hosts among the known names: this host's own names count once,
    and so do the names that reached each other host's live workers. A name two
    hosts claim (moved, or a stale record) merges nothing; a name nothing has
    resolved yet counts on its own: never fewer hosts than there are."""
    listed = set(known)
    groups = [set(own) & listed] + [set(names) & listed for names in names_by_host.values()]
    claims = Counter(name for group in groups for name in group)
    merged = (sum(claims[name] == 1 for name in group) for group in groups)
    return len(listed) - sum(n - 1 for n in merged if n > 1)
