"""The cluster's members as replicated state (``brokerd.cluster.knownhosts``).

Plain changes, their errors and the file first; then a hypothesis state machine
of joins, forgets, elections, gossip (statuses) and partitions over the real
``KnownHosts`` and ``committed``, checking that no interleaving gives two roots
acting at once and that no committed set is lost by a later root.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from brokerd.cluster import knownhosts
from brokerd.cluster.knownhosts import ANY_NODE, KnownHosts, MembershipError, committed
from tests.support.examples import examples

A, B, C, D, E = (f"h{i}:5672" for i in range(5))


def test_a_join_and_a_forget_each_make_one_new_version() -> None:
    first = KnownHosts.initial([C, A, B])
    assert first.key == (0, 0) and first.hosts == (A, B, C)
    grown = first.admitted(D, "n-d", term=3)
    assert grown.key == (1, 3) and grown.hosts == (A, B, C, D)
    assert grown.node_of(D) == "n-d" and grown.node_of(A) == ANY_NODE
    shrunk = grown.without(D, "", term=4)
    assert shrunk.key == (2, 4) and shrunk.hosts == (A, B, C)
    assert shrunk.forgotten == ((D, "n-d"),), "the node it joined with is remembered"
    assert shrunk.newer_than(grown) and grown.newer_than(first)


def test_changes_the_set_does_not_allow_are_refused_with_the_reason() -> None:
    known = KnownHosts.initial([A, B]).admitted(C, "n-c", 1).without(C, "", 1)
    with pytest.raises(MembershipError, match="member already"):
        known.admitted(A, "x", 1)
    with pytest.raises(MembershipError, match="forgotten"):
        known.admitted(E, "n-c", 1)  # the forgotten node, under another address
    with pytest.raises(MembershipError, match="not a member"):
        known.without(D, "", 1)
    with pytest.raises(MembershipError, match="last member"):
        KnownHosts.initial([A]).without(A, "", 1)
    with pytest.raises(MembershipError, match="address"):
        known.admitted("", "n", 1)
    # a new disk at the forgotten address is a new server
    assert C in known.admitted(C, "n-new", 2).hosts


def test_a_forgotten_server_is_known_by_its_node_or_by_its_claim_to_membership() -> None:
    known = KnownHosts.initial([A, B, C]).without(C, "", 1)  # its node was never known
    assert known.forgotten == ((C, ANY_NODE),)
    assert known.is_forgotten(C, "any", claims_membership=True)
    assert not known.is_forgotten(C, "fresh", claims_membership=False)
    by_node = KnownHosts.initial([A, B]).admitted(D, "n-d", 1).without(D, "", 1)
    assert by_node.is_forgotten("elsewhere:1", "n-d", claims_membership=False)
    assert not by_node.is_forgotten(D, "n-other", claims_membership=True)


hosts_st = st.lists(st.sampled_from([A, B, C, D, E]), min_size=1, unique=True)


@given(
    hosts=hosts_st,
    version=st.integers(0, 10**6),
    term=st.integers(0, 10**6),
    forgotten=st.lists(st.tuples(st.sampled_from([A, B, "x:1"]), st.text(max_size=8))),
)
def test_the_dict_form_reads_back_the_same(
    hosts: list[str], version: int, term: int, forgotten: list[tuple[str, str]]
) -> None:
    known = KnownHosts(version, term, tuple(sorted(hosts)), tuple(sorted(set(forgotten))))
    assert KnownHosts.from_dict(json.loads(json.dumps(known.to_dict()))) == known


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"version": "1", "hosts": [A]},
        {"version": True, "hosts": [A]},
        {"version": -1, "hosts": [A]},
        {"version": 2, "hosts": []},
        {"version": 1, "hosts": [A, 5]},
        {"version": 1, "hosts": [A], "forgotten": [[A]]},
        {"version": 1, "hosts": A},
    ],
)
def test_malformed_members_are_refused(bad: dict) -> None:
    with pytest.raises(MembershipError):
        KnownHosts.from_dict(bad)


def test_the_file_keeps_a_node_per_data_directory_and_the_last_set(tmp_path: Path) -> None:
    first = knownhosts.load(tmp_path)
    assert first.known is None and len(first.node) == 16
    assert knownhosts.load(tmp_path).node == first.node, "the node survives a restart"
    known = KnownHosts.initial([A, B]).admitted(C, "n", 2)
    knownhosts.save(tmp_path, knownhosts.with_known(first, known))
    again = knownhosts.load(tmp_path)
    assert again == knownhosts.Stored(first.node, known)
    assert knownhosts.load(tmp_path / "other").node != first.node


def test_a_damaged_file_stops_the_server_rather_than_guess(tmp_path: Path) -> None:
    (tmp_path / knownhosts.MEMBERS_FILE).write_text('{"node": "n", "known": {"hosts": 1}}')
    with pytest.raises(MembershipError, match="damaged"):
        knownhosts.load(tmp_path)
    (tmp_path / knownhosts.MEMBERS_FILE).write_text("not json")
    with pytest.raises(MembershipError, match="damaged"):
        knownhosts.load(tmp_path)


def test_committed_means_a_majority_of_the_current_set() -> None:
    assert committed([A, B, C], [A, B])
    assert not committed([A, B, C, D], [A, B])
    assert not committed([A, B, C], [A, D, E]), "only members count"


# -- single-server changes under elections, gossip and partitions ------------------------

UNIVERSE = [f"s{i}:5672" for i in range(6)]
FIRST = UNIVERSE[:3]


class Server:
    """A server as the model sees it: the set it holds, its term and whom it backs."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.known = KnownHosts.initial(FIRST)
        self.term = 0
        self.backs: str | None = None
        self.root_term: int | None = None  # the term it took root in (None: not root)


