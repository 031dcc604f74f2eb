"""Flow control's bookkeeping (``brokerd.cluster.plane.flow``): which connections a cause
pauses, and that a connection resumes only when no cause holds it any more."""

from __future__ import annotations

from brokerd.cluster.latency import LatencyWindow
from brokerd.cluster.plane.flow import FlowControl


def make() -> tuple[FlowControl, list[tuple[int, bool]]]:
    calls: list[tuple[int, bool]] = []
    flow = FlowControl(lambda conn, paused: calls.append((conn, paused)), {"peer": 90}.get)
    return flow, calls


def test_a_cause_pauses_its_feeders_and_a_peer_by_its_data_lane() -> None:
    flow, calls = make()
    flow.hold("link:b", "behind", [1, 2, "peer", "unknown-peer"])
    assert calls == [(1, True), (2, True), (90, True)]
    assert flow.describe() == {"link:b": {"reason": "behind", "paused": 3}}
    flow.hold("link:b", "behind", [2, 3])  # held again: only the new feeder is paused
    assert calls[-1] == (3, True) and len(calls) == 4
    flow.release("link:b")
    assert sorted(calls[4:]) == [(1, False), (2, False), (3, False), (90, False)]
    assert not flow.active and flow.episodes == {"link:b": 1}


def test_a_connection_held_by_two_causes_resumes_when_both_clear() -> None:
    flow, calls = make()
    flow.hold("replication", "lag", [1])
    flow.hold("event-loop", "late", [1, 2])
    assert calls == [(1, True), (2, True)]
    flow.release("replication")
    assert calls == [(1, True), (2, True)]  # 1 is still held by the event loop
    assert flow.held_by(1) == {"event-loop"}
    flow.release("event-loop")
    assert sorted(calls[2:]) == [(1, False), (2, False)]


def test_a_closed_connection_is_forgotten() -> None:
    flow, calls = make()
    flow.hold("replication", "lag", [1, 2])
    flow.forget(1)
    flow.release("replication")
    assert calls[2:] == [(2, False)]  # nothing resumed on a connection that is gone


def test_the_latency_window_is_bounded_and_keeps_the_max_ever() -> None:
    window = LatencyWindow(4)
    for value in (5.0, 0.1, 0.2, 0.3, 0.4):
        window.add(value)
    assert len(window.samples) == 4 and window.count == 5
    described = window.describe()
    assert described["max_ms"] == 400.0 and described["max_ever_ms"] == 5000.0
    assert described["p50_ms"] == 300.0
