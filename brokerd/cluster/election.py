"""Root election as pure functions over one server's view of the cluster (seed 000).

Every server runs the same election over its own view:

- candidates are the active primaries with root enabled and a matching
  checksum; a server that is root stays the choice while it remains a
  candidate (enabling a more senior server does not steal root), otherwise
  the candidate whose state log ranks first by (term, sequence) is chosen
  (``terms.py``), then the one with the best copy of the shared queues: a
  whole copy before one still taking a snapshot, then the copy furthest along
  the leading root's replication stream (``copy``), then the latest root (the
  highest term a member claimed for itself), then the most senior (earliest
  start, then lowest spid);
- a server is root when it is its own choice, every active primary votes
  for it (unanimity), and the active primaries are more than half of the
  known primaries (quorum).

A primary that abstains (its vote is None: it is starting, or rejoining
after a stall) counts for neither quorum nor unanimity; otherwise a
server returning with a stale view would knock the sitting root over.

Because quorums of two servers always share a member and each member casts
one vote, two servers can never both satisfy the root condition with
current votes; tests/unit/test_election.py checks this with hypothesis.

A confirm needs the master and a majority of the known primaries
(``replicated``), and a root needs a majority voting for it: the two
majorities share a primary that holds every confirmed message, and it votes
for a copy at least as far along as its own (what it sees of others' copies
is never ahead of them: a copy only grows). So the new root holds every
confirmed message; tests/unit/test_election_copy.py checks this over any
interleaving with hypothesis.

Votes travel in heartbeats, so they are never quite current. The root
therefore also holds a *lease* (``holds_lease``): it acts as root only while
more than half of the known primaries, itself included, back it with a
status that votes for it and echoes one of the root's own statuses sent less
than a window ago (the window is shorter than the followers' timeout). The
echo proves that the follower heard the root at that send time, so it sees
the root active, and keeps voting for it, until at least that send time plus
its timeout: no other server can gather a majority before the lease runs
out, however late the root itself reads its input (a paused root reads old
votes as new; their echoes are as old as they are). The backing statuses must
also back it in its term (``terms.py``): two servers never act in one term.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIMARY = "primary"
SECONDARY = "secondary"


@dataclass(frozen=True)
class Member:
    """What a server knows of one cluster member (itself included)."""

    spid: str
    type: str = PRIMARY
    start_time: float = 0.0
    root_enabled: bool = True
    checksum: str = ""
    #: statuses arrive within the timeout (always true for the server itself)
    active: bool = True
    #: the spid this member votes for, from its latest status (None: no vote yet)
    vote: str | None = None
    #: a primary counts only if it is one of the cluster file's known hosts
    listed: bool = True
    #: seconds since the viewing server sent the status of its own that this member's
    #: latest status echoes (None: none it remembers, or the link to it is down)
    echo_age: float | None = None
    #: its copy of the shared queues is not whole (a snapshot under way)
    syncing: bool = False
    #: its copy's place: (the root whose replication stream it follows, the last
    #: event it applied); the root itself: (itself, its last event). None: no copy
    copy: tuple[str, int] | None = None
    #: it recovered shared wiring from its disk when it started (a server that did
    #: not, a new one or one whose disk was lost, has nothing to seed a log with)
    holds_state: bool = False
    #: its state log's place: (the root it synced the cluster's wiring from, the
    #: last entry it applied); the root itself: (itself, its last entry). None:
    #: never synced since it started
    state: tuple[str, int] | None = None
    #: the term of the root that log follows (``terms.py``): places compare as
    #: (state_term, seq), alike on every server
    state_term: int = 0
    #: its term, and whom it backs in it (``terms.Term``; the root: itself)
    term: int = 0
    term_for: str | None = None

    @property
    def voter(self) -> bool:
        return self.type == PRIMARY and self.listed

    @property
    def seniority(self) -> tuple[float, str]:
        return (self.start_time, self.spid)


@dataclass(frozen=True)
class View:
    """One server's picture of the cluster at one moment."""

    me: Member
    peers: tuple[Member, ...] = ()
    #: number of primaries in the shared cluster file's known_hosts
    known_primaries: int = 1
    #: the root this server currently recognises (sticky across elections)
    current_root: str | None = None
    #: the root it recognised last (the one whose stream the copies follow)
    last_root: str | None = None

    def members(self) -> tuple[Member, ...]:
        return (self.me, *self.peers)

    def heard_primaries(self) -> list[Member]:
        """Active listed primaries, voting or not: this server, and the peers it hears."""
        return [m for m in self.members() if m.voter and m.active]

    def active_primaries(self) -> list[Member]:
        """Active listed primaries that take part: this server, and peers that vote."""
        return [
            m
            for m in self.members()
            if m.voter and m.active and (m is self.me or m.vote is not None)
        ]


@dataclass(frozen=True)
class Decision:
    vote: str | None
    is_root: bool
    quorum: bool
    reason: str = field(default="")


