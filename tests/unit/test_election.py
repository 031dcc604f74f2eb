"""The election is a pure function; these properties must hold over any views."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.election import PRIMARY, SECONDARY, Member, View, choose, decide
from tests.support.examples import examples


def _member(spid: str, **kw: object) -> Member:
    return Member(spid=spid, start_time=float(int(spid[1:])), checksum="c", **kw)  # type: ignore[arg-type]


def test_most_senior_primary_is_chosen_and_becomes_root_with_unanimity() -> None:
    a, b, c = _member("s1"), _member("s2"), _member("s3")
    view = View(me=a, peers=(_member("s2", vote="s1"), _member("s3", vote="s1")), known_primaries=3)
    assert choose(view) == "s1"
    assert decide(view).is_root
    # one dissenting vote blocks it
    view = View(me=a, peers=(_member("s2", vote="s1"), _member("s3", vote="s3")), known_primaries=3)
    assert not decide(view).is_root
    assert b.spid != c.spid


def test_among_tied_copies_the_latest_root_is_chosen_before_the_eldest() -> None:
    """A root that released for a moment (its lease lapsed under load) while an elder
    that had been SIGSTOPped rejoins: nobody recognises a root, the copies tie, and
    the elder used to win on seniority (CI: "the resumed old root must not take root
    back"). The latest claimed term wins; a member backing another claims nothing."""
    elder = _member("s1", term=4, term_for="s2")  # resumed, it backs the new root now
    latest = _member("s2", term=5, term_for="s2")
    other = _member("s3", term=5, term_for="s2")
    view = View(me=other, peers=(elder, latest), known_primaries=3)
    assert choose(view) == "s2"
    stale = _member("s1", term=4, term_for="s1")  # its status still claims its old term
    assert choose(View(me=other, peers=(stale, latest), known_primaries=3)) == "s2"
    # nobody claims a term: seniority decides, as before
    plain = View(me=_member("s3"), peers=(_member("s1"), _member("s2")), known_primaries=3)
    assert choose(plain) == "s1"


def test_quorum_requires_more_than_half_of_known_primaries() -> None:
    me = _member("s1")
    two_of_four = View(me=me, peers=(_member("s2", vote="s1"),), known_primaries=4)
    assert not decide(two_of_four).is_root
    assert "no quorum" in decide(two_of_four).reason
    two_of_three = View(me=me, peers=(_member("s2", vote="s1"),), known_primaries=3)
    assert decide(two_of_three).is_root


def test_secondaries_never_vote_themselves_root_nor_count_for_quorum() -> None:
    sec = _member("s0", type=SECONDARY)
    view = View(me=sec, peers=(_member("s1", vote="s1"),), known_primaries=1)
    assert choose(view) == "s1"
    assert not decide(view).is_root
    primary = View(me=_member("s5"), peers=(_member("s0", type=SECONDARY),), known_primaries=3)
    assert not decide(primary).quorum


def test_disabled_root_hands_over_and_enabling_does_not_steal() -> None:
    peers = (_member("s2", vote="s2"), _member("s3", vote="s2"))
    disabled = View(me=_member("s1", root_enabled=False), peers=peers, known_primaries=3)
    assert choose(disabled) == "s2"
    # s1 is enabled again while s2 is the sitting root: everyone keeps s2
    enabled = View(me=_member("s1"), peers=peers, known_primaries=3, current_root="s2")
    assert choose(enabled) == "s2"
    assert not decide(enabled).is_root


def test_a_primary_whose_copy_is_whole_is_preferred_to_a_more_senior_one_syncing() -> None:
    # s1 is the eldest but still takes its snapshot: it would start from part of the queues
    me = _member("s1", syncing=True)
    peers = (_member("s2"), _member("s3", syncing=True))
    assert choose(View(me=me, peers=peers, known_primaries=3)) == "s2"
    # only syncing ones left: seniority decides, as without replication
    alone = View(me=me, peers=(_member("s3", syncing=True),), known_primaries=3)
    assert choose(alone) == "s1"
    # a sitting root stays root while it takes a snapshot of nothing (it is the master)
    sitting = View(me=me, peers=peers, known_primaries=3, current_root="s3")
    assert choose(sitting) == "s3"


def test_a_joining_primary_is_never_root_before_it_is_admitted_and_has_caught_up() -> None:
    """Issue 43: a primary that asked to join is unlisted until the root admits it: no
    candidate, no vote counted, never root, even alone with the oldest start; once
    admitted, it ranks after every member whose copy is whole while it syncs."""
    joiner = _member("s0", listed=False)  # the eldest start time of all
    peers = (_member("s1", vote="s1"), _member("s2", vote="s1"))
    view = View(me=joiner, peers=peers, known_primaries=2)
    assert choose(view) == "s1" and not decide(view).is_root
    assert "not in known_hosts" in decide(view).reason
    admitted = _member("s0", syncing=True, vote="s0")
    view = View(me=admitted, peers=(_member("s2", vote="s2"),), known_primaries=3)
    assert choose(view) == "s2", "a member whose copy is whole first"


def test_after_a_whole_cluster_restart_a_server_that_recovered_state_is_preferred() -> None:
    """No copy follows a live stream after a whole-cluster restart, so seniority
    decided, and a server whose disk was lost, started first, became root with an
    empty state log: the others, syncing from it, dropped every queue (100 of 100
    confirmed messages lost in ``test_cluster_failover.py``). One that recovered
    the cluster's wiring now wins over it; among those, seniority decides."""
    after_restart = {"syncing": True}
    wiped = _member("s1", **after_restart)
    peers = (_member("s2", holds_state=True, **after_restart), _member("s3", **after_restart))
    assert choose(View(me=wiped, peers=peers, known_primaries=3)) == "s2"
    both = (_member("s2", holds_state=True, **after_restart), _member("s3", holds_state=True))
    assert choose(View(me=wiped, peers=both, known_primaries=3)) == "s3"  # whole first
    held = (_member("s2", holds_state=True, **after_restart),)
    me = _member("s1", holds_state=True, **after_restart)
    assert choose(View(me=me, peers=held, known_primaries=3)) == "s1"  # the eldest
    # a copy that follows the last root still ranks first: state from disk is older
    ranked = View(
        me=_member("s1", holds_state=True, copy=("r", 5)),
        peers=(_member("s2", copy=("r", 9)),),
        known_primaries=3,
        last_root="r",
    )
    assert choose(ranked) == "s2"
    # copies that tie: seniority, as before (state from disk is for the restart only)
    tied = View(
        me=_member("s1", copy=("r", 9)),
        peers=(_member("s2", holds_state=True, copy=("r", 9)),),
        known_primaries=3,
        last_root="r",
    )
    assert choose(tied) == "s1"


def test_a_primary_missing_from_known_hosts_never_counts() -> None:
    stray = _member("s0", listed=False, vote="s0")
    view = View(me=stray, peers=(_member("s1", vote="s1"),), known_primaries=1)
    assert choose(view) == "s1"
    assert not decide(view).is_root


def test_abstaining_peers_count_for_neither_quorum_nor_unanimity() -> None:
    me = _member("s2")
    returning = _member("s1", vote=None)  # back from a stall, not voting yet
    view = View(
        me=me, peers=(returning, _member("s3", vote="s2")), known_primaries=3, current_root="s2"
    )
    assert decide(view).is_root  # s2 + s3 are a quorum; s1's silence does not dissent
    alone = View(me=me, peers=(returning,), known_primaries=3, current_root="s2")
    assert not decide(alone).quorum


def test_mismatched_checksum_is_not_a_candidate() -> None:
    odd = Member(spid="s1", start_time=1.0, checksum="other", vote="s1")
    view = View(me=_member("s2"), peers=(odd,), known_primaries=2)
    assert choose(view) == "s2"


@st.composite
def worlds(draw: st.DrawFn) -> list[View]:
    """N servers, each with its own (possibly asymmetric) view; votes are current."""
    n = draw(st.integers(min_value=1, max_value=7))
    spids = [f"s{i}" for i in range(n)]
    types = [draw(st.sampled_from([PRIMARY, PRIMARY, SECONDARY])) for _ in spids]
    listed = [(t == PRIMARY and draw(st.booleans())) or draw(st.booleans()) for t in types]
    # known_hosts lists every listed primary (and maybe hosts that never started)
    known = max(1, sum(t == PRIMARY and ok for t, ok in zip(types, listed, strict=True)))
    known += draw(st.integers(min_value=0, max_value=2))
    enabled = [draw(st.booleans()) or draw(st.booleans()) for _ in spids]
    hears = {(i, j): draw(st.booleans()) for i in range(n) for j in range(n) if i != j}
    sticky = [draw(st.sampled_from([None, *spids])) for _ in spids]
    # some servers abstain (starting up, or rejoining after a stall)
    abstains = [draw(st.integers(0, 4)) == 0 for _ in spids]

    def base(j: int, active: bool, vote: str | None) -> Member:
        return Member(
            spid=spids[j],
            type=types[j],
            start_time=float(j),
            root_enabled=enabled[j],
            checksum="c",
            active=active,
            vote=vote,
            listed=listed[j],
        )

    # first round: every server's vote is a function of its own view only
    votes = []
    for i in range(n):
        peers = tuple(base(j, hears[(i, j)], None) for j in range(n) if j != i)
        vote = choose(View(base(i, True, None), peers, known, sticky[i]))
        votes.append(None if abstains[i] else vote)
    views = []
    for i in range(n):
        peers = tuple(base(j, hears[(i, j)], votes[j]) for j in range(n) if j != i)
        views.append(View(base(i, True, votes[i]), peers, known, sticky[i]))
    return views


@settings(max_examples=examples(800), deadline=None)
@given(worlds())
def test_never_two_roots(views: list[View]) -> None:
    # an abstaining server does not claim root (the controller withholds its vote)
    roots = [v.me.spid for v in views if v.me.vote is not None and decide(v).is_root]
    assert len(roots) <= 1, roots


@settings(max_examples=examples(300), deadline=None)
@given(worlds())
def test_a_root_is_always_an_enabled_primary_with_quorum(views: list[View]) -> None:
    for view in views:
        decision = decide(view)
        if decision.is_root:
            me = view.me
            assert me.type == PRIMARY and me.listed and me.root_enabled and decision.quorum
