"""What a server sees of the cluster (the view half of ``standing.py``).

Which peers count as active, how old the echoes that back a root's lease
are, and how many distinct servers the known hosts name (the quorum's
denominator): the inputs of the pure election (``election.decide``), built
fresh at each evaluation.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from brokerd.cluster import terms
from brokerd.cluster.election import Decision, Member, View
from brokerd.cluster.hostgroup import known_hosts_count, peer_host

if TYPE_CHECKING:
    from brokerd.cluster.hostgroup import HostGroup
    from brokerd.cluster.peers import Peer
    from brokerd.cluster.standing import StandingHost


class Viewing:
    """The view of ``Standing`` (a mixin: the state it reads is Standing's)."""

    host: StandingHost
    decision: Decision
    role_root: bool
    stopping: bool
    current_root: str | None
    last_root: str | None
    term: terms.Term
    stance_at: float
    _sent: dict[float, float]

    def active(self, peer: Peer, now: float, window: float | None = None) -> bool:
        """Heard within ``window`` (default: the heartbeat timeout, see ``silence``),
        and not known to be gone. A cut link ages out like a real one: its statuses
        are dropped, what was heard stays valid."""
        if window is None:
            window = self.silence(peer.status is not None and peer.status.is_root)
        return peer.status is not None and not peer.gone and now - peer.last_seen < window

    def silence(self, root: bool) -> float:
        """How long a server may go unheard before it counts as inactive: the timeout
        after its next beat was due (a root beats every half interval, the others
        every interval). A pause shorter than the timeout then never shows, wherever
        in the beat it falls, on either side: the followers still hear a paused
        root, and a root back from a pause still counts the followers it read last
        before it. The lease stays safe, since it rests on echoes, not on this."""
        interval = self.host.config.heartbeat_interval
        return self.host.config.heartbeat_timeout + (interval / 2 if root else interval)

    @property
    def lease(self) -> float:
        """How recent the status of ours that a follower echoes must be for it to back
        this server as root: one interval short of the followers' timeout, so a
        clock running slow by up to interval/timeout still errs on the safe side.
        The root beats every half interval and its followers answer at once, so in
        steady state the echoes are half an interval old."""
        return self.host.config.heartbeat_timeout - self.host.config.heartbeat_interval

    def echo_age(self, peer: Peer, now: float) -> float | None:
        """Seconds since we sent the status of ours that the peer's latest echoes;
        None if we sent it before our vote or candidacy last changed: a vote cast
        without knowing our present stance is not a vote for it (it may be counted
        by the server we voted for meanwhile)."""
        echo = peer.status.echo.get(self.host.spid) if peer.status is not None else None
        sent = self._sent.get(echo[0]) if echo is not None else None
        return None if sent is None or sent < self.stance_at else now - sent

    def view(self, now: float) -> View:
        members = []
        sitting = None
        for peer in self.host.peers.values():
            status = peer.status
            if status is None:
                continue
            active = self.active(peer, now)
            # a peer heard again only just now voted before it could know the
            # sitting root: count it as abstaining for one timeout, unless it has
            # shown it knows our root already (a primary that rejoined and synced)
            settled = (
                peer.caught_up or now - peer.active_since >= self.host.config.heartbeat_timeout
            )
            if active and status.is_root and (sitting is None or peer.spid < sitting):
                sitting = peer.spid
            members.append(
                Member(
                    spid=peer.spid,
                    type=status.type,
                    start_time=status.start_time,
                    root_enabled=status.root_enabled,
                    checksum=status.checksum,
                    active=active,
                    vote=status.vote if settled else None,
                    listed=status.listed,
                    echo_age=self.echo_age(peer, now),
                    syncing=status.syncing,
                    copy=None
                    if status.copy_source is None
                    else (status.copy_source, status.copy_seq),
                    holds_state=status.holds_state,
                    state=None
                    if status.state_source is None
                    else (status.state_source, status.state_seq),
                    state_term=status.state_term,
                    term=status.term,
                    term_for=status.term_for,
                )
            )
        if self.role_root:
            sitting = self.host.spid
        source = self.host.state_source()
        me = Member(
            spid=self.host.spid,
            type=self.host.type,
            start_time=self.host.start_time,
            root_enabled=self.candidate,
            checksum=self.host.checksum,
            active=True,
            vote=self.decision.vote,
            listed=self.host.listed,
            syncing=not self.host.copy_complete(),
            copy=self.host.copy_position(),
            holds_state=self.host.holds_state,
            state=None if source is None else (source, self.host.state_seq()),
            state_term=self.host.state_term(),
            term=self.term.number,
            term_for=self.term.backs,
        )
        return View(me, tuple(members), self.known_primaries(now), sitting, self.last_root)

    @property
    def candidate(self) -> bool:
        """Root enabled, and not on its way out (a stopping server leaves the race)."""
        return self.host.root_enabled and not self.stopping

    def known_primaries(self, now: float) -> int:
        """Distinct servers among the known hosts, the quorum's denominator.

        Names that led to the same server count once: this server's own names,
        and an *active* peer's aliases. Only live evidence merges names (an
        address may since belong to another server), so a listed name that no
        link has resolved yet still counts on its own: never fewer servers than
        there are, only sometimes more, which errs on the safe side. The one
        exception is a sibling worker whose process has ended (``ended``): a
        dead process never votes, and when it starts again it counts again.

        A worker of a host in a cluster of hosts counts hosts, W workers each
        (``hostgroup.py``): the known hosts, merged by the host their names reached."""
        if self.host.hostgroup is not None:
            return self._host_workers(now, self.host.hostgroup)
        groups = [self.host.own_addresses & self.host.known]
        groups += [
            p.aliases & self.host.known for p in self.host.peers.values() if self.active(p, now)
        ]
        # a name claimed by two servers is ambiguous (moved, or a stale record): it merges nothing
        claims = Counter(name for group in groups for name in group)
        merged = (sum(claims[name] == 1 for name in group) for group in groups)
        # a sibling worker whose process ended is no voter until it starts again: the
        # workers of one host keep their root through a worker's crash and restart
        ended = sum(self.host.siblings.ended(name) for name in self.host.known)
        count = len(self.host.known) - sum(n - 1 for n in merged if n > 1) - ended
        if self.current_root == self.host.spid:
            # a restarted sibling worker that has not yet named this root: not counted
            # until it has, so the root stays through the restart. One at most: with a
            # single newcomer left out, this root's majority and any majority of the
            # full count still share a server (tests/unit/test_worker_quorum.py)
            newcomers = [name for name in self.host.known if self.host.siblings.joining(name)]
            count -= len(newcomers) == 1
        return count

    def _host_workers(self, now: float, group: HostGroup) -> int:
        """The known hosts, merged by host, times the workers each runs."""
        own = set(self.host.own_addresses)
        names: dict[str, set[str]] = {}
        for peer in self.host.peers.values():
            there = peer_host(peer)
            if not there or not self.active(peer, now):
                continue
            if group.is_sibling(there):
                own |= peer.aliases
            else:
                names.setdefault(there, set()).update(peer.aliases)
        return known_hosts_count(self.host.known, own, names) * group.workers
