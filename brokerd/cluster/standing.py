"""Where this server stands: the election loop over its view, the root's lease,
readiness, and whether it can reach the root at all.

``Standing`` is an object that ``membership.Membership`` has (``standing``).
It owns the election's state outright: the decision, the announced role, the
lease's bookkeeping (our statuses' send times, our stance), suspension,
detachment, the root recognised, readiness and stopping. What it reads of
membership (configuration, identity, the known hosts, the peers, the clock,
the links, the copy's position, whether we hold the root's wiring) comes
through the ``StandingHost`` protocol; what it announces (root taken or
changed, a peer lost, a sync wanted, the lease renewed, readiness, a detach,
our status, a ``cluster.root``) goes through the ``StandingEvents`` protocol.
``Membership`` is both (the controller overrides the planes' part of the
events), and reads the state here back through thin properties.

``evaluate`` runs on every status received, every heartbeat and every
admission; it re-runs the pure election (``election.decide``) and turns its
outcome into the server's *role*:

- **acting** (``decision.is_root``): elected and holding the lease, so it may
  order wiring and answer as root;
- **announced** (``role_root``): what its statuses and ``cluster.root`` say,
  what the planes follow. A root that is still elected but whose lease has run
  out (it was paused, or its followers' echoes are late) is *suspended*: it
  stops acting at once but keeps the announced role for up to one interval
  while it asks its followers for fresh echoes (statuses with ``reply``), so a
  pause shorter than the followers' timeout is invisible to them. If the lease
  does not come back in that interval, or the election no longer makes it
  root, it gives the role up and says so.

Every change a peer should know of (vote, role, root enabled, the root it
recognises) is sent at once rather than at the next heartbeat, so an election
completes in a few link round trips once a peer is known to be gone.

A server that cannot reach a root the others reach (a cut link) is *detached*:
it tells its clients to go elsewhere (320) and refuses new ones at once,
instead of holding them for the whole cut. See ``unreachable_root``.

A stopping server leaves the election while it still listens (``hand_over``):
a root releases and waits for its successor, so the clients it then closes
find a root wherever they reconnect, and no peer ever finds the port of a
sitting root refused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from brokerd.cluster import terms
from brokerd.cluster.detachment import Detachment
from brokerd.cluster.election import PRIMARY, Decision, View, decide, holds_lease
from brokerd.cluster.messages import Root
from brokerd.cluster.partition import Partition
from brokerd.cluster.viewing import Viewing

if TYPE_CHECKING:
    from pathlib import Path

    from brokerd.cluster.config import ClusterConfig
    from brokerd.cluster.hostgroup import HostGroup
    from brokerd.cluster.link import Link
    from brokerd.cluster.peers import Peer
    from brokerd.cluster.siblings import Siblings

log = logging.getLogger("brokerd.cluster")


class StandingHost(Protocol):
    """What the election reads of membership (``Membership`` provides it)."""

    config: ClusterConfig
    spid: str
    type: str
    start_time: float
    checksum: str
    known: set[str]
    #: known-host addresses that turned out to be this server
    own_addresses: set[str]
    #: the workers of this host (``siblings.Siblings``)
    siblings: Siblings
    #: a worker of a host in a cluster of hosts (``hostgroup.HostGroup``; None: not one)
    hostgroup: HostGroup | None
    listed: bool
    #: it recovered shared wiring from its disk at start (``election.choose``)
    holds_state: bool
    root_enabled: bool
    peers: dict[str, Peer]
    clock: Callable[[], float]
    #: where this server keeps its term through restarts (None: nowhere, in tests)
    term_path: Path | None

    def link_to(self, spid: str | None) -> Link | None: ...
    def copy_complete(self) -> bool: ...
    def copy_position(self) -> tuple[str, int] | None: ...
    def state_seq(self) -> int: ...
    def state_source(self) -> str | None: ...
    def state_term(self) -> int: ...
    def in_sync(self, root: str) -> bool: ...
    def ended_primaries(self, now: float) -> int: ...
    def waits_on(self, spid: str) -> str | None: ...


class StandingEvents(Protocol):
    """What the election announces (``Membership`` implements it; the controller
    overrides the part the planes follow)."""

    def became_root(self) -> None: ...
    def root_changed(self, old: str | None, new: str | None) -> None: ...
    def peer_lost(self, spid: str, why: str) -> None: ...
    def want_sync(self, root: str) -> None: ...
    def lease_renewed(self) -> None: ...
    def ready_changed(self, ready: bool, reason: str) -> None: ...
    def detach(self, reason: str) -> None: ...
    def tell(self, now: float, *, ask: bool) -> None: ...
    def broadcast(self, message: Root) -> None: ...


class Standing(Viewing):
    """The election loop of one server, over its host's view of the cluster."""

    def __init__(self, host: StandingHost, events: StandingEvents) -> None:
        self.host = host
        self.events = events
        self.decision = Decision(None, False, False, "starting")
        #: the role announced to peers (see the module docstring)
        self.role_root = False
        #: the election alone made this server root at the last evaluation
        self.elected = False
        #: when the lease ran out while still elected (None: not suspended)
        self.suspended_since: float | None = None
        #: the root this server cannot reach while others can (``detachment.py``)
        self.detachment = Detachment(host, self.active)
        #: left in a minority a majority may be serving without (``partition.py``)
        self.partition = Partition()
        #: leaving the election (``step_down``): it abstains and is no candidate
        self.stopping = False
        #: our own statuses: wall-clock ``sent_at`` -> our clock at sending (for echoes)
        self._sent: dict[float, float] = {}
        #: our vote and candidacy, and when they last changed (our clock)
        self._stance: tuple[str | None, bool, int] = (None, host.root_enabled, 0)
        self.stance_at = float("-inf")
        self.ready = False
        self.not_ready_reason = "no root elected yet"
        #: the start of the start-up window (moved on a stall, see ``elect``)
        self.started = host.clock()
        self._last_eval = 0.0
        #: the root recognised at the last evaluation (root_changed fires on a change)
        self.current_root: str | None = None
        #: the last root recognised (not None): the stream the copies follow
        self.last_root: str | None = None
        #: peers active at the last evaluation (peer_lost fires when one drops out)
        self._was_active: set[str] = set()
        #: our term and whom we back in it (``terms.py``), kept through restarts
        self.term = terms.load(host.term_path)

    @property
    def acting(self) -> bool:
        """Elected and holding the lease: it may order wiring, confirm and deliver."""
        return self.decision.is_root

    def record_sent(self, wall: float, now: float) -> None:
        """A status of ours leaves, stamped ``wall`` (for the echoes that back the lease)."""
        self._sent.setdefault(wall, now)  # the earlier send, if the clock did not move
        if len(self._sent) > 8:  # forget sends too old to back a lease
            horizon = now - self.host.config.heartbeat_timeout
            self._sent = {w: t for w, t in self._sent.items() if t >= horizon}

    # -- the election loop ------------------------------------------------------------

    def elect(self, view: View, now: float) -> Decision:
        """The election over ``view``, with this server's reasons to abstain."""
        if self._last_eval and now - self._last_eval > self.silence(self.role_root):
            # we were frozen past the timeout (SIGSTOP, a long pause): peers may have
            # elected another root meanwhile, so abstain until they are heard again
            # (a root evaluates at each beat, so its followers wait as long)
            log.warning(
                "stalled for %.1fs spid=%s: abstaining for a while",
                now - self._last_eval,
                self.host.spid,
            )
            self.started = now
        self._last_eval = now
        decision = decide(view)
        heard = view.heard_primaries()
        if self.host.type == PRIMARY and 2 * len(heard) <= view.known_primaries:
            # hearing too few primaries (just restarted, links still backing off,
            # the minority side of a partition): a vote from this view would only
            # unseat a root we cannot see, so abstain
            decision = Decision(None, False, False, decision.reason)
        if now - self.started < self.host.config.heartbeat_timeout:
            if self._joined(now) or self.host.siblings.all_resolved():
                self.started = now - self.host.config.heartbeat_timeout  # the window is over
            else:
                # give every known host a chance to link before the first vote,
                # so the cluster forms around its most senior primary
                decision = Decision(None, False, decision.quorum, "starting")
        if self.stopping:
            decision = Decision(None, False, decision.quorum, "stopping")
        return decision

    def _joined(self, now: float) -> bool:
        """A (re)started server that hears a sitting root now and has taken its
        wiring knows the cluster: it votes at once, so a failover right after it
        rejoined counts it (the start window is for a cluster forming, not for a
        rejoin). After a stall every peer is stale, so this is false until the
        root is heard again."""
        root = self.root(now=now)
        return root is not None and root != self.host.spid and self.host.in_sync(root)

    def evaluate(self) -> Decision:
        """Re-run the election on the current view; act, announce and log changes."""
        now = self.host.clock()
        view = self.view(now)
        decision = self.elect(view, now)
        self._take_term(view, decision)
        stance = (decision.vote, self.candidate, self.term.number)
        if stance != self._stance:
            # votes for us from before this change no longer count (see echo_age)
            self._stance, self.stance_at = stance, now
            view = self.view(now)
        self.elected = decision.is_root
        if decision.is_root and not holds_lease(view, self.lease, self.term.number):
            decision = Decision(
                decision.vote,
                False,
                decision.quorum,
                f"lease: fewer than a quorum of primaries backed this server in term "
                f"{self.term.number} and echoed a status of it sent within {self.lease:.2f}s",
            )
        self.decision = decision
        self._settle_role(now)
        root = self.root(now=now)
        active = {p.spid for p in self.host.peers.values() if self.active(p, now)}
        for spid in self._was_active - active:
            self.events.peer_lost(spid, "inactive")
        self._was_active = active
        if root != self.current_root:
            old, self.current_root = self.current_root, root
            if root is not None:
                self.last_root = root
                for peer in self.host.peers.values():
                    if peer.status is not None and peer.status.root == root:
                        peer.caught_up = True  # it named this root first: its vote is current
            log.warning("root changed spid=%s from=%s to=%s", self.host.spid, old, root)
            self.events.root_changed(old, root)
        if root is not None and root != self.host.spid and not self.host.in_sync(root):
            self.events.want_sync(root)
        self._settle_readiness(view, root, now)
        # answers are asked for here only when needed at once: elected without the
        # lease (taking root, or suspended), the root fell silent for us, or a peer
        # says it hears a root we do not (that root answers at once if it can)
        self.events.tell(
            now,
            ask=(self.elected and not decision.is_root)
            or self.suspect(now)
            or self.detachment.pending,
        )
        return decision

    def _take_term(self, view: View, decision: Decision) -> None:
        """Claim a term when elected, else back the candidate we vote for in the term
        it claims (``terms.py``); a new term is on disk before any status says it."""
        me = self.host.spid
        if decision.is_root:
            heard = [terms.Term(m.term, m.term_for) for m in view.peers if m.voter]
            term = terms.claim(self.term, me, heard, floor=self.host.state_term())
        else:
            voted = next((m for m in view.peers if m.spid == decision.vote), None)
            claimed = voted.term if voted is not None and voted.term_for == voted.spid else None
            term = terms.adopt(self.term, decision.vote, claimed)
        if term != self.term:
            terms.save(self.host.term_path, term)
            if term.backs == me:
                log.warning("term claimed spid=%s term=%d", me, term.number)
            self.term = term

    def _settle_role(self, now: float) -> None:
        """Turn the decision into the announced role (see the module docstring)."""
        decision = self.decision
        if decision.is_root:
            if self.suspended_since is not None:
                self.suspended_since = None
                log.warning("root taken spid=%s reason=lease renewed", self.host.spid)
                self.events.lease_renewed()
            if not self.role_root:
                self.role_root = True
                self.events.became_root()
                log.warning("root taken spid=%s reason=%s", self.host.spid, decision.reason)
                self.events.broadcast(Root(self.host.spid, True, decision.reason))
            return
        if not self.role_root:
            return
        if self.elected and (
            self.suspended_since is None
            or now - self.suspended_since < self.host.config.heartbeat_interval
        ):
            if self.suspended_since is None:
                self.suspended_since = now
                # logged as a release: it acts as root no more until the lease is back
                log.warning(
                    "root released spid=%s reason=%s (suspended: asking for fresh echoes)",
                    self.host.spid,
                    decision.reason,
                )
            return
        self.role_root = False
        if self.suspended_since is None:
            log.warning("root released spid=%s reason=%s", self.host.spid, decision.reason)
        else:
            log.warning("root given up spid=%s reason=%s", self.host.spid, decision.reason)
        self.suspended_since = None
        self.events.broadcast(Root(self.host.spid, False, decision.reason))

    def _settle_readiness(self, view: View, root: str | None, now: float) -> None:
        in_sync = root is not None and (root == self.host.spid or self.host.in_sync(root))
        detachment = self.detachment
        was = detachment.root
        detached = detachment.check(root, now)
        if detached != was:
            if detached is not None:
                log.warning("detached spid=%s: %s", self.host.spid, detachment.reason())
                _soon(self.events.detach, f"cluster: {detachment.reason()}")
            else:
                log.warning("reattached spid=%s root=%s", self.host.spid, root)
        # the root fails an owner it cannot hear over instead (a timeout later)
        self._owner_check(now, detached is None and root not in (None, self.host.spid))
        partitioned = self._partition_check(view, root, now)
        ready = in_sync and detached is None
        if detached is not None:
            reason = detachment.reason()
        elif partitioned is not None:
            reason = partitioned
        elif root is None:
            reason = self.no_root_reason(view, self.decision)
        elif not in_sync:
            reason = f"synchronising wiring from root {root}"
        else:
            reason = ""
        if ready != self.ready:
            log.warning(
                "cluster %s spid=%s root=%s %s",
                "ready" if ready else "not ready",
                self.host.spid,
                root,
                reason,
            )
            self.ready = ready
            self.not_ready_reason = reason
            self.events.ready_changed(ready, reason)
        self.not_ready_reason = reason

    def _owner_check(self, now: float, asked: bool) -> None:
        """Cut off from an owner its clients wait on while others reach it
        (``detachment.py``): those clients go elsewhere."""
        detachment = self.detachment
        was = detachment.owner
        if not asked:
            detachment.owner = None
            return
        found = detachment.check_owners(now)
        if found is not None and was is None:
            log.warning("cut from an owner spid=%s: %s", self.host.spid, detachment.owner_reason())
            _soon(self.events.detach, f"cluster: {detachment.owner_reason()}")
        elif found is None and was is not None:
            log.warning("owner %s reached again spid=%s", was[0], self.host.spid)

    def _partition_check(self, view: View, root: str | None, now: float) -> str | None:
        """Partitioned off in a minority (``partition.py``): its clients go elsewhere."""
        was = self.partition.reason
        reason = self.partition.check(
            had_root=self.last_root is not None,
            root=root,
            voters=len(view.heard_primaries()),
            known=view.known_primaries,
            ended=lambda: self.host.ended_primaries(now),
            now=now,
            grace=self.host.config.heartbeat_interval / 2,
        )
        if reason is not None and was is None:
            log.warning("partitioned spid=%s: %s", self.host.spid, reason)
            _soon(self.events.detach, f"cluster: {reason}")
        elif reason is None and was is not None:
            log.warning("partition over spid=%s root=%s", self.host.spid, root)
        return reason

    @property
    def detached(self) -> str | None:
        """The root this server cannot reach while others do (None: not detached)."""
        return self.detachment.root

    @property
    def sends_clients_away(self) -> bool:
        """Detached, partitioned, or cut from an owner its clients use: a client is
        refused at once (320), not held."""
        return self.away_reason is not None

    @property
    def away_reason(self) -> str | None:
        """Why a client is sent elsewhere now (None: it is not)."""
        if self.detached is not None:
            return self.detachment.reason()
        if self.partition.reason is not None:
            return self.partition.reason
        if self.detachment.owner is not None:
            return self.detachment.owner_reason()
        return None

    def no_root_reason(self, view: View, decision: Decision) -> str:
        """Why there is no root, in words that name the cause (the 541 text)."""
        voters = view.heard_primaries()
        if 2 * len(voters) <= view.known_primaries:
            return (
                f"no root: quorum lost, {len(voters)} of {view.known_primaries} "
                "known primaries reachable"
            )
        if not any(m.root_enabled and m.checksum == self.host.checksum for m in voters):
            return "no root: root is disabled on every reachable primary"
        if self.host.type != PRIMARY:
            return "no root: the primaries are electing one"
        return f"no root: {decision.reason}"

    def root(self, view: View | None = None, now: float | None = None) -> str | None:
        """The root this server recognises: itself, or an active peer that says it is,
        in a term not below ours (a root of an earlier term lost its majority to a
        later one, whatever its last status still says)."""
        if self.role_root:
            return self.host.spid
        now = self.host.clock() if now is None else now
        for peer in self.host.peers.values():
            status = peer.status
            if (
                status is not None
                and status.is_root
                and status.term >= self.term.number
                and self.active(peer, now)
            ):
                return peer.spid
        return None

    # -- leaving ----------------------------------------------------------------------

    def step_down(self) -> None:
        """Leave the election before this server stops listening: release root (the
        successor is elected in a few round trips, statuses being sent on change)
        and abstain, so that no peer sees the port refused while this is root."""
        if not self.stopping:
            self.stopping = True
            log.warning("stepping down spid=%s: stopping", self.host.spid)
            self.evaluate()

    async def hand_over(self, limit: float | None = None) -> None:
        """Step down, and if this server was root wait (at most ``limit``, default the
        heartbeat timeout) until another is: the clients a stopping server sends
        away then find a root wherever they reconnect, with no gap to wait out."""
        was_root = self.role_root
        self.step_down()
        if not was_root:
            return
        deadline = self.host.clock() + (
            self.host.config.heartbeat_timeout if limit is None else limit
        )
        while self.host.clock() < deadline and self._successor_possible():
            await asyncio.sleep(0.005)
            self.evaluate()
            if self.current_root not in (None, self.host.spid):
                log.warning("handed over spid=%s root=%s", self.host.spid, self.current_root)
                return
        log.warning("stepping down spid=%s: no successor", self.host.spid)

    def _successor_possible(self) -> bool:
        """The primaries we hear, without us, can elect a root: a quorum of them, and
        one is a candidate (otherwise waiting for a successor is waiting in vain)."""
        view = self.view(self.host.clock())
        voters = [m for m in view.peers if m.voter and m.active]
        return 2 * len(voters) > view.known_primaries and any(
            m.root_enabled and m.checksum == self.host.checksum for m in voters
        )

    def suspect(self, now: float) -> bool:
        """We have not heard our root for over an interval: ask peers for statuses, so
        that ``unreachable_root`` learns at once whether they still hear it."""
        root = self.current_root
        peer = self.host.peers.get(root) if root is not None and root != self.host.spid else None
        if peer is None or peer.status is None:
            return False
        return now - peer.last_seen > self.host.config.heartbeat_interval


def _soon(callback: Callable[[str], None], arg: str) -> None:
    """Call after the current step (closing connections from inside one of them is
    not safe); at once when no loop runs (unit tests)."""
    try:
        asyncio.get_running_loop().call_soon(callback, arg)
    except RuntimeError:
        callback(arg)
