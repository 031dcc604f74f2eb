"""Root terms (``brokerd/cluster/terms.py``): claims, backing, and a state machine.

The state machine runs five servers through any interleaving of: hearing one
another (views go stale between hearings), claiming a term, voting and backing,
acting as root (a majority backing it in its term: the lease, abstracted),
ordering entries, syncing a follower's log from an acting root, and applying
the root's entries, late or not. It checks what the election's safety rests on:

- never two servers act in one term, nor two at once;
- a server acting in a term holds every entry a majority of servers held
  before (a committed entry is never undone);
- two logs that follow one term agree on what both hold.

Votes follow ``election.choose``'s ranking by (term, place) as the voter last
heard the candidate, or the sitting root; backing and claiming are the real
``terms.adopt`` and ``terms.claim``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from brokerd.cluster import terms
from brokerd.cluster.terms import Term
from tests.support.examples import examples

SERVERS = [f"s{i}" for i in range(5)]
MAJORITY = len(SERVERS) // 2 + 1

Entry = tuple[int, int]  # (term it was ordered in, place)


def test_a_server_backs_one_candidate_per_term_and_its_term_never_falls() -> None:
    own = Term(3, "a")
    assert terms.adopt(own, "b", 3) == own  # it backs a in term 3 already
    assert terms.adopt(own, "b", 2) == own
    assert terms.adopt(own, "b", 4) == Term(4, "b")
    assert terms.adopt(Term(3, None), "b", 3) == Term(3, "b")
    assert terms.adopt(own, None, 9) == own and terms.adopt(own, "b", None) == own


def test_a_claim_stays_until_someone_is_past_it_or_backs_another_in_it() -> None:
    mine = Term(4, "me")
    assert terms.claim(mine, "me", [Term(4, "me"), Term(2, "x")]) == mine
    assert terms.claim(mine, "me", [Term(4, None)]) == mine
    assert terms.claim(mine, "me", [Term(4, "x")]) == Term(5, "me")
    assert terms.claim(mine, "me", [Term(7, "x")]) == Term(8, "me")
    # a claim is above the term of the log it holds
    assert terms.claim(Term(2, "x"), "me", [], floor=6) == Term(7, "me")
    assert terms.claim(mine, "me", [], floor=6) == Term(7, "me")


def test_the_term_outlives_a_restart_with_whom_it_backs(tmp_path: Path) -> None:
    path = tmp_path / "cluster" / "term.json"
    assert terms.load(path) == Term()
    terms.save(path, Term(6, "s1"))
    back = terms.load(path)
    assert back == Term(6, "s1")
    assert terms.adopt(back, "s1", 6) == back  # the sitting root: nothing to claim anew
    assert terms.adopt(back, "s2", 6) == back  # it backed another in 6 before
    assert terms.adopt(back, "s2", 7) == Term(7, "s2")
    path.write_text("not json")
    assert terms.load(path) == Term()
    path.write_text('{"term": 3}')  # whom it backed unknown: not a term to keep
    assert terms.load(path) == Term()


@dataclass
class Server:
    spid: str
    term: Term = field(default_factory=Term)
    log: list[Entry] = field(default_factory=list)
    #: the term of the root whose log this is (None: never synced)
    log_term: int | None = None

    def place(self) -> tuple[int, int]:
        return (-1, -1) if self.log_term is None else (self.log_term, len(self.log))


@dataclass(frozen=True)
class Heard:
    """What one server last heard of another."""

    term: Term = field(default_factory=Term)
    place: tuple[int, int] = (-1, -1)
    acting: bool = False


class Terms(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.servers = {spid: Server(spid) for spid in SERVERS}
        self.heard: dict[tuple[str, str], Heard] = {}
        #: term -> the server that acted in it, and the root's log in that term
        self.actor: dict[int, str] = {}
        self.root_log: dict[int, list[Entry]] = {}
        #: entries a majority of servers held at some point
        self.committed: set[Entry] = set()

    # -- what servers know of each other --------------------------------------------------

    def acting(self, spid: str) -> bool:
        """The lease, abstracted: a majority backs it in the term it claims."""
        term = self.servers[spid].term
        if term.backs != spid:
            return False
        return sum(s.term == term for s in self.servers.values()) >= MAJORITY

    @rule(a=st.sampled_from(SERVERS), b=st.sampled_from(SERVERS))
    def hear(self, a: str, b: str) -> None:
        if a != b:
            other = self.servers[b]
            self.heard[(a, b)] = Heard(other.term, other.place(), self.acting(b))

    # -- the election -------------------------------------------------------------------------

    @rule(x=st.sampled_from(SERVERS))
    def claim(self, x: str) -> None:
        """Elected in its own view (any view: safety must not rest on it)."""
        me = self.servers[x]
        heard = [self.heard.get((x, o), Heard()).term for o in SERVERS if o != x]
        me.term = terms.claim(me.term, x, heard, floor=me.place()[0])

    @rule(f=st.sampled_from(SERVERS), x=st.sampled_from(SERVERS))
    def back(self, f: str, x: str) -> None:
        """``f`` votes for ``x`` if it ranks first by what ``f`` heard of it (or it is the
        sitting root, not of an earlier term), and backs it in the term it claims."""
        if f == x or (f, x) not in self.heard:
            return
        follower, seen = self.servers[f], self.heard[(f, x)]
        sitting = seen.acting and seen.term.number >= follower.term.number
        if not sitting and seen.place < follower.place():
            return
        claimed = seen.term.number if seen.term.backs == x else None
        follower.term = terms.adopt(follower.term, x, claimed)

    @rule(x=st.sampled_from(SERVERS), voters=st.sets(st.sampled_from(SERVERS)))
    def canvass(self, x: str, voters: set[str]) -> None:
        """``x`` claims a term and some servers hear it at once and vote (the common
        case, which single steps reach too rarely)."""
        self.claim(x)
        for f in sorted(voters):
            self.hear(f, x)
            self.back(f, x)

    @rule(x=st.sampled_from(SERVERS), followers=st.sets(st.sampled_from(SERVERS)))
    def replicate(self, x: str, followers: set[str]) -> None:
        """Some followers of an acting ``x`` take what it has (sync, or its entries)."""
        root = self.servers[x]
        for f in sorted(followers):
            if self.servers[f].log_term == root.term.number:
                for _ in range(len(root.log)):
                    self.apply(f, root.term.number)
            else:
                self.sync(f, x)

    @rule(
        x=st.sampled_from(SERVERS),
        entries=st.integers(min_value=1, max_value=3),
        followers=st.sets(st.sampled_from(SERVERS)),
    )
    def tenure(self, x: str, entries: int, followers: set[str]) -> None:
        """``x`` acts, orders some entries, and some followers take them."""
        self.act(x)
        for _ in range(entries):
            self.order(x)
        self.replicate(x, followers)

    @rule(x=st.sampled_from(SERVERS))
    def act(self, x: str) -> None:
        if not self.acting(x):
            return
        root = self.servers[x]
        number = root.term.number
        assert self.actor.setdefault(number, x) == x, f"two roots in term {number}"
        missing = self.committed - set(root.log)
        assert not missing, f"{x} acts in term {number} without committed {sorted(missing)}"
        if number in self.root_log:
            assert root.log == self.root_log[number], "a root's log changed within its term"
        root.log_term = number
        self.root_log[number] = list(root.log)

    @rule(x=st.sampled_from(SERVERS))
    def order(self, x: str) -> None:
        root = self.servers[x]
        if not self.acting(x) or self.actor.get(root.term.number) != x:
            return
        if root.log_term != root.term.number:
            return
        entry = (root.term.number, len(root.log) + 1)
        root.log.append(entry)
        self.root_log[root.term.number].append(entry)
        self._commit()

    # -- followers ---------------------------------------------------------------------------

    @rule(f=st.sampled_from(SERVERS), x=st.sampled_from(SERVERS))
    def sync(self, f: str, x: str) -> None:
        """``f`` takes the log of root ``x`` (acting now, in a term not below its own)."""
        follower, root = self.servers[f], self.servers[x]
        if f == x or not self.acting(x) or root.log_term != root.term.number:
            return
        if root.term.number < follower.term.number:
            return
        follower.log, follower.log_term = list(root.log), root.term.number
        self._commit()

    @rule(f=st.sampled_from(SERVERS), number=st.integers(min_value=1, max_value=12))
    def apply(self, f: str, number: int) -> None:
        """The next entry of term ``number``'s root arrives, however late: ``f`` takes
        it if it synced in that term and does not back a later one."""
        follower = self.servers[f]
        log = self.root_log.get(number)
        if log is None or follower.log_term != number or follower.term.number > number:
            return
        if len(follower.log) < len(log):
            follower.log.append(log[len(follower.log)])
            self._commit()

    def _commit(self) -> None:
        held: dict[Entry, int] = {}
        for server in self.servers.values():
            for entry in server.log:
                held[entry] = held.get(entry, 0) + 1
        self.committed |= {entry for entry, count in held.items() if count >= MAJORITY}

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def never_two_acting(self) -> None:
        acting = [spid for spid in SERVERS if self.acting(spid)]
        assert len(acting) <= 1, acting

    @invariant()
    def logs_of_one_term_agree(self) -> None:
        by_term: dict[int, list[list[Entry]]] = {}
        for server in self.servers.values():
            if server.log_term is not None:
                by_term.setdefault(server.log_term, []).append(server.log)
        for logs in by_term.values():
            for a in logs:
                for b in logs:
                    n = min(len(a), len(b))
                    assert a[:n] == b[:n]


Terms.TestCase.settings = settings(
    max_examples=examples(1500, fast=100), stateful_step_count=60, deadline=None
)
test_terms_state_machine = Terms.TestCase
