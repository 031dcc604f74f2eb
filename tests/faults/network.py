"""The nemesis's network faults, on a real network (tests/support/netbed.py; issue 41).

Each server is in its own namespace; these faults drop packets silently, as a
switch or a cable does, and the broker is not told:

- ``isolate``: one server (the root, a queue's owner, a replica or the
  secondary) hears no other server and none hears it; its clients still reach it;
- ``cut-pair``: two servers do not hear each other, both still hear the rest
  (the "bridge" topology: the others see both sides);
- ``cut-one-way``: what one server sends to another is dropped, the other way
  not (it hears the other, the other does not hear it);
- ``split``: a minority (one primary, the secondary with it half the time) and
  the majority;
- ``halves``: the servers drawn into two random halves;
- ``unplug``: one server's interface down: its clients lose it too;
- ``slow-link``: every link into one primary passes through a proxy
  (tests/support/slowlink.py; it listens in that primary's namespace, so the
  cuts above drop what it carries too) that now delays each chunk (50-500 ms), caps the
  bandwidth (50-500 kB/s), or stalls outright: kernel buffers fill and the
  senders' writes back up while they believe they are sending.

Every fault is healed after its hold; the harness then waits for a settled root.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tests.support.netbed import NetBed
from tests.support.slowlink import SlowLink

ISOLATE = "isolate"
CUT_PAIR = "cut-pair"
CUT_ONE_WAY = "cut-one-way"
SPLIT = "split"
HALVES = "halves"
UNPLUG = "unplug"
SLOW_LINK = "slow-link"
NETWORK_KINDS = (ISOLATE, CUT_PAIR, CUT_ONE_WAY, SPLIT, HALVES, UNPLUG, SLOW_LINK)
#: what ``isolate`` aims at, drawn in turn
ISOLATE_TARGETS = ("root", "owner", "replica", "secondary")


def apply(
    bed: NetBed,
    kind: str,
    target: int,
    peer: int | None,
    slots: Sequence[int],
    primaries: Sequence[int],
    draw: float,
) -> str:
    """Cut the network for ``kind`` (nodes by index; ``slots[i]``: node i's namespace
    on the bed) and say what was cut."""

    def slot(index: int) -> int:
        return slots[index]

    if kind in (ISOLATE, UNPLUG):
        if kind == ISOLATE:
            bed.isolate(slot(target))
        else:
            bed.unplug(slot(target))
        return ""
    if kind in (CUT_PAIR, CUT_ONE_WAY):
        assert peer is not None
        if kind == CUT_PAIR:
            bed.cut_both(slot(target), slot(peer))
        else:
            bed.cut(slot(target), slot(peer))
        return ""
    everyone = list(range(len(slots)))
    if kind == SPLIT:
        minority = [target]
        secondaries = [i for i in everyone if i not in primaries]
        if secondaries and draw < 0.5:
            minority.append(secondaries[0])
        majority = [i for i in everyone if i not in minority]
        bed.partition([[slot(i) for i in minority], [slot(i) for i in majority]])
        return f"minority {sorted(minority)}"
    if kind == HALVES:
        rng = random.Random(draw)
        shuffled = everyone[:]
        rng.shuffle(shuffled)
        cut = max(1, len(shuffled) // 2)
        halves = [sorted(shuffled[:cut]), sorted(shuffled[cut:])]
        bed.partition([[slot(i) for i in half] for half in halves])
        return f"halves {halves[0]} | {halves[1]}"
    raise ValueError(f"not a network fault: {kind}")


def slow(link: SlowLink, draw: float) -> str:
    """Shape the links into one primary by the draw: a delay, a bandwidth cap or a
    stall; ``link.clear()`` undoes it."""
    if draw < 1 / 3:
        delay = 0.05 + 0.45 * (3 * draw)
        link.set(delay=delay)
        return f"delay {delay * 1000:.0f} ms"
    if draw < 2 / 3:
        rate = 50_000 + 450_000 * (3 * draw - 1)
        link.set(rate=rate)
        return f"capped at {rate / 1000:.0f} kB/s"
    link.stall()
    return "stalled"
