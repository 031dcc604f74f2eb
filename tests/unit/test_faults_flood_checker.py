"""The fault checker's flood mode on hand-made histories (no broker).

Flood publishers publish without confirms: their messages never count as
``lost`` (a promise only a confirm makes), but a duplicate without the
redelivered flag or an out-of-order delivery is a bug whoever published, and
what was written and never delivered is counted and blamed on a fault.
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path

from tests.faults.checker import NO_FAULT, check
from tests.faults.history import (
    ACK,
    Delivery,
    Fault,
    FloodDeliveries,
    FloodPublisher,
    FloodSession,
    History,
    Publish,
    Recorder,
    body,
    parse,
)


def session(
    first: int, sent: list[float], *, closed: float, error: str = "", cut: int = 0
) -> FloodSession:
    return FloodSession(0, sent[0] if sent else closed, first, array("d", sent), cut, closed, error)


def flooder(*sessions: FloodSession, name: str = "f0", queues: int = 1) -> FloodPublisher:
    return FloodPublisher(name, [f"q{i}" for i in range(queues)], list(sessions))


def stream(
    rows: list[tuple[str, int, bool, float]], consumer: str = "c0", number: int = 1
) -> FloodDeliveries:
    deliveries = FloodDeliveries(consumer, number, 1)
    for publisher, seq, redelivered, at in rows:
        deliveries.add(publisher, seq, redelivered, at)
    return deliveries


def history(
    flood: list[FloodPublisher],
    streams: list[FloodDeliveries],
    faults: list[Fault] | None = None,
    publishes: list[Publish] | None = None,
    deliveries: list[Delivery] | None = None,
) -> History:
    return History(
        publishes or [],
        deliveries or [],
        faults or [],
        drained=True,
        flood=flood,
        flood_deliveries=streams,
    )


def test_flood_messages_delivered_once_are_fine_and_leave_confirmed_figures_alone() -> None:
    h = history(
        [flooder(session(1, [1.0, 2.0, 3.0], closed=9.0))],
        [stream([("f0", seq, False, seq + 0.5) for seq in (1, 2, 3)])],
        publishes=[Publish("p0", 1, "q0", 0, 1.0, 1.1, ACK)],
        deliveries=[Delivery("c0", 1, 1, "p0", 1, False, 1.2)],
    )
    report = check(h)
    assert report.ok()
    assert report.must_be_zero() == {
        "lost": 0,
        "unflagged_duplicates": 0,
        "order_violations": 0,
        "unknown": 0,
        "two_roots": 0,
        "two_owners_confirming": 0,
    }
    assert (report.publishes, report.confirmed, report.not_confirmed) == (1, 1, {})
    assert (report.deliveries, report.received, report.received_unconfirmed) == (1, 1, 0)
    assert (report.unconfirmed_published, report.unconfirmed_deliveries) == (3, 3)
    assert (report.unconfirmed_received, report.unconfirmed_lost) == (3, 0)
    assert "unconf lost" in report.format()


def test_a_flood_message_delivered_twice_unflagged_is_a_duplicate() -> None:
    h = history(
        [flooder(session(1, [1.0, 2.0], closed=9.0))],
        [
            stream([("f0", 1, False, 1.5), ("f0", 2, False, 2.5)]),
            stream(
                [("f0", 1, True, 3.0), ("f0", 2, False, 4.0)],  # 1 flagged: fine; 2 is not
                consumer="c1",
            ),
        ],
    )
    report = check(h)
    assert report.unflagged_duplicates == 1
    assert report.duplicates_by_fault == {NO_FAULT: 1}
    assert report.unconfirmed_redelivered == 1
    assert report.examples["unflagged_duplicates"] == ["f0:2 again to c1/1 on [1]"]
    assert not report.ok()


def test_the_earliest_copy_is_the_unflagged_one_whatever_the_recorded_order() -> None:
    # a flagged redelivery recorded before the unflagged copy held in another buffer
    h = history(
        [flooder(session(1, [1.0], closed=9.0))],
        [
            stream([("f0", 1, True, 2.0)], consumer="c0"),
            stream([("f0", 1, False, 3.0)], consumer="c1"),
        ],
    )
    assert check(h).unflagged_duplicates == 0


def test_a_flood_message_never_delivered_is_unconfirmed_lost_not_lost() -> None:
    h = history(
        [flooder(session(1, [1.0, 2.0, 3.0], closed=9.0), queues=1)],
        [stream([("f0", 1, False, 1.5), ("f0", 3, False, 3.5)])],
    )
    report = check(h)
    assert report.lost == 0
    assert report.ok()  # reported, never a failure
    assert (report.unconfirmed_published, report.unconfirmed_lost) == (3, 1)
    assert report.unconfirmed_lost_read == 1  # 3 came after it on its connection: it was read
    assert report.unconfirmed_lost_by_fault == {NO_FAULT: 1}
    assert report.examples["unconfirmed_lost"] == [
        "f0#1@[0]>q0 2: none, 1 read, ended closed at the stop"
    ]
    assert "unconfirmed_lost 1 of unconfirmed_published 3" in report.format()


def test_a_publish_cut_off_by_its_connection_is_not_published_but_known_if_it_arrives() -> None:
    h = history(
        [
            flooder(
                session(1, [1.0], closed=2.0, error="StreamLostError: reset", cut=1),
                session(3, [3.0], closed=9.0),
            )
        ],
        [stream([("f0", 1, False, 1.5), ("f0", 2, False, 2.5), ("f0", 3, False, 3.5)])],
    )
    report = check(h)
    assert (report.unconfirmed_published, report.unconfirmed_cut) == (2, 1)
    assert (report.unconfirmed_received, report.unknown) == (3, 0)


def test_flood_deliveries_of_what_was_never_tried_are_unknown() -> None:
    h = history(
        [flooder(session(1, [1.0], closed=9.0))],
        [stream([("f0", 1, False, 1.5), ("f0", 7, False, 2.0), ("f9", 1, False, 2.5)])],
    )
    report = check(h)
    assert report.unknown == 2
    assert not report.ok()


def test_order_holds_per_publisher_connection_redeliveries_excepted() -> None:
    h = history(
        [
            flooder(
                session(1, [1.0, 1.1, 1.2], closed=1.3, error="StreamLostError: reset"),
                session(4, [2.0, 2.1, 2.2], closed=9.0),
            )
        ],
        [
            stream(
                [
                    ("f0", 4, False, 3.0),
                    ("f0", 2, False, 3.1),  # an older connection's: no order between them
                    ("f0", 1, False, 3.2),  # after 2 from the same connection: a violation
                    ("f0", 5, True, 3.3),
                    ("f0", 3, False, 3.4),
                    ("f0", 6, False, 3.5),
                ]
            ),
            stream([("f0", 5, False, 3.6)], consumer="c1"),  # its first unflagged copy
        ],
    )
    report = check(h)
    assert report.order_violations == {"f0": 1}
    assert report.examples["order_violations"] == ["c0/1 got f0:1 after f0:2 (its connection 1)"]
    assert report.unflagged_duplicates == 0 and report.unconfirmed_lost == 0


def test_losses_are_blamed_on_the_fault_they_were_published_in_or_in_flight_at() -> None:
    faults = [
        Fault("kill-publisher-server", 0, "primary", start=10.0, end=11.0, recovered=13.0),
        Fault("pause-long", 1, "root", start=30.0, end=33.0, recovered=34.0),
    ]
    h = history(
        [
            flooder(
                # 1..3 written before the kill, 3 still in the socket when it came
                session(1, [5.0, 6.0, 9.99], closed=10.01, error="StreamLostError: reset"),
                # 4 written while the cluster settled after the kill and lost: the kill's;
                # 5 delivered; 6 lost and 7 delivered after it, all with no fault about
                session(4, [12.0, 14.0, 20.0, 21.0], closed=29.0),
            )
        ],
        [
            stream(
                [
                    ("f0", 1, False, 5.5),
                    ("f0", 2, False, 6.5),
                    ("f0", 5, False, 14.5),
                    ("f0", 7, False, 21.5),
                ]
            )
        ],
        faults,
    )
    report = check(h)
    assert report.lost == 0 and report.ok()
    assert report.unconfirmed_lost == 3
    assert report.unconfirmed_lost_by_fault == {NO_FAULT: 1, "kill-publisher-server": 2}
    assert report.unconfirmed_lost_read == 2  # 4 (5 came after it) and 6 (7 came after it)
    assert report.unconfirmed_lost_read_by_fault == {NO_FAULT: 1, "kill-publisher-server": 1}
    assert [f["unconfirmed_lost"] for f in report.per_fault] == [2, 0]
    assert report.examples["unconfirmed_lost"] == [
        "f0#1@[0]>q0 3: kill-publisher-server, 0 read, ended StreamLostError",
        "f0#2@[0]>q0 4: kill-publisher-server, 1 read, ended closed at the stop",
        "f0#2@[0]>q0 6: none, 1 read, ended closed at the stop",
    ]
    table = report.format().splitlines()
    header = next(line for line in table if line.startswith("fault kind"))
    assert header.endswith("unconf lost")
    row = next(line for line in table if line.startswith("kill-publisher-server"))
    assert row.split()[-1] == "2"
    assert next(line for line in table if line.startswith(NO_FAULT)).split()[-1] == "1"


def test_lost_runs_follow_one_connection_s_sends_to_one_queue() -> None:
    sent = [float(seq) for seq in range(1, 9)]
    h = history(
        [flooder(session(1, sent, closed=8.5, error="StreamLostError: reset"), queues=2)],
        [stream([("f0", 1, False, 1.5), ("f0", 2, False, 2.5)])],
    )
    report = check(h)
    assert report.unconfirmed_lost == 6
    assert report.examples["unconfirmed_lost"] == [
        "f0#1@[0]>q1 3..7 (3): none, 0 read, ended StreamLostError",
        "f0#1@[0]>q0 4..8 (3): none, 0 read, ended StreamLostError",
    ]


def test_without_a_flood_the_report_is_as_before() -> None:
    h = History([Publish("p0", 1, "q0", 0, 1.0, 1.1, ACK)], [], [], drained=True)
    report = check(h)
    assert report.flood_publishers == 0 and report.lost == 1
    text = report.format()
    assert "unconf lost" not in text and "unconfirmed_lost" not in text and "flood" not in text
    assert "flood" not in h.to_dict()


def test_the_recorder_keeps_flood_deliveries_in_arrays() -> None:
    recorder = Recorder()
    publisher = recorder.flood_publisher("f0", ["q0"])
    recorder.flood_session(publisher, 2, 1, 1.0).sent.extend([1.0, 1.1])
    recorder.delivery(Delivery("c0", 1, 3, "f0", 1, False, 2.0))
    recorder.delivery(Delivery("c0", 1, 3, "p0", 1, False, 2.1))
    recorder.delivery(Delivery("c0", 1, 3, "f0", 2, True, 2.2))
    h = recorder.history
    assert [d.publisher for d in h.deliveries] == ["p0"]
    assert len(h.flood_deliveries) == 1 and len(h.flood_deliveries[0]) == 2
    assert list(h.flood_deliveries[0].rows()) == [("f0", 1, False, 2.0), ("f0", 2, True, 2.2)]
    assert recorder.last_delivery == 2.2
    assert parse(body("f0", 2)) == ("f0", 2)


def test_a_flood_history_survives_json(tmp_path: Path) -> None:
    h = history(
        [flooder(session(1, [1.0, 2.0], closed=3.0, error="StreamLostError: x", cut=1))],
        [stream([("f0", 1, False, 1.5), ("f0", 3, True, 3.5)])],
        [Fault("kill-root", 0, "root", 1.0, 2.0, 3.0)],
    )
    path = tmp_path / "h.json"
    h.save(path)
    again = History.load(path)
    assert again == h
    assert check(again).to_dict() == json.loads(json.dumps(check(h).to_dict()))
