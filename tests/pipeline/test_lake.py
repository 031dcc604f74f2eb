"""The lake writer: schema, partitions, validation, idempotent batches (no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline import lake


def peer_row(ts: object, broker: str = "10.0.0.1:5701", active: bool = True) -> dict:
    return {
        "ts": ts,
        "broker": broker,
        "peer": "019b8b8c50a2-10202-1031",
        "peer_address": "10.0.0.2:5701",
        "active": active,
        "rtt_ms": 0.4 if active else None,
    }


def test_same_batch_twice_replaces_instead_of_duplicating(tmp_path: Path) -> None:
    rows = [peer_row(1_767_571_200.0 + i * 3600) for i in range(30)]  # spans two days
    first = lake.write_rows(tmp_path, "peer_samples", rows, "archive-42")
    again = lake.write_rows(tmp_path, "peer_samples", rows, "archive-42")
    assert first == again and len(first) == 2
    assert lake.read_table(tmp_path, "peer_samples").num_rows == 30
    lake.write_rows(tmp_path, "peer_samples", rows[:5], "archive-43")
    assert lake.read_table(tmp_path, "peer_samples").num_rows == 35


def test_partitions_by_utc_date_and_encoded_broker(tmp_path: Path) -> None:
    ts = datetime(2026, 3, 1, 23, 59, 59, 999_999, tzinfo=UTC)
    (path,) = lake.write_rows(tmp_path, "peer_samples", [peer_row(ts)], "b1")
    assert path.relative_to(tmp_path).parts == (
        "peer_samples",
        "date=2026-03-01",
        "broker=10.0.0.1%3A5701",
        "part-b1.parquet",
    )
    back = lake.read_table(tmp_path, "peer_samples").to_pylist()
    assert back[0]["broker"] == "10.0.0.1:5701"
    assert back[0]["ts"] == ts  # microseconds kept
    assert back[0]["rtt_ms"] == 0.4


def test_naive_datetimes_are_utc_and_nulls_allowed_where_nullable(tmp_path: Path) -> None:
    naive = datetime(2026, 3, 1, 12, 0, 0)
    lake.write_rows(tmp_path, "peer_samples", [peer_row(naive, active=False)], "b1")
    (row,) = lake.read_table(tmp_path, "peer_samples").to_pylist()
    assert row["ts"] == naive.replace(tzinfo=UTC)
    assert row["rtt_ms"] is None and row["active"] is False


def test_every_table_schema_round_trips(tmp_path: Path) -> None:
    assert set(lake.SCHEMAS) == {"broker_samples", "queue_samples", "peer_samples"}
    for table, schema in lake.SCHEMAS.items():
        assert schema.field("ts").type == lake.TS
        assert "broker" not in lake.file_schema(table).names
        assert lake.read_table(tmp_path, table).schema == schema


@pytest.mark.parametrize(
    ("table", "rows", "batch", "message"),
    [
        ("nope", [], "b", "unknown table"),
        ("peer_samples", [peer_row(1.0)], "../evil", "bad batch id"),
        ("peer_samples", [peer_row(1.0)], "", "bad batch id"),
        ("peer_samples", [{**peer_row(1.0), "active": None}], "b", "missing required field"),
        ("peer_samples", [peer_row("yesterday")], "b", "ts must be"),
        ("peer_samples", [{**peer_row(1.0), "rtt_ms": "fast"}], "b", "bad field value"),
        ("peer_samples", ["row"], "b", "expected a mapping"),
    ],
)
def test_bad_input_is_refused_with_a_message(
    tmp_path: Path, table: str, rows: list, batch: str, message: str
) -> None:
    with pytest.raises(lake.LakeError, match=message):
        lake.write_rows(tmp_path, table, rows, batch)
    assert not any(tmp_path.rglob("*.parquet"))