class SingleServerChanges(RuleBasedStateMachine):
    """Roots order changes only once a majority of the current set holds it (as
    ``MemberChanges.change`` does); every server takes a later set it hears of (as
    from statuses); a root acts while a majority of its own set backs it in its term
    (``election.holds_lease``). No interleaving may give two acting roots, and a set
    a majority held (committed) is never undone by a later root."""

    def __init__(self) -> None:
        super().__init__()
        self.servers = {a: Server(a) for a in UNIVERSE}
        self.groups: list[set[str]] = [set(UNIVERSE)]
        self.committed_keys: list[KnownHosts] = []

    def group_of(self, address: str) -> set[str]:
        return next(g for g in self.groups if address in g)

    def acting(self, root: Server) -> bool:
        if root.root_term is None or root.term != root.root_term:
            return False
        hosts = set(root.known.hosts)
        backing = {
            a
            for a in self.group_of(root.address) & hosts
            if self.servers[a].term == root.term and self.servers[a].backs == root.address
        }
        return committed(hosts, backing)

    def note_commits(self) -> None:
        """A set held by a majority of its own hosts is committed."""
        for server in self.servers.values():
            known = server.known
            holding = {a for a, s in self.servers.items() if s.known == known}
            if committed(known.hosts, holding) and known not in self.committed_keys:
                self.committed_keys.append(known)

    @rule(data=st.data())
    def partition(self, data: st.DataObject) -> None:
        cut = data.draw(st.lists(st.booleans(), min_size=len(UNIVERSE), max_size=len(UNIVERSE)))
        left = {a for a, side in zip(UNIVERSE, cut, strict=True) if side}
        self.groups = [g for g in (left, set(UNIVERSE) - left) if g]

    @rule()
    def heal(self) -> None:
        self.groups = [set(UNIVERSE)]

    @rule(a=st.sampled_from(UNIVERSE), b=st.sampled_from(UNIVERSE))
    def status(self, a: str, b: str) -> None:
        """``a`` hears ``b``'s status: it takes ``b``'s set if later. A root that set
        forgot is refused by ``a`` from then on (``Admission``): ``a`` backs it no more."""
        server = self.servers[a]
        if b in self.group_of(a) and self.servers[b].known.newer_than(server.known):
            server.known = self.servers[b].known
            if server.backs is not None and server.backs not in server.known.hosts:
                server.backs = None
        self.note_commits()

    @rule(candidate=st.sampled_from(UNIVERSE))
    def elect(self, candidate: str) -> None:
        """The candidate claims a term above any its side has; the members of its own
        set there back it unless they hold a later set (the election ranks state
        logs, where the sets are entries); it takes root if they are a majority of
        its set. Statuses (``status``) spread sets on their own schedule."""
        group = self.group_of(candidate)
        me = self.servers[candidate]
        if candidate not in me.known.hosts:
            return  # not a member: never a candidate
        term = max(self.servers[a].term for a in group) + 1
        backers = [
            a
            for a in group & set(me.known.hosts)
            if self.servers[a].term < term and not self.servers[a].known.newer_than(me.known)
        ]
        if not committed(me.known.hosts, backers):
            return
        for a in backers:
            self.servers[a].term, self.servers[a].backs = term, candidate
        for server in self.servers.values():
            if server.root_term is not None and server.term > server.root_term:
                server.root_term = None  # backs a later root: it released
        me.root_term = term
        self.note_commits()

    @precondition(lambda self: any(s.root_term is not None for s in self.servers.values()))
    @rule(data=st.data(), join=st.booleans())
    def change(self, data: st.DataObject, join: bool) -> None:
        """An acting root admits or forgets one server, if the current set is held by
        a majority (as the root judges from the statuses of its side)."""
        roots = [s for s in self.servers.values() if self.acting(s)]
        if not roots:
            return
        root = roots[0]
        holding = {a for a in self.group_of(root.address) if self.servers[a].known == root.known}
        if not committed(root.known.hosts, holding):
            return
        for known in self.committed_keys:  # a change on top of an older set undoes one
            assert not known.newer_than(root.known), (
                f"root {root.address} changes {root.known.key}, behind the committed {known.key}"
            )
        if join:
            outside = [a for a in UNIVERSE if a not in root.known.hosts]
            if not outside:
                return
            address = data.draw(st.sampled_from(outside))
            try:
                root.known = root.known.admitted(address, f"node-{address}", root.term)
            except MembershipError:
                return
        else:
            # only a server the root does not hear (stopped); never itself
            silent = [
                a
                for a in root.known.hosts
                if a not in self.group_of(root.address) and a != root.address
            ]
            if not silent:
                return
            root.known = root.known.without(data.draw(st.sampled_from(silent)), "", root.term)
        self.note_commits()

    @invariant()
    def never_two_acting_roots(self) -> None:
        acting = [s.address for s in self.servers.values() if self.acting(s)]
        assert len(acting) <= 1, f"two roots act at once: {acting}"

    @invariant()
    def committed_sets_never_diverge(self) -> None:
        """Two sets a majority held are one change after the other, never two of one
        version: a root that is behind takes the later set from the statuses before
        its gate lets it change anything (``change`` checks that too)."""
        by_version: dict[int, KnownHosts] = {}
        for known in self.committed_keys:
            other = by_version.setdefault(known.version, known)
            assert other.hosts == known.hosts, f"two sets of version {known.version} committed"


SingleServerChanges.TestCase.settings = settings(
    max_examples=examples(300, fast=60), stateful_step_count=40, deadline=None
)
test_single_server_changes = SingleServerChanges.TestCase
