"""The tools around the job: output comparison and the bench's event-log reading (no Spark)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import bench, compare


def write_output(out: Path, rates: list[float], extra_row: bool = False) -> Path:
    """A report-shaped output: one table as a Spark-style directory, and summary.json."""
    table = out / "broker_minute"
    table.mkdir(parents=True)
    minutes = [datetime(2026, 1, 5, 0, i, tzinfo=UTC) for i in range(len(rates))]
    rows = {"broker": ["b1"] * len(rates), "minute": minutes, "in_avg": rates}
    if extra_row:
        rows = {k: [*v, v[-1]] for k, v in rows.items()}
    # Spark's row order is no part of the result: write them backwards in two files
    half = len(rates) // 2
    data = pa.table(rows)
    pq.write_table(data.slice(half).take(list(range(data.num_rows - half))[::-1]), table / "p1")
    pq.write_table(data.slice(0, half), table / "p0.parquet")
    (table / "_SUCCESS").write_text("")
    summary = {"peak": max(rates), "tables": {"broker_minute": str(table)}}
    (out / "summary.json").write_text(json.dumps(summary))
    return out


def test_compare_ignores_row_order_and_paths_but_not_values(tmp_path: Path) -> None:
    a = write_output(tmp_path / "a", [1.0, 2.5, 3.25, 4.0])
    b = write_output(tmp_path / "b", [1.0, 2.5, 3.25, 4.0])
    problems, counts = compare.diff_outputs(a, b)
    assert problems == []
    assert counts == {"values": 12, "floats": 4, "floats_not_bit_identical": 0}
    c = write_output(tmp_path / "c", [1.0, 2.5, 3.25 * (1 + 1e-15), 4.0])
    problems, counts = compare.diff_outputs(a, c)
    assert len(problems) == 1 and "in_avg" in problems[0]
    assert compare.diff_outputs(a, c, rel=1e-12)[0] == []
    assert compare.diff_outputs(a, c, rel=1e-12)[1]["floats_not_bit_identical"] == 1
    d = write_output(tmp_path / "d", [1.0, 2.5, 3.25, 4.0], extra_row=True)
    assert compare.diff_outputs(a, d)[0] == ["broker_minute: columns or row counts differ"]


def test_fingerprint_sees_values_moved_between_rows(tmp_path: Path) -> None:
    a = compare.fingerprint(write_output(tmp_path / "a", [1.0, 2.0, 3.0, 4.0]))
    b = compare.fingerprint(write_output(tmp_path / "b", [2.0, 1.0, 3.0, 4.0]))  # same sum
    assert a["tables"]["broker_minute"]["sums"]["in_avg"][0] == 10.0
    assert compare.diff_fingerprints(a, a, rel=0) == []
    assert compare.diff_fingerprints(a, b, rel=1e-9)
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "a")]) == 0


def event(kind: str, **fields: object) -> str:
    return json.dumps({"Event": kind, **fields})


def task_end(stage: int, run_ms: int, records: int) -> str:
    metrics = {"Executor Run Time": run_ms, "Input Metrics": {"Records Read": records}}
    return event("SparkListenerTaskEnd", **{"Stage ID": stage, "Task Metrics": metrics})


def stage_done(stage: int, tasks: int) -> str:
    info = {"Stage ID": stage, "Stage Name": f"s{stage}", "Number of Tasks": tasks}
    return event("SparkListenerStageCompleted", **{"Stage Info": info})


def test_spark_stats_reads_version_partitions_and_input_splits(tmp_path: Path) -> None:
    log = tmp_path / "local-1"
    props = {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "8"}
    lines = [
        event("SparkListenerLogStart", **{"Spark Version": "3.5.9"}),
        event("SparkListenerEnvironmentUpdate", **{"Spark Properties": props}),
        task_end(0, 1500, 60),
        task_end(0, 500, 40),  # stage 0 read the 100 broker rows in 3 splits
        stage_done(0, 3),
        task_end(1, 2000, 0),
        stage_done(1, 8),
        task_end(2, 1000, 700),  # the queue table
        stage_done(2, 4),
    ]
    log.write_text("\n".join(lines) + "\n")
    stats = bench.spark_stats(log, {"broker_samples": 100, "queue_samples": 700})
    assert stats["spark_version"] == "3.5.9"
    assert (stats["master"], stats["shuffle_partitions"]) == ("local[2]", "8")
    assert stats["adaptive"] == "true (default)"
    assert (stats["stages"], stats["tasks"]) == (3, 15)
    assert stats["tasks_per_stage"] == {"min": 3, "median": 4, "max": 8}
    assert stats["input_splits"] == {"broker_samples": [3], "queue_samples": [4]}
    assert stats["task_seconds"] == pytest.approx(5.0)
