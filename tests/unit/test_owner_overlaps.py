"""The two-owner check of the fault harness (tests/faults/owners.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.faults.owners import Fence, Mark, fences, marks, overlaps

LOG = """\
2026-11-29 10:00:00,000 INFO brokerd.cluster.confirms: confirms queue=q term=4 epoch=2
2026-11-29 10:00:00,500 WARNING brokerd.cluster: root taken spid=x reason=root
2026-11-29 10:00:01,020 INFO worker-1 brokerd.cluster.confirms: confirms queue=q term=4 epoch=3
2026-11-29 10:00:01,030 INFO brokerd.cluster.confirms: confirms queue=q term=4 epoch=3 \
owner=ab-1 seq=77
2026-11-29 10:00:01,040 WARNING brokerd.cluster.queues.replication.copies: \
owner ab-1 fenced: \
its stream stops at event 75 here
"""


def test_marks_are_read_with_their_time_queue_and_epoch() -> None:
    read = marks("n0", LOG)
    assert [(m.queue, m.placement, m.server, m.owner, m.seq) for m in read] == [
        ("q", (4, 2), "n0", "-", 0),
        ("q", (4, 3), "n0", "-", 0),
        ("q", (4, 3), "n0", "ab-1", 77),
    ]
    assert round(read[1].at - read[0].at, 3) == 1.02
    [fence] = fences(LOG)
    assert (fence.owner, fence.seq, round(fence.at - read[0].at, 3)) == ("ab-1", 75, 1.04)


def test_a_late_confirm_of_what_the_replicas_held_at_the_fence_is_held_not_a_failure() -> None:
    """A resumed SIGSTOPped owner confirms what its replicas acked before they
    fenced it: the successor took the queue from those copies."""
    run = [Mark(1.0, "q", 1, 1, "a", "A", 40), Mark(2.0, "q", 1, 2, "b", "B", 3)]
    points = [Fence(1.5, "A", 55), Fence(1.6, "A", 52), Fence(9.0, "A", 500)]
    [held] = overlaps([*run, Mark(2.3, "q", 1, 1, "a", "A", 55)], points)
    assert held.held and held.fenced_at == 55 and "held" in str(held)
    # one event past every replica's fence point: the successor may not hold it
    [beyond] = overlaps([*run, Mark(2.3, "q", 1, 1, "a", "A", 56)], points)
    assert not beyond.held and beyond.fenced_at == 55
    # a fence logged after the mark (a later generation's) excuses nothing
    [late] = overlaps([*run, Mark(2.3, "q", 1, 1, "a", "A", 400)], points)
    assert not late.held
    # no fence logged for that owner, or a mark without seq: never held
    assert not overlaps([*run, Mark(2.3, "q", 1, 1, "a", "A", 5)])[0].held
    assert not overlaps([*run, Mark(2.3, "q", 1, 1, "a")], points)[0].held


def test_a_held_late_confirm_never_hides_one_that_was_not() -> None:
    run = [Mark(1.0, "q", 1, 1, "a", "A", 40), Mark(2.0, "q", 1, 2, "b", "B", 3)]
    late = [Mark(2.3, "q", 1, 1, "a", "A", 70), Mark(2.5, "q", 1, 1, "a", "A", 50)]
    found = overlaps([*run, *late], [Fence(1.5, "A", 60)])
    assert sorted(o.held for o in found) == [False, True]


def test_owners_in_turn_do_not_overlap() -> None:
    turn = [Mark(1.0, "q", 1, 1, "a"), Mark(1.5, "q", 1, 1, "a"), Mark(2.0, "q", 1, 2, "b")]
    assert overlaps([*turn, Mark(1.2, "other", 1, 7, "c"), Mark(1.9, "other", 1, 7, "c")]) == []
    # the same instant (ms timestamps) is not an overlap
    assert overlaps([Mark(2.0, "q", 1, 2, "b"), Mark(2.0, "q", 1, 1, "a")]) == []


def test_an_old_owner_confirming_after_its_successor_is_found() -> None:
    found = overlaps(
        [
            Mark(1.0, "q", 1, 1, "a"),
            Mark(2.0, "q", 1, 2, "b"),
            Mark(2.3, "q", 1, 1, "a"),
            Mark(2.5, "q", 1, 1, "a"),
            Mark(2.6, "q", 1, 2, "b"),
        ]
    )
    assert len(found) == 1
    [overlap] = found
    assert (overlap.early.epoch, overlap.late.epoch, overlap.late.at) == (2, 1, 2.5)
    assert round(overlap.seconds, 3) == 0.5 and "epoch 1 on a" in str(overlap)


def test_a_state_log_seeded_anew_orders_by_its_later_term() -> None:
    """After a whole-cluster restart epochs start again, under a later term."""
    before = [Mark(1.0, "q", 3, 9, "a"), Mark(1.5, "q", 3, 9, "a")]
    after = [Mark(9.0, "q", 5, 1, "b"), Mark(9.5, "q", 5, 2, "c")]
    assert overlaps([*before, *after]) == []
    assert len(overlaps([*before, *after, Mark(9.7, "q", 3, 9, "a")])) == 1


def test_an_owner_that_let_the_queue_go_marks_no_more(caplog: pytest.LogCaptureFixture) -> None:
    """What it held unconfirmed goes to the next owner, whose confirm completes the
    same publish (a short network run reported such a confirm as two owners)."""
    from brokerd.cluster.queues.replication.marks import ConfirmMarks

    marks = ConfirmMarks("q", 3, 7, "ab-1")
    answers: list[tuple[bool, int]] = []
    done = marks.wrap(lambda accepted, routed: answers.append((accepted, routed)), 9)
    with caplog.at_level(logging.INFO, logger="brokerd.cluster.confirms"):
        done(True, 1)
        marks.retire()
        marks._last = float("-inf")
        done(True, 1)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["confirms queue=q term=7 epoch=3 owner=ab-1 seq=9"]
    assert answers == [(True, 1), (True, 1)]


def test_a_burst_s_last_confirm_is_marked_after_the_interval_and_before_retiring(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A mark's seq must reach the highest confirmed event, or the check could not
    tell a late confirm of a held event from one beyond the fence."""
    from brokerd.cluster.queues.replication.marks import MARK_EVERY, ConfirmMarks

    async def burst() -> None:
        marks = ConfirmMarks("q", 3, 7, "ab-1")
        for seq in (1, 2, 3):
            marks.wrap(lambda accepted, routed: None, seq)(True, 1)
        await asyncio.sleep(MARK_EVERY * 3)
        for seq in (4, 5):
            marks.wrap(lambda accepted, routed: None, seq)(True, 1)
        marks.retire()  # before the flush is due: it marks 5 itself
        await asyncio.sleep(MARK_EVERY * 3)

    with caplog.at_level(logging.INFO, logger="brokerd.cluster.confirms"):
        asyncio.run(burst())
    seqs = [r.getMessage().rsplit("=", 1)[1] for r in caplog.records]
    assert seqs == ["1", "3", "4", "5"]
