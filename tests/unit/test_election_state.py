"""The election picks a root that holds the last root's state log (hypothesis).

A new root's state log becomes every server's: the others sync from it and drop
what it lacks. So the root must not be one that missed entries the last root
ordered. Seed 94 of the fault harness: a primary was cut off while the root
fenced it and failed its queues over to another; the root then died, and the cut
primary, whose copy of the root's stream ranked best, was elected with a log
six entries long where the others had ten. The failover was undone while the new
owner was already confirming publishes: two owners, confirmed messages lost.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.election import Member, View, choose, state_rank
from tests.support.elections import ROOT, Survivors, elected, majority_floor, survivors
from tests.support.examples import examples


def test_the_seed_94_cut_primary_does_not_win_on_its_copy() -> None:
    cut = Member("cab7d", start_time=1.0, copy=(ROOT, 120), state=(ROOT, 6))
    owner = Member("c9b39", start_time=2.0, copy=(ROOT, 90), state=(ROOT, 10))
    for me, peer in ((cut, owner), (owner, cut)):
        assert choose(View(me, (peer,), 3, current_root=None, last_root=ROOT)) == "c9b39"


def test_logs_rank_by_their_roots_term_then_their_place() -> None:
    # a longer log of an earlier root's term ranks below a shorter one of a later term
    other_log = Member("s1", start_time=0.5, state=("old-root", 500), state_term=1)
    unsynced = Member("s2", start_time=1.0, state=None)
    behind = Member("s3", start_time=3.0, state=(ROOT, 4), state_term=2)
    assert state_rank(unsynced) < state_rank(other_log) < state_rank(behind)
    assert choose(View(other_log, (unsynced, behind), 3)) == "s3"
    # whatever root each server remembers last
    for last in (None, "old-root", ROOT):
        assert choose(View(unsynced, (other_log, behind), 3, last_root=last)) == "s3"
    # the sitting root stays the choice, whatever its log
    assert choose(View(other_log, (behind,), 3, current_root="s1", last_root=ROOT)) == "s1"
    # after a whole-cluster restart nobody follows a root: the log decides nothing
    fresh = [Member(f"s{i}", start_time=float(i)) for i in range(3)]
    assert choose(View(fresh[1], (fresh[0], fresh[2]), 3)) == "s0"


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Survivors, dict[str, int]]:
    """The root ordered up to 30 entries; each follower applied a prefix, and an entry
    counts as the cluster's once a majority of the known primaries holds it (the root
    among them). Each follower's copy of the data stream is anywhere: it must not
    matter."""
    s = draw(survivors(places=30))
    copies = {spid: draw(st.integers(min_value=0, max_value=100)) for spid in s.final}
    return s, copies


@given(scenarios())
@settings(max_examples=examples(3000, fast=300), deadline=None)
def test_a_root_elected_after_the_old_one_died_holds_every_entry_a_majority_held(
    scenario: tuple[Survivors, dict[str, int]],
) -> None:
    s, copies = scenario

    def logs(who: str, place: int | None, own: bool) -> dict:
        return {
            "copy": (ROOT, copies[who]),
            "state": None if place is None else (ROOT, place),
        }

    committed = majority_floor(list(s.final.values()), s.known)
    for w in elected(s, logs):
        assert s.final[w] >= committed, (w, s.final, committed)


def test_a_restarted_server_votes_for_the_peer_holding_the_live_log() -> None:
    """CI found the split vote: after the root and one primary were killed, the
    root came back (no root followed yet, its disk's wiring recovered) and voted
    for itself on ``holds_state``, while the surviving primary voted for itself on
    its log of the dead root's entries. Neither ever had every vote. Logs rank by
    their terms, alike everywhere."""
    back = Member("s0", start_time=5.0, syncing=True, holds_state=True, state=None)
    survivor = Member(
        "s2", start_time=2.0, syncing=True, holds_state=False, state=(ROOT, 7), state_term=2
    )
    assert choose(View(back, (survivor,), 3, last_root=None)) == "s2"
    assert choose(View(survivor, (back,), 3, last_root=ROOT)) == "s2"
    # two peers on two roots' logs: the later root's term ranks first
    other = Member("s3", start_time=1.0, state=("older-root", 9), state_term=1)
    assert choose(View(back, (survivor, other), 4, last_root=None)) == "s2"
