"""A livelock the network fault run found (issue 41; tests/faults --netbed, seed 3).

A partition into halves cost root n0 its lease; n1 took root for half a second
and released it (waiting for n2's vote); a stale status of n0's, still saying
root, made n1 recognise n0 again; then n1 was unplugged for a second. Healed,
n0's last root was n1 and n1's last root was n0. Each ranked the candidates by
its own last root's state log, so n0 voted for n1 and n1 for n0, every
heartbeat, with no root for as long as nothing else changed (80 s in that run,
until the next fault).

Logs now rank by (the term of the root they follow, their place), which every
server computes alike (``brokerd/cluster/terms.py``); and a server that backed
n1's later term no longer recognises n0 from a stale status.
"""

from __future__ import annotations

from brokerd.cluster.election import Member, View, choose

N0, N1, N2 = "s0", "s1", "s2"


def _member(spid: str, state: tuple[str, int], term: int) -> Member:
    return Member(
        spid=spid,
        start_time=float(spid[1:]),
        vote=None,
        state=state,
        state_term=term,
        holds_state=True,
    )


def _view(me: str, last_root: str) -> View:
    # n0 was root up to seq 100 in term 4; n1 took over at 100 in term 5 and ordered
    # one more; n2 follows n1
    states = {N0: ((N0, 100), 4), N1: ((N1, 101), 5), N2: ((N1, 101), 5)}
    members = {spid: _member(spid, *place) for spid, place in states.items()}
    peers = tuple(m for spid, m in members.items() if spid != me)
    return View(me=members[me], peers=peers, known_primaries=3, last_root=last_root)


def test_servers_with_different_last_roots_agree_on_a_candidate() -> None:
    choices = {
        N0: choose(_view(N0, last_root=N1)),
        N1: choose(_view(N1, last_root=N0)),
        N2: choose(_view(N2, last_root=N1)),
    }
    assert set(choices.values()) == {N1}, choices
