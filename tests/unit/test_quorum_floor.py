"""The quorum floor (``brokerd.cluster.queues.replication.quorum``): which events of
an owner's stream are confirmed, as hypothesis properties over any replica set."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.queues.replication.quorum import Place, floor, needed
from tests.support.examples import examples


@st.composite
def places(draw: st.DrawFn) -> Place:
    joined = draw(st.integers(min_value=0, max_value=100))
    acked = draw(st.integers(min_value=joined, max_value=120))
    synced = draw(st.booleans())
    whole = synced and draw(st.booleans())
    return Place(acked, joined, synced, whole)


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[Place], int, int, int]:
    replicas = draw(st.lists(places(), max_size=6))
    need = needed(draw(st.integers(min_value=2, max_value=7)))  # 1: no replica needed
    top = max([120, *(p.acked for p in replicas)])
    previous = draw(st.integers(min_value=0, max_value=top))
    return replicas, need, top, previous


def counted(replicas: list[Place], previous: int) -> list[Place]:
    """The replicas the floor may count (the module docstring's rules)."""
    if any(p.synced for p in replicas):
        return [p for p in replicas if p.whole]
    return [p for p in replicas if p.joined <= previous]


@given(scenes())
@settings(max_examples=examples(2000, fast=200), deadline=None)
def test_a_new_floor_is_held_by_enough_counted_replicas(scene: tuple) -> None:
    """Safety: an event past the previous floor is confirmed only when ``need``
    replicas that count hold it."""
    replicas, need, top, previous = scene
    result = floor(replicas, need, top, previous, fenced=False)
    if result != previous:
        holders = [p for p in counted(replicas, previous) if p.acked >= result]
        assert len(holders) >= need, (result, holders, need)


@given(scenes())
@settings(max_examples=examples(2000, fast=200), deadline=None)
def test_the_floor_is_the_highest_event_enough_replicas_hold(scene: tuple) -> None:
    """Liveness: it is not lower than it may be; with too few counted replicas it
    stays where it was."""
    replicas, need, top, previous = scene
    result = floor(replicas, need, top, previous, fenced=False)
    acks = sorted((p.acked for p in counted(replicas, previous)), reverse=True)
    assert result == (acks[need - 1] if len(acks) >= need else previous)


@given(scenes(), st.integers(min_value=0, max_value=5), st.integers(min_value=1, max_value=50))
@settings(max_examples=examples(2000, fast=200), deadline=None)
def test_a_further_ack_never_lowers_the_floor(scene: tuple, which: int, more: int) -> None:
    replicas, need, top, previous = scene
    if not replicas:
        return
    index = which % len(replicas)
    before = floor(replicas, need, top, previous, fenced=False)
    ahead = list(replicas)
    ahead[index] = dataclasses.replace(ahead[index], acked=ahead[index].acked + more)
    assert floor(ahead, need, top + more, previous, fenced=False) >= before


@given(scenes(), st.integers(min_value=0, max_value=5), st.integers(min_value=0, max_value=200))
@settings(max_examples=examples(2000, fast=200), deadline=None)
def test_once_a_snapshot_is_out_a_syncing_replica_counts_for_nothing(
    scene: tuple, which: int, acked: int
) -> None:
    """A replica still taking its snapshot holds what came after its join only: once
    any snapshot was sent, its acks cannot confirm (a failover prefers whole copies)."""
    replicas, need, top, previous = scene
    if not any(p.synced for p in replicas):
        return
    index = which % len(replicas)
    if replicas[index].whole:
        return
    changed = list(replicas)
    changed[index] = dataclasses.replace(changed[index], acked=max(acked, changed[index].joined))
    assert floor(changed, need, top + acked, previous, fenced=False) == floor(
        replicas, need, top, previous, fenced=False
    )


@given(scenes())
@settings(max_examples=examples(500), deadline=None)
def test_a_fenced_stream_confirms_nothing_more_and_no_quorum_needed_confirms_all(
    scene: tuple,
) -> None:
    replicas, need, top, previous = scene
    assert floor(replicas, need, top, previous, fenced=True) == previous
    # an owner alone (one known primary, a group of one) confirms at once, fenced or not
    assert floor(replicas, needed(1), top, previous, fenced=False) == top


def test_needed_is_half_the_members_rounded_down() -> None:
    """With the owner, half the members (rounded down) make a majority."""
    assert [needed(n) for n in range(1, 8)] == [0, 1, 1, 2, 2, 3, 3]