def is_candidate(member: Member, checksum: str) -> bool:
    return member.voter and member.active and member.root_enabled and member.checksum == checksum


def has_quorum(view: View) -> bool:
    """Active primaries (this server included) are more than half of the known primaries."""
    return 2 * len(view.active_primaries()) > view.known_primaries


def holds_lease(view: View, window: float, term: int) -> bool:
    """More than half of the known primaries back this server in ``term``: itself,
    and active peers whose latest status votes for it, backs it in that term, and
    echoes one of its statuses sent less than ``window`` seconds ago (see the
    module docstring and ``terms.py``)."""
    me = view.me
    backing = 1 + sum(
        1
        for m in view.peers
        if m.voter
        and m.active
        and m.vote == me.spid
        and m.term == term
        and m.term_for == me.spid
        and m.echo_age is not None
        and m.echo_age < window
    )
    return 2 * backing > view.known_primaries


def copy_rank(member: Member, stream: str | None) -> int:
    """How far along ``stream`` (a root's replication stream) the member's copy is
    (-1: its copy follows another stream, or it has none: it ranks last)."""
    copy = member.copy
    if copy is None or stream is None or copy[0] != stream:
        return -1
    return copy[1]


def state_rank(member: Member) -> tuple[int, int]:
    """Its state log's place, (term, last entry), ordered alike on every server
    (``terms.py``); (-1, -1): never synced since it started, ranks last."""
    if member.state is None:
        return (-1, -1)
    return (member.state_term, member.state[1])


def leading_log(view: View) -> str | None:
    """The root whose log ranks first among the members (None: nobody follows one,
    as after a whole-cluster restart): the stream the copies are compared along."""
    synced = [(state_rank(m), m.state[0]) for m in view.members() if m.state is not None]
    return max(synced)[1] if synced else view.last_root


def claimed_term(member: Member) -> int:
    """The term the member claimed as root, if its latest status still says so (0:
    it backs another). Among copies that tie, the latest root is chosen before the
    eldest: a root that released for a moment (its lease lapsed on a busy machine)
    is not unseated by an elder that has just rejoined, as one was after a SIGSTOP."""
    return member.term if member.term_for == member.spid else 0


def choose(view: View) -> str | None:
    """The spid this server votes for: the sitting root if still eligible, else the
    candidate whose state log ranks first, then the one with the best copy (whole,
    then furthest along), then, among those with no copy of the leading root's
    stream, one that recovered cluster state from its disk, then the one that
    claimed the latest term as root (``claimed_term``), then the eldest.

    The state log first: a new root's log becomes every server's (they sync from
    it), so one that missed entries an earlier root ordered would undo them. A
    primary cut off while the root fenced it and failed its queues over, then
    elected on its better copy when the root died, took back queues that their new
    owner was already confirming: two owners, confirmed messages lost (seed 94).
    Of the servers that applied an entry, one is among any majority that elects,
    so the furthest of them holds it. Logs rank by (term, sequence), which every
    server computes alike: ranked by each server's own last root, two servers
    once voted for each other for as long as the partition's aftermath lasted.

    After a whole-cluster restart no log ranks (nobody has synced): the root
    seeds the cluster's state log from its own disk and the others drop what it
    lacks, so a server that recovered nothing (its disk lost, or new) must not
    win on seniority alone, as it did: every queue was dropped."""
    checksum = view.me.checksum
    candidates = [m for m in view.members() if is_candidate(m, checksum)]
    if not candidates:
        return None
    if view.current_root is not None:
        for member in candidates:
            if member.spid == view.current_root:
                return member.spid
    stream = leading_log(view)

    def rank(m: Member) -> tuple[int, int, bool, int, bool, int, tuple[float, str]]:
        copy = copy_rank(m, stream)
        term, seq = state_rank(m)
        # state from disk counts only where no copy of the leading stream does
        no_state = copy < 0 and not m.holds_state
        return (-term, -seq, m.syncing, -copy, no_state, -claimed_term(m), m.seniority)

    return min(candidates, key=rank).spid


def decide(view: View) -> Decision:
    """This server's vote, and whether it is root now."""
    vote = choose(view)
    quorum = has_quorum(view)
    me = view.me
    if me.type != PRIMARY:
        return Decision(vote, False, quorum, "secondaries never become root")
    if not me.listed:
        return Decision(vote, False, quorum, "this primary is not in known_hosts")
    if vote != me.spid:
        return Decision(vote, False, quorum, f"votes for {vote}" if vote else "no candidate")
    if not quorum:
        return Decision(
            vote,
            False,
            quorum,
            f"no quorum: {len(view.active_primaries())} of {view.known_primaries} primaries active",
        )
    dissent = [
        m.spid
        for m in view.peers
        if m.voter and m.active and m.vote is not None and m.vote != me.spid
    ]
    if dissent:
        return Decision(vote, False, quorum, f"waiting for votes from {', '.join(dissent)}")
    return Decision(vote, True, quorum, "root")
