"""The fault harness's timing measures (tests/faults/timing.py): client outages per
fault kind and how long a cut-off server still confirmed."""

from __future__ import annotations

import math

from tests.faults.history import ACK, UNKNOWN, Delivery, Fault, History, Publish
from tests.faults.timing import measure, summary


def _acks(publisher: str, server: int, times: list[float]) -> list[Publish]:
    return [Publish(publisher, seq, "q", server, t - 0.01, t, ACK) for seq, t in enumerate(times)]


def test_the_outage_is_the_longest_silence_overlapping_the_fault() -> None:
    history = History(
        publishes=[
            *_acks("p0", 0, [1.0, 2.0, 5.5, 6.0]),  # silent 2.0 -> 5.5 across the fault
            *_acks("p1", 1, [1.0, 2.5, 3.0, 3.5, 4.0, 7.0]),  # 4.0 -> 7.0 ends after it
            Publish("p1", 99, "q", 1, 4.5, 4.6, UNKNOWN),  # not a confirm: no matter
        ],
        faults=[Fault("isolate", 0, "root", 3.0, end=4.0, recovered=5.0)],
    )
    timing = measure(history)
    assert sorted(timing.outages["isolate"]) == [3.0, 3.5]


def test_a_cut_off_server_confirming_late_is_measured_from_the_cut() -> None:
    history = History(
        publishes=[*_acks("p0", 0, [1.0, 3.2, 3.4]), *_acks("p1", 1, [3.9])],
        faults=[
            Fault("isolate", 0, "primary", 3.0, end=6.0, recovered=6.5),
            Fault("unplug", 1, "primary", 10.0, end=11.0, recovered=12.0),
        ],
    )
    timing = measure(history)
    assert math.isclose(timing.stop_confirming["isolate"][0], 0.4)
    assert timing.stop_confirming["unplug"] == [0.0]  # nothing after its cut
    assert "cut-off server confirms" in "\n".join(timing.lines())


def test_a_confirm_let_through_by_the_heal_is_not_one_made_while_cut_off() -> None:
    """The heal takes a moment (``end`` is when it was done): a publish held through
    the cut, confirmed as the heal lets it through, is not the cut-off server's."""
    fault = Fault("unplug", 0, "root", 3.0, end=5.6, recovered=6.0, healing=5.5)
    history = History(publishes=_acks("p0", 0, [3.05, 5.55]), faults=[fault])
    assert [round(t, 2) for t in measure(history).stop_confirming["unplug"]] == [0.05]
    fault.healing = None  # a history recorded before ``healing``: up to ``end``
    assert [round(t, 2) for t in measure(history).stop_confirming["unplug"]] == [2.55]


def test_a_cut_off_server_delivering_late_is_measured_from_the_cut() -> None:
    history = History(
        deliveries=[
            Delivery("c0", 1, 0, "p0", 1, False, 3.25),  # server 0, 0.25 s after its cut
            Delivery("c1", 1, 1, "p0", 2, False, 3.9),  # another server
            Delivery("c0", 2, 0, "p0", 3, False, 7.0),  # after the heal
        ],
        faults=[Fault("split", 0, "root", 3.0, end=6.0, recovered=6.5)],
    )
    timing = measure(history)
    assert math.isclose(timing.stop_delivering["split"][0], 0.25)
    assert "cut-off server delivers" in "\n".join(timing.lines())


def test_summary_of_nothing_is_not_a_number() -> None:
    assert summary([])["n"] == 0 and math.isnan(summary([])["max"])
    s = summary([float(i) for i in range(1, 101)])
    assert (s["median"], s["p99"], s["max"]) == (50.5, 100.0, 100.0)
