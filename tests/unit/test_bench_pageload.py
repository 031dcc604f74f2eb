"""The live dashboard's lag as ``clusterapi.bench.pageload --live`` works it out."""

from __future__ import annotations

import pytest

from clusterapi.bench.pageload import LIVE_MARGIN, live_lag


def test_a_status_is_shown_by_its_own_seq_or_a_later_one() -> None:
    sent = [("a", 1, 100.0), ("a", 2, 101.0), ("a", 3, 102.0), ("b", 1, 100.5)]
    seen = [
        ("a", 1, 100.2),  # a's first status, 200 ms after it was sent
        ("b", 0, 100.6),  # b's row still shows an older status
        ("a", 3, 102.4),  # a's second status was superseded before a render
        ("b", 1, 101.0),
    ]
    got = live_lag(seen, sent, start=99.0, end=110.0 + LIVE_MARGIN)
    assert (got["statuses"], got["shown"], got["shown_exactly"], got["not_shown"]) == (4, 4, 3, 0)
    assert got["lag_ms"]["max"] == pytest.approx(1400.0)  # a's seq 2: shown with seq 3
    assert got["lag_ms"]["p50"] == pytest.approx(500.0)  # of 200, 400, 500 and 1,400 ms


def test_statuses_outside_the_window_or_never_shown() -> None:
    sent = [("a", 1, 90.0), ("a", 2, 100.0), ("a", 3, 104.0), ("b", 7, 100.0)]
    seen = [("a", 2, 100.3)]
    got = live_lag(seen, sent, start=95.0, end=100.0 + LIVE_MARGIN + 1)
    # a's seq 1 before the window, seq 3 in its last LIVE_MARGIN seconds; b never shown
    assert (got["statuses"], got["shown"], got["not_shown"]) == (2, 1, 1)
    assert got["lag_ms"]["p95"] == pytest.approx(300.0)
