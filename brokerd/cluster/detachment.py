"""Detachment: a server that cannot reach the root the others reach sends its
clients elsewhere (320) rather than holding them for as long as the cut lasts.

The election (``standing.py``) asks ``check`` at every evaluation; this module
decides from the peers' statuses and echoes alone (``unreachable_root``), with
a grace of half an interval so that a witness heard before the root right
after a heal does not detach anyone. Its sibling for a server that hears no
witness at all is ``partition.py``.

The same evidence finds a cut from a queue's owner while the root and the
others reach it (one pair of servers cut, the rest connected: the "bridge"
topology). Nobody fails that owner over, since the root hears it, so a client
here whose publishes or consumer go to it would wait for as long as the cut
lasts. When this server's clients wait on such an owner (``StandingHost.
waits_on``), it sends them elsewhere too (``owner``), as RabbitMQ turns a
partial partition into a full one; it stays ready and in sync meanwhile, and
its other duties (owner, replica) go on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from brokerd.cluster.peers import Peer
    from brokerd.cluster.standing import StandingHost


class Detachment:
    """The root this server cannot reach while another server demonstrably does."""

    def __init__(self, host: StandingHost, active: Callable[[Peer, float], bool]) -> None:
        self.host = host
        self.active = active
        #: the root detached from (None: not detached)
        self.root: str | None = None
        #: the root ``unreachable_root`` names, and since when (detached after a grace)
        self._unreached: tuple[str, float] | None = None
        #: the owner cut from while others reach it, the queue this server's clients
        #: wait on there, and the witness (None: none)
        self.owner: tuple[str, str, str] | None = None
        self._owner_since: float | None = None

    @property
    def pending(self) -> bool:
        """A root looks unreachable and the grace runs: ask everyone for a status."""
        return self._unreached is not None and self.root is None

    def check(self, root: str | None, now: float) -> str | None:
        """The root to be detached from now (``root``: the one this server recognises,
        if any; a root is never detached from itself)."""
        unreached = None if root == self.host.spid else self.unreachable_root(now)
        self.root = self._settle(unreached, now)
        return self.root

    def unreachable_root(self, now: float) -> str | None:
        """The root this server cannot reach while another server demonstrably does.

        We have not heard root X for more than an interval (two of its half-interval
        beats) with our link to it down, or for more than two intervals with the
        link nominally up (a silent partition); and an active peer P, heard within
        two intervals, recognises X as root and echoes a status of X sent at least
        an interval (two beats) after the newest one we have. Both ``sent_at``
        values are X's own clock, so the comparison needs no clock agreement. A
        root that died is heard by nobody (its very last status may reach some
        servers and not others: one beat, not two), so this never fires on a
        failover; a server cut off from everyone has no witness (``partition.py``
        decides for it)."""
        for witness in self.host.peers.values():
            status = witness.status
            root = status.root if status is not None else None
            if status is None or root in (None, self.host.spid, witness.spid):
                continue
            peer = self.host.peers.get(root) if root is not None else None
            if peer is not None and self._reaches(witness, peer, now):
                return peer.spid
        return None

    def _reaches(self, witness: Peer, peer: Peer, now: float) -> bool:
        """``witness``, active and heard within two intervals, echoes a status of
        ``peer`` sent at least an interval after the newest we have, while we have
        not heard ``peer`` for an interval with our link to it down, or for two with
        it nominally up (``unreachable_root``)."""
        interval = self.host.config.heartbeat_interval
        status = witness.status
        if status is None or peer.status is None or peer.gone or witness is peer:
            return False
        if not self.active(witness, now) or now - witness.last_seen > 2 * interval:
            return False
        if not self._silent(peer, now):
            return False
        echo = status.echo.get(peer.spid)
        return echo is not None and echo[0] - peer.status.sent_at >= interval

    def _silent(self, peer: Peer, now: float) -> bool:
        """Not heard for an interval with our link to it down, or for two with it up."""
        interval = self.host.config.heartbeat_interval
        silent = now - peer.last_seen
        return silent > (interval if self.host.link_to(peer.spid) is None else 2 * interval)

    def check_owners(self, now: float) -> tuple[str, str, str] | None:
        """The owner this server's clients wait on that it cannot reach while a
        witness does, held for half an interval: (owner, queue, witness), or None.
        Not asked while detached from the root (that sends the clients away already)."""
        found = None
        for peer in self.host.peers.values():
            if peer.spid == self.host.spid or peer.gone or peer.status is None:
                continue
            if not self._silent(peer, now):
                continue  # heard: no witness needed (keeps this linear in a healthy cluster)
            witness = next(
                (w for w in self.host.peers.values() if self._reaches(w, peer, now)), None
            )
            # what its clients wait on is looked up only for a peer cut off (it walks
            # the queues)
            queue = self.host.waits_on(peer.spid) if witness is not None else None
            if witness is not None and queue is not None:
                found = (peer.spid, queue, witness.spid)
                break
        if found is None:
            self.owner = self._owner_since = None
            return None
        if self._owner_since is None:
            self._owner_since = now
        if self.owner is None and now - self._owner_since < self.host.config.heartbeat_interval / 2:
            return None
        self.owner = found
        return found

    def _settle(self, unreached: str | None, now: float) -> str | None:
        """The root to detach from: ``unreachable_root`` must name it for half an
        interval, during which we ask everyone for a status. Right after a cut
        heals, a witness's status may arrive before the root's own (links come
        back one by one); the root, if we can reach it, answers the ask at once."""
        if unreached is None:
            self._unreached = None
            return None
        if self.root == unreached:
            return unreached
        if self._unreached is None or self._unreached[0] != unreached:
            self._unreached = (unreached, now)
        if now - self._unreached[1] >= self.host.config.heartbeat_interval / 2:
            return unreached
        return None

    def owner_reason(self) -> str:
        assert self.owner is not None
        owner, queue, witness = self.owner
        return (
            f"this server cannot reach {owner}, the owner of queue '{queue}' its clients "
            f"use (reached by {witness}): connect to another server"
        )

    def reason(self) -> str:
        witnesses = [
            p.spid
            for p in self.host.peers.values()
            if p.status is not None and p.status.root == self.root and p.spid != self.root
        ]
        return (
            f"this server cannot reach root {self.root} (reached by "
            f"{', '.join(sorted(witnesses)) or 'others'}): connect to another server"
        )
