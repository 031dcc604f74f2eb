"""The hypothesis scenario of the election properties (tests/unit/test_election_*.py):
the root ``r0`` died; each follower holds some prefix of what it ordered (its data
stream, its state log), survivors saw each other's place at some earlier time or not
at all, and the votes they hold of each other may come from an earlier view. Which
place a ``Member`` carries (``copy`` or ``state``) is the property's business
(``Places``); who the election makes root from such views is :func:`elected`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from brokerd.cluster.election import Member, View, choose, decide

ROOT = "r0"

#: the ``Member`` fields that carry a place: ``(who, place)`` -> fields, where ``place``
#: is exact for the viewer itself, as last seen (None: never) for another
Places = Callable[[str, int | None, bool], dict[str, Any]]


@dataclass(frozen=True)
class Survivors:
    known: int
    #: each follower's place when the root died
    final: dict[str, int]
    alive: list[str]
    #: (viewer, other) -> the place ``viewer`` last saw ``other`` at, or None
    seen: dict[tuple[str, str], int | None]
    start: dict[str, float]
    #: (holder, voter) -> the vote ``holder`` holds of ``voter`` comes from an earlier view
    stale: dict[tuple[str, str], bool]


@st.composite
def survivors(draw: st.DrawFn, *, places: int) -> Survivors:
    """2 to 6 known primaries; each follower's place is at most ``places``."""
    known = draw(st.integers(min_value=2, max_value=6))
    top = draw(st.integers(min_value=0, max_value=places))
    followers = [f"s{i}" for i in range(1, known)]
    final = {spid: draw(st.integers(min_value=0, max_value=top)) for spid in followers}
    alive = [spid for spid in followers if draw(st.booleans())]
    seen = {
        (v, o): draw(st.one_of(st.none(), st.integers(min_value=0, max_value=final[o])))
        for v in alive
        for o in alive
        if v != o
    }
    start = {spid: draw(st.floats(min_value=0, max_value=10)) for spid in followers}
    stale = {(v, o): draw(st.booleans()) for v in alive for o in alive if v != o}
    return Survivors(known, final, alive, seen, start, stale)


def view(
    s: Survivors, viewer: str, votes: dict[str, str | None], places: Places, *, early: bool
) -> View:
    """``viewer``'s view: its own place exactly, the others' as last seen (``early``:
    an earlier view, where nothing of the others had been seen yet)."""
    me = Member(
        viewer,
        start_time=s.start[viewer],
        vote=votes.get(viewer),
        **places(viewer, s.final[viewer], True),
    )
    peers = tuple(
        Member(
            other,
            start_time=s.start[other],
            vote=votes.get(other),
            **places(other, None if early else s.seen[(viewer, other)], False),
        )
        for other in s.alive
        if other != viewer
    )
    return View(me, peers, s.known, current_root=None, last_root=ROOT)


def elected(s: Survivors, places: Places) -> list[str]:
    """The survivors the election makes root, each voting on its own latest view while
    the votes it holds of the others come from their latest or an earlier one."""
    latest = {v: choose(view(s, v, {}, places, early=False)) for v in s.alive}
    earlier = {v: choose(view(s, v, {}, places, early=True)) for v in s.alive}
    roots = []
    for w in s.alive:
        votes = {o: (earlier[o] if s.stale[(w, o)] else latest[o]) for o in s.alive if o != w}
        if decide(view(s, w, votes, places, early=False)).is_root:
            roots.append(w)
    return roots


def majority_floor(positions: list[int], known: int) -> int:
    """The highest place the root and ``known // 2`` followers hold: what a majority of
    the known primaries held (``Stream``'s quorum floor for copies)."""
    need = min(known // 2, len(positions))
    if need == 0:
        return max(positions, default=0)
    return sorted(positions, reverse=True)[need - 1]
