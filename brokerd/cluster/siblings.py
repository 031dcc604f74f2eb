"""The workers of one host (``brokerd --workers``) as the election counts them.

A sibling worker's link socket is on this host: when it refuses and nothing of
that worker is connected, the process has ended, and no network can make a
live worker look so. ``Standing.known_primaries`` leaves such a sibling out of
the quorum's count, and on the sitting root one restarted sibling that has not
joined yet; a cluster of sockets that all answered needs no start window.
TCP known hosts never leave the count (a port may lie).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from brokerd.cluster.config import UNIX_SCHEME

if TYPE_CHECKING:
    from brokerd.cluster.link import Link
    from brokerd.cluster.peers import Peer


class SiblingsHost(Protocol):
    """What the count reads of membership."""

    spid: str
    known: set[str]
    own_addresses: set[str]
    #: known-host addresses a link of ours reached a peer at since this server started
    reached: set[str]
    links: dict[str, Link]
    peers: dict[str, Peer]


class Siblings:
    """Which sibling workers the election leaves out of its count, and why."""

    def __init__(self, members: SiblingsHost) -> None:
        self.members = members

    def ended(self, address: str) -> bool:
        """A sibling worker's link socket refuses and nothing of it is connected to
        us: its process has ended. Only a Unix socket says so for sure (it is on this
        host: no network can make a live worker look like this), so only a worker
        of ``brokerd --workers`` leaves the quorum's count while it is dead."""
        if not address.startswith(UNIX_SCHEME) or address in self.members.own_addresses:
            return False
        if address not in self.members.reached:
            return False  # never up since we started: not started yet, not ended
        link = self.members.links.get(address)
        if link is None or link.up or not link.refused:
            return False
        return not any(p.inbound for p in self._at(address))

    def joining(self, address: str) -> bool:
        """A sibling worker at ``address`` started after this server and has not yet
        named our root in a status: a restarted worker still joining."""
        if not address.startswith(UNIX_SCHEME) or address in self.members.own_addresses:
            return False
        if self.ended(address):
            return False
        there = self._at(address)
        if not there:
            return False
        newest = max(there, key=lambda p: p.spid)  # spids sort by start time
        return newest.spid > self.members.spid and not newest.caught_up

    def all_resolved(self) -> bool:
        """Every known host is a sibling worker's socket that has answered: linked up,
        ourselves, or ended. Such a cluster needs no start window to hear from its
        members (a Unix socket answers at once), so a restarted worker votes as
        soon as it has linked, and its siblings keep their root through its return."""
        for address in self.members.known:
            if not address.startswith(UNIX_SCHEME):
                return False
            if address in self.members.own_addresses or self.ended(address):
                continue
            link = self.members.links.get(address)
            if link is None or not link.up:
                return False
        return True

    def _at(self, address: str) -> list[Peer]:
        """The peers known at ``address`` (the newest spid is the running one)."""
        return [
            p for p in self.members.peers.values() if address == p.address or address in p.aliases
        ]
