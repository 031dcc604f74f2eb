"""The two-owner check of the fault harness (tests/faults/owners.py)."""

from __future__ import annotations

from tests.faults.owners import Mark, marks, overlaps

LOG = """\
2026-11-29 10:00:00,000 INFO brokerd.cluster.confirms: confirms queue=q term=4 epoch=2
2026-11-29 10:00:00,500 WARNING brokerd.cluster: root taken spid=x reason=root
2026-11-29 10:00:01,020 INFO worker-1 brokerd.cluster.confirms: confirms queue=q term=4 epoch=3
"""


def test_marks_are_read_with_their_time_queue_and_epoch() -> None:
    read = marks("n0", LOG)
    assert [(m.queue, m.placement, m.server) for m in read] == [
        ("q", (4, 2), "n0"),
        ("q", (4, 3), "n0"),
    ]
    assert round(read[1].at - read[0].at, 3) == 1.02


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


def test_an_owner_that_let_the_queue_go_marks_no_more(caplog: object) -> None:
    """What it held unconfirmed goes to the next owner, whose confirm completes the
    same publish (a short network run reported such a confirm as two owners)."""
    import logging

    from brokerd.cluster.queues.replication.marks import ConfirmMarks

    marks = ConfirmMarks("q", 3, 7)
    answers: list[tuple[bool, int]] = []
    done = marks.wrap(lambda accepted, routed: answers.append((accepted, routed)))
    with caplog.at_level(logging.INFO, logger="brokerd.cluster.confirms"):  # type: ignore[attr-defined]
        done(True, 1)
        marks.retire()
        marks._last = float("-inf")
        done(True, 1)
    lines = [r.getMessage() for r in caplog.records]  # type: ignore[attr-defined]
    assert lines == ["confirms queue=q term=7 epoch=3"] and answers == [(True, 1), (True, 1)]
