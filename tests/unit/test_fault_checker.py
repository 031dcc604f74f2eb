"""The fault-injection checker and schedule, on hand-made histories (no broker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.faults.checker import NO_FAULT, check
from tests.faults.history import (
    ACK,
    NACK,
    UNKNOWN,
    Delivery,
    Fault,
    History,
    Publish,
    body,
    parse,
)
from tests.faults.nemesis import KINDS, PAUSE_LONG, PAUSE_SHORT, schedule


def pub(publisher: str, seq: int, outcome: str = ACK, sent: float | None = None) -> Publish:
    at = float(seq) if sent is None else sent
    return Publish(publisher, seq, "q", 0, at, at + 0.01, outcome)


def got(
    publisher: str,
    seq: int,
    *,
    consumer: str = "c0",
    session: int = 1,
    redelivered: bool = False,
    at: float | None = None,
) -> Delivery:
    return Delivery(
        consumer, session, 1, publisher, seq, redelivered, float(seq) + 0.5 if at is None else at
    )


def history(
    publishes: list[Publish], deliveries: list[Delivery], faults: list[Fault] | None = None
) -> History:
    return History(publishes, deliveries, faults or [], drained=True)


def test_a_clean_history_is_ok() -> None:
    h = history([pub("p0", i) for i in range(1, 6)], [got("p0", i) for i in range(1, 6)])
    report = check(h)
    assert report.ok()
    assert (report.publishes, report.confirmed, report.received, report.deliveries) == (5, 5, 5, 5)
    assert report.must_be_zero() == {
        "lost": 0,
        "unflagged_duplicates": 0,
        "order_violations": 0,
        "unknown": 0,
        "two_roots": 0,
        "two_owners_confirming": 0,
    }


def test_a_confirmed_message_never_delivered_is_lost_an_unconfirmed_one_is_not() -> None:
    h = history(
        [pub("p0", 1), pub("p0", 2), pub("p0", 3, NACK), pub("p0", 4, UNKNOWN), pub("p0", 5)],
        [got("p0", 1), got("p0", 4)],
    )
    report = check(h)
    assert report.lost == 2
    assert report.not_confirmed == {NACK: 1, UNKNOWN: 1}
    assert report.received_unconfirmed == 1  # p0:4, unanswered yet delivered: allowed
    assert report.examples["lost"] == ["p0>q 2", "p0>q 5"]
    assert not report.ok()


def test_lost_runs_follow_one_publisher_s_sends_to_one_queue() -> None:
    publishes = [
        Publish("p0", seq, f"q{seq % 2}", 0, float(seq), float(seq), ACK) for seq in range(1, 9)
    ]
    report = check(history(publishes, [got("p0", 1), got("p0", 2), got("p0", 8)]))
    assert report.lost == 5
    assert report.examples["lost"] == ["p0>q1 3..7 (3)", "p0>q0 4..6 (2)"]


def test_a_second_delivery_must_be_flagged_redelivered() -> None:
    h = history(
        [pub("p0", 1), pub("p0", 2)],
        [
            got("p0", 1, at=1.0),
            got("p0", 1, consumer="c1", redelivered=True, at=2.0),  # fine
            got("p0", 2, at=3.0),
            got("p0", 2, consumer="c1", at=4.0),  # not fine
        ],
    )
    report = check(h)
    assert report.unflagged_duplicates == 1
    assert report.redelivered == 1
    assert report.lost == 0
    assert "p0:2 again to c1/1" in report.examples["unflagged_duplicates"][0]


def test_the_first_delivery_decides_even_when_recorded_out_of_list_order() -> None:
    # histories are appended from several threads: time decides which came first
    h = history([pub("p0", 1)], [got("p0", 1, redelivered=True, at=5.0), got("p0", 1, at=1.0)])
    assert check(h).unflagged_duplicates == 0


def test_a_copy_recorded_late_from_a_client_buffer_is_the_one_unflagged_delivery() -> None:
    # c1's client held the first (unflagged) copy in its buffer while its server lost
    # the root; the new root redelivered it, flagged, to c0, recorded first
    h = history(
        [pub("p0", 1), pub("p0", 2)],
        [
            got("p0", 1, consumer="c0", redelivered=True, at=2.0),
            got("p0", 1, consumer="c1", at=3.0),
            got("p0", 2, consumer="c0", redelivered=True, at=4.0),
            got("p0", 2, consumer="c1", at=5.0),
            got("p0", 2, consumer="c2", at=6.0),  # a second unflagged copy: not fine
        ],
    )
    report = check(h)
    assert report.unflagged_duplicates == 1
    assert "p0:2 again to c2/1" in report.examples["unflagged_duplicates"][0]


def test_order_is_per_publisher_and_per_consumer_connection_redeliveries_excepted() -> None:
    publishes = [pub(p, i) for p in ("p0", "p1") for i in range(1, 7)]
    deliveries = [
        got("p0", 2, at=1.0),
        got("p1", 5, at=1.1),
        got("p0", 1, at=1.2),  # p0 out of order on c0/1: a violation
        got("p1", 1, redelivered=True, at=1.3),  # a redelivery: excepted
        got("p1", 6, at=1.4),
        got("p0", 3, consumer="c1", at=1.5),  # another consumer: its own order
        got("p1", 2, consumer="c0", session=2, at=1.6),  # a new connection: its own order
        got("p1", 3, consumer="c0", session=2, at=1.7),
        got("p1", 4, consumer="c0", session=2, redelivered=True, at=1.8),
        got("p0", 4, at=1.9),
        got("p0", 5, at=2.0),
        got("p0", 6, at=2.1),
    ]
    report = check(history(publishes, deliveries))
    assert report.order_violations == {"p0": 1}
    assert report.order_violation_total == 1
    assert report.examples["order_violations"] == ["c0/1 got p0:1 after p0:2"]
    assert report.lost == 0 and report.unflagged_duplicates == 0


def test_duplicates_and_order_violations_are_blamed_on_the_fault_that_held_them() -> None:
    faults = [
        Fault("pause-long", 0, "root", start=2.0, end=3.0),
        Fault("kill-primary", 1, "primary", start=5.0, end=6.0),
    ]
    publishes = [pub("p0", i, sent=1.0 + i / 10) for i in (1, 2, 3)]
    deliveries = [
        got("p0", 1, at=1.2),
        got("p0", 1, at=1.5),  # a duplicate before any fault
        got("p0", 3, at=4.0),  # overtakes 2, held up by the pause
        got("p0", 2, at=5.5),  # delivered after the kill started: still the pause's doing
        got("p0", 3, at=7.0),  # a duplicate: the last fault since its first delivery
    ]
    report = check(history(publishes, deliveries, faults))
    assert report.duplicates_by_fault == {NO_FAULT: 1, "kill-primary": 1}
    assert report.order_by_fault == {"pause-long": 1}
    assert "pause-long" in report.format()


def test_a_duplicate_is_not_also_an_order_violation() -> None:
    h = history([pub("p0", 1), pub("p0", 2)], [got("p0", 1), got("p0", 2), got("p0", 1, at=9.0)])
    report = check(h)
    assert (report.unflagged_duplicates, report.order_violation_total) == (1, 0)


def test_deliveries_of_what_nobody_published_are_counted() -> None:
    report = check(history([pub("p0", 1)], [got("p0", 1), got("p9", 1), got("?", -1)]))
    assert report.unknown == 2
    assert not report.ok()


def test_an_undrained_run_is_not_ok_even_with_nothing_missing() -> None:
    h = history([pub("p0", 1)], [got("p0", 1)])
    h.drained = False
    assert not check(h).ok()
    assert "NO" in check(h).format()


def test_a_loss_goes_to_the_last_fault_before_the_queue_moved_past_it() -> None:
    faults = [
        Fault("cut-link", 1, "primary", start=10.0, end=12.0, recovered=13.0, peer=2),
        Fault("kill-root", 0, "root", start=20.0, end=22.0, recovered=23.0),
        Fault("pause-long", 2, "root", start=30.0, end=33.0),  # never settled
    ]
    publishes = [
        pub("p0", 1, sent=5.0),  # waits in a backlog through the cut, lost with the root
        pub("p0", 2, sent=6.0),  # the same
        pub("p0", 3, sent=24.0),  # delivered at 26: the queue moved past 1 and 2 then
        pub("p0", 4, sent=25.0),  # lost, and 5 delivered at 28, before the pause: no fault
        pub("p0", 5, sent=27.0),
        pub("p0", 6, sent=29.0),  # nothing later delivered: the last fault in force after it
        pub("p1", 1, sent=40.0),  # after every fault, never delivered: none
    ]
    deliveries = [got("p0", 3, at=26.0), got("p0", 5, at=28.0)]
    report = check(history(publishes, deliveries, faults))
    assert report.lost == 5
    assert report.lost_by_fault == {"kill-root": 2, "pause-long": 1, NO_FAULT: 2}
    assert [f["lost"] for f in report.per_fault] == [0, 2, 1]
    assert report.faults == {"cut-link": 1, "kill-root": 1, "pause-long": 1}
    assert report.faults_on_root == {"kill-root": 1, "pause-long": 1}
    assert report.recovery == {
        "cut-link": {"median": 3.0, "max": 3.0},
        "kill-root": {"median": 3.0, "max": 3.0},
    }
    text = report.format()
    assert "kill-root" in text and "NOT OK" in text


def test_a_history_survives_json(tmp_path: Path) -> None:
    h = history(
        [pub("p0", 1), pub("p0", 2, NACK)],
        [got("p0", 1)],
        [Fault("kill-primary", 1, "primary", 1.0, 2.0, 3.0, note="x")],
    )
    h.meta = {"seed": 7}
    path = tmp_path / "h.json"
    h.save(path)
    again = History.load(path)
    assert again == h
    assert check(again).to_dict() == json.loads(json.dumps(check(h).to_dict()))


def test_bodies_name_publisher_and_sequence() -> None:
    assert parse(body("p3", 42, pad=10)) == ("p3", 42)
    with pytest.raises(ValueError):
        parse(b"garbage")


def test_the_schedule_is_a_function_of_the_seed_and_covers_every_kind_early() -> None:
    first = schedule(7, 20, timeout=1.0)
    assert first == schedule(7, 20, timeout=1.0)
    assert first != schedule(8, 20, timeout=1.0)
    assert {p.kind for p in first[: len(KINDS)]} == set(KINDS)
    for planned in first:
        if planned.kind == PAUSE_SHORT:
            assert planned.hold < 1.0  # shorter than the heartbeat timeout
        if planned.kind == PAUSE_LONG:
            assert planned.hold > 1.0
        assert 0 <= planned.pick < 1 and 0.5 <= planned.gap <= 2.0
    only = schedule(1, 5, kinds=["kill-root"])
    assert [p.kind for p in only] == ["kill-root"] * 5
    with pytest.raises(ValueError):
        schedule(1, 3, kinds=["kill-everything"])


def test_a_publish_whose_connection_failed_may_come_after_the_next_connections() -> None:
    """Kept by its server while the root was out of reach, it reaches the root after
    what the publisher sent on its next connection: AMQP orders nothing across
    connections, so only an acked (or nacked) publish is held to the order."""
    outcomes = {2: UNKNOWN, 4: NACK}
    publishes = [pub("p0", i, outcomes.get(i, ACK)) for i in range(1, 6)]
    deliveries = [got("p0", 1, at=1.0), got("p0", 3, at=2.0), got("p0", 2, at=3.0)]
    deliveries += [got("p0", 5, at=4.0), got("p0", 4, at=5.0)]
    report = check(history(publishes, deliveries))
    assert report.order_violations == {"p0": 1}  # the nacked one, on the same connection
    assert report.examples["order_violations"] == ["c0/1 got p0:4 after p0:5"]
    assert report.unknown_late == 1
    assert "1 of those after the next connection's" in report.format()


def test_two_roots_or_two_owners_confirming_are_not_ok() -> None:
    h = history([pub("p0", 1)], [got("p0", 1)])
    h.meta["root_overlaps"] = 1
    assert not check(h).ok()
    h.meta["root_overlaps"] = 0
    h.meta["owner_overlaps"] = ["q: epoch 1 on [0] confirmed 40 ms after epoch 2 on [1] had"]
    report = check(h)
    assert not report.ok() and report.must_be_zero()["two_owners_confirming"] == 1
    assert "two owners confirming: q: epoch 1" in report.format()


def test_late_confirms_of_held_events_are_reported_but_not_failures() -> None:
    h = history([pub("p0", 1)], [got("p0", 1)])
    h.meta["owner_overlaps_held"] = ["q: ... (event 55, held: its replicas fenced it at 55)"]
    report = check(h)
    assert report.ok() and report.late_held_confirms
    assert "late confirms of held events (1, not failures)" in report.format()
