"""Issue 45's driver-side pieces without Spark: the root timeline's no-root stretches,
incidents from gap rows with their causes, and the lake's added ``stopping`` column."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipeline import lake
from pipeline.incidents import build_incidents
from pipeline.roots import root_timeline

T0 = datetime(2026, 1, 5, 10, 0, 0)  # naive, as Spark hands timestamps to the driver
EPOCH = 1_767_607_200.0  # T0 in epoch seconds (UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_every_stretch_without_a_root_is_counted_once() -> None:
    def seg(root: str | None, start: float, end: float) -> dict[str, Any]:
        return {"root": root, "start": EPOCH + start, "end": EPOCH + end}

    timeline = root_timeline(
        [
            seg("a", 0, 100),
            seg(None, 100, 104),  # lost and regained: no failover
            seg("a", 104, 200),
            seg(None, 200, 203),
            seg(None, 240, 242),  # after a console gap (200-240 s is a hole, not counted)
            seg("b", 242, 300),
        ]
    )
    assert [(g["seconds"], g["root_before"], g["root_after"]) for g in timeline["no_root"]] == [
        (4.0, "a", "a"),
        (3.0, "a", "b"),
        (2.0, "a", "b"),
    ]
    assert timeline["no_root_seconds"] == 9.0
    [failover] = timeline["failovers"]
    assert failover["details"] == {"new_root": "b", "no_root_seconds": 5.0}
    assert [(c["from"], c["to"]) for c in timeline["changes"]] == [("a", "b")]


def gap(broker: str, last: float, end: float | None, cause: str | None, **more: Any) -> dict:
    return {
        "broker": broker,
        "last_seen": at(last),
        "start": at(last + 1),
        "end": None if end is None else at(end),
        "missed": 0 if end is None else int(end - last - 1),
        "last_spid": f"{broker}-1",
        "stop_announced": more.get("announced"),
        "cause": cause,
        "console_gap_start": more.get("console"),
    }


def link(observer: str, peer: str, start: float, end: float | None) -> dict[str, Any]:
    return {
        "broker": observer,
        "peer_address": peer,
        "start": at(start),
        "end": None if end is None else at(end),
    }


def test_causes_turn_gaps_into_their_incidents() -> None:
    collection = [{"start": EPOCH + 99.8, "end": EPOCH + 140.1, "missed": 40}]
    console = at(99.8) + timedelta(microseconds=1)  # a timestamp column's rounding
    gaps = [
        gap("a", 99.1, 140.1, "console_gap", console=console),
        gap("b", 99.4, 143.4, "console_gap", console=console),
        gap("c", 99.6, None, None),  # died while the console was away
        gap("b", 299.4, 330.4, "planned_stop", announced=at(297.4)),
    ]
    links = [
        link("a", "c", 140.1, None),
        link("a", "b", 300.1, 330.1),  # b's planned stop, seen by its peer
        link("a", "b", 400.1, 410.1),  # later, a real partition
    ]
    restarts = [
        {"broker": "b", "ts": at(330.4), "old_spid": "b-1", "new_spid": "b-2", "planned": True},
        {"broker": "c", "ts": at(500.6), "old_spid": "c-1", "new_spid": "c-2", "planned": False},
    ]
    timeline = {"failovers": [], "no_root": []}
    incidents, outages = build_incidents(
        timeline=timeline, collection=collection, gaps=gaps, link_outages=links,
        restarts=restarts, backlogs=[], flaps=[], interval=1.0, allowance=15.0,
    )  # fmt: skip
    assert [(i["kind"], i["broker"]) for i in incidents] == [
        ("console_gap", None),
        ("broker_outage", "c"),
        ("planned_stop", "b"),
        ("planned_restart", "b"),
        ("link_outage", "b"),
        ("crash_restart", "c"),
    ]
    console_gap, died, stop = incidents[:3]
    assert console_gap["details"]["brokers"] == ["a", "b"]
    assert died["end"] is None and died["details"]["seen_down_by"] == ["a"]
    assert stop["start"] == "2026-01-05T10:04:59.400000Z"
    assert stop["details"]["seen_down_by"] == ["a"] and stop["details"]["seconds"] == 31.0
    assert [o["broker"] for o in outages] == ["c", "b"]


def test_rows_and_files_without_stopping_read_as_no_stop(tmp_path: Path) -> None:
    row = {
        "ts": EPOCH, "broker": "127.0.0.1:5701", "spid": "s", "broker_type": "primary",
        "is_root": True, "root": "s", "ready": True, "peers_active": 0, "peers_known": 0,
        "connections": 0, "consumers": 0, "queues": 0, "messages_ready": 0,
        "messages_unacked": 0, "published_total": 1, "routed_total": 1, "delivered_total": 1,
    }  # fmt: skip
    # a writer that does not know the column yet
    assert lake.rows_to_table("broker_samples", [row]).column("stopping").to_pylist() == [False]
    lake.write_rows(tmp_path, "broker_samples", [{**row, "stopping": True}], "new")
    old = lake.rows_to_table("broker_samples", [{**row, "ts": EPOCH + 1}])
    directory = lake.partition_dir(tmp_path, "broker_samples", "2026-01-05", "127.0.0.1:5701")
    pq.write_table(old.drop_columns(["broker", "stopping"]), directory / "part-old.parquet")
    back = lake.read_table(tmp_path, "broker_samples").sort_by("ts")
    assert back.schema == lake.BROKER_SAMPLES
    assert back.column("stopping").to_pylist() == [True, False]
