"""A livelock the network fault run found (issue 41; tests/faults --netbed, seed 3).

A partition into halves cost root n0 its lease; n1 took root for half a second
and released it (waiting for n2's vote); a stale status of n0's, still saying
root, made n1 recognise n0 again; then n1 was unplugged for a second. Healed,
n0's last root was n1 and n1's last root was n0. Each ranks the candidates by
its own last root's state log, so n0 votes for n1 and n1 for n0, every
heartbeat, with no root for as long as nothing else changes (80 s in that run,
until the next fault).

The ranking needs an order of roots every server agrees on (a root epoch, as
Raft's term orders its leaders) rather than each server's own last root; until
then this test is expected to fail.
"""

from __future__ import annotations

import pytest

from brokerd.cluster.election import Member, View, choose

N0, N1, N2 = "s0", "s1", "s2"


def _member(spid: str, state: tuple[str, int]) -> Member:
    return Member(spid=spid, start_time=float(spid[1:]), vote=None, state=state, holds_state=True)


def _view(me: str, last_root: str) -> View:
    # n0 was root up to seq 100; n1 took over at 100 and ordered one more; n2 follows n1
    states = {N0: (N0, 100), N1: (N1, 101), N2: (N1, 101)}
    members = {spid: _member(spid, state) for spid, state in states.items()}
    peers = tuple(m for spid, m in members.items() if spid != me)
    return View(me=members[me], peers=peers, known_primaries=3, last_root=last_root)


@pytest.mark.xfail(strict=True, reason="known livelock: servers rank by their own last root")
def test_servers_with_different_last_roots_agree_on_a_candidate() -> None:
    choices = {
        N0: choose(_view(N0, last_root=N1)),
        N1: choose(_view(N1, last_root=N0)),
        N2: choose(_view(N2, last_root=N1)),
    }
    assert len(set(choices.values())) == 1, choices
