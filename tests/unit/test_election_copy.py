"""The election picks a copy that holds every confirmed message (hypothesis).

A confirm needs the master and ``known // 2`` replicas (``Stream.needed``,
a majority of the known primaries with the master). After the root dies,
each surviving primary votes on its own view: its own copy's place exactly,
the others' as their last statuses said (never ahead of them: a copy only
grows, and once the root is gone it grows no more). Whatever the staleness
of each view and of each vote another server holds, a server that the
election makes root holds every confirmed event.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.election import Member, View, choose, decide
from tests.support.elections import ROOT, Survivors, elected, majority_floor, survivors
from tests.support.examples import examples


def _copies(who: str, place: int | None, own: bool) -> dict:
    """A member's copy of the dead root's stream at ``place`` (None: never seen)."""
    return {"copy": None if place is None else (ROOT, place)}


@given(survivors(places=50))
@settings(max_examples=examples(3000, fast=300), deadline=None)
def test_a_root_elected_after_the_old_one_died_holds_every_confirmed_event(
    s: Survivors,
) -> None:
    confirmed = majority_floor(list(s.final.values()), s.known)
    for w in elected(s, _copies):
        assert s.final[w] >= confirmed, (w, s.final, confirmed)


def test_the_furthest_copy_of_the_last_roots_stream_wins_over_seniority() -> None:
    elder = Member("s1", start_time=1.0, copy=(ROOT, 90))
    younger = Member("s2", start_time=2.0, copy=(ROOT, 120))
    other_stream = Member("s3", start_time=0.5, copy=("old-root", 500))
    view = View(elder, (younger, other_stream), 3, current_root=None, last_root=ROOT)
    assert choose(view) == "s2"
    # a whole copy still comes before one taking a snapshot
    syncing = Member("s2", start_time=2.0, copy=(ROOT, 120), syncing=True)
    assert choose(View(elder, (syncing,), 3, last_root=ROOT)) == "s1"
    # the sitting root stays the choice, whatever its copy
    assert choose(View(elder, (younger,), 3, current_root="s1", last_root=ROOT)) == "s1"


def _floor_with_snapshots(copies: dict[str, tuple[bool, int, bool]], known: int) -> int:
    """The quorum floor of ``Stream._quorum_floor`` over replicas that are whole
    or still taking a snapshot: ``copies[spid] = (whole, acked, snapshot_sent)``.
    Once any snapshot has been sent only whole replicas count; before (right after a
    root change) every one counts by its live stream."""
    need = min(known // 2, len(copies))
    if need == 0:
        return max((acked for _w, acked, _s in copies.values()), default=0)
    if any(whole or sent for whole, _a, sent in copies.values()):
        counted = [acked for whole, acked, _s in copies.values() if whole]
    else:
        counted = [acked for _w, acked, _s in copies.values()]
    counted.sort(reverse=True)
    return counted[need - 1] if len(counted) >= need else 0


@st.composite
def snapshot_scenarios(draw: st.DrawFn) -> dict:
    """One failure, the root's, while some replicas may be taking a snapshot (joined
    after a restart or a gap): a whole copy holds every event up to its place, a
    syncing one only those after its join. The cluster had resynced since the last
    failure (at least ``need`` replicas are whole); views of the others' places may
    be stale."""
    known = draw(st.integers(min_value=2, max_value=6))
    events = draw(st.integers(min_value=1, max_value=50))
    replicas = [f"s{i}" for i in range(1, known)]
    need = min(known // 2, len(replicas))
    whole = {spid: draw(st.booleans()) for spid in replicas}
    for spid in replicas[:need]:  # the cluster resynced after the last failure
        whole[spid] = True
    final = {spid: draw(st.integers(min_value=0, max_value=events)) for spid in replicas}
    join = {
        spid: 0 if whole[spid] else draw(st.integers(min_value=0, max_value=final[spid]))
        for spid in replicas
    }
    sent = {spid: whole[spid] or draw(st.booleans()) for spid in replicas}
    seen = {
        (v, o): draw(st.one_of(st.none(), st.integers(min_value=0, max_value=final[o])))
        for v in replicas
        for o in replicas
        if v != o
    }
    start = {spid: draw(st.floats(min_value=0, max_value=10)) for spid in replicas}
    return {
        "known": known,
        "whole": whole,
        "final": final,
        "join": join,
        "sent": sent,
        "seen": seen,
        "start": start,
    }


@given(snapshot_scenarios())
@settings(max_examples=examples(1000, fast=100), deadline=None)
def test_a_syncing_replica_never_confirms_what_the_elected_whole_copy_lacks(s: dict) -> None:
    """With the floor counting whole replicas only once a snapshot is out, the root
    elected after a single failure holds every confirmed event, syncing replicas
    or not (``test_replication.test_a_syncing_replica_does_not_confirm_...``)."""
    copies = {r: (s["whole"][r], s["final"][r], s["sent"][r]) for r in s["final"]}
    confirmed = _floor_with_snapshots(copies, s["known"])
    alive = list(s["final"])

    def view(viewer: str, votes: dict[str, str | None]) -> View:
        me = Member(
            viewer,
            start_time=s["start"][viewer],
            vote=votes.get(viewer),
            copy=(ROOT, s["final"][viewer]),
            syncing=not s["whole"][viewer],
        )
        peers = tuple(
            Member(
                o,
                start_time=s["start"][o],
                vote=votes.get(o),
                copy=None if s["seen"][(viewer, o)] is None else (ROOT, s["seen"][(viewer, o)]),
                syncing=not s["whole"][o],
            )
            for o in alive
            if o != viewer
        )
        return View(me, peers, s["known"], current_root=None, last_root=ROOT)

    votes = {v: choose(view(v, {})) for v in alive}
    for w in alive:
        if decide(view(w, votes)).is_root:
            assert s["whole"][w], (w, s)
            assert s["final"][w] >= confirmed, (w, s["final"], confirmed)
