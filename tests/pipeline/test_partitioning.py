"""The report scales out: no window over the whole history, same results as before.

Before the root timeline was partitioned, Spark warned 24 times per report run
``No Partition Defined for Window operation! Moving all data to a single partition``.
``previous_report.json`` is the fingerprint (``python -m pipeline.compare --fingerprint``)
of an earlier implementation's output over the session's lake (conftest.LAKE_ARGS).
The generator gained a console gap and a planned stop with issue 45, which changed the
lake: the fingerprint is now that of commit 16076ac's implementation (the partitioned
one of issue 25, checked then against the single-partition one of 937a7b5) over the new
lake, and issue 45's changes are taken out of the comparison one by one.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import compare
from tests.pipeline.conftest import LAKE_ARGS

SINGLE_PARTITION_WARNING = "No Partition Defined for Window operation"
GAP = 3  # the report's default gap_intervals
PREVIOUS = Path(__file__).with_name("previous_report.json")


def test_a_report_run_logs_no_single_partition_window(
    spark: Any, report: dict[str, Any], spark_log: Path
) -> None:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    assert spark_log.is_file(), "Spark did not start with the test log4j2 configuration"
    assert report["summary"]["samples"]["broker_samples"] > 0
    assert SINGLE_PARTITION_WARNING not in spark_log.read_text()
    # The log would show one: an unpartitioned window logs the warning into this file.
    spark.range(10).select(F.lag("id").over(Window.orderBy("id"))).collect()
    assert SINGLE_PARTITION_WARNING in spark_log.read_text()


#: columns issue 45 added to tables the fingerprint has
ADDED_COLUMNS = {
    "heartbeat_gaps": ["last_spid", "stop_announced", "cause", "console_gap_start"],
    "restarts": ["planned"],
}
NEW_KINDS = {"console_gap", "no_root", "planned_stop"}
RESTART_KINDS = {"crash_restart", "planned_restart"}
NEW_DEFINITIONS = {"console_gap", "planned_stop", "restart", "no_root"}


def joined_segments(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive segments of one root as one: the root timeline before the console gap
    made a hole in it."""
    joined: list[dict[str, Any]] = []
    for segment in sorted(segments, key=lambda s: s["start"]):
        if joined and joined[-1]["root"] == segment["root"]:
            joined[-1] = {**joined[-1], "end": segment["end"]}
        else:
            joined.append(dict(segment))
    return joined


def fingerprint_before_issue_45(out: Path, tmp: Path) -> dict[str, Any]:
    """The fingerprint of ``out`` without issue 45's table changes: the columns it added,
    and the root timeline's hole at the console gap."""
    copy = tmp / "without-issue-45"
    summary = json.loads((out / "summary.json").read_text())
    for name in summary["tables"]:
        data = pq.read_table(out / name)
        data = data.drop_columns(ADDED_COLUMNS.get(name, []))
        if name == "root_timeline":
            rows = joined_segments(data.to_pylist())
            for row in rows:
                row["seconds"] = round((row["end"] - row["start"]).total_seconds(), 6)
            data = pa.Table.from_pylist(rows, schema=data.schema)
        (copy / name).mkdir(parents=True)
        pq.write_table(data, copy / name / "part-00000.parquet")
    (copy / "summary.json").write_text(json.dumps(summary))
    return compare.fingerprint(copy)


def explained_by(
    row: dict[str, Any], gaps: list[dict[str, Any]], stops: list[dict[str, Any]]
) -> bool:
    """Whether issue 45 took this outage away: a broker's gap in a console gap that names
    it, or its planned stop."""
    start = epoch(row["start"])
    return any(
        row["broker"] in g["details"]["brokers"] and epoch(g["start"]) <= start <= epoch(g["end"])
        for g in gaps
    ) or any(
        row["broker"] == s["broker"] and epoch(s["start"]) <= start <= epoch(s["end"])
        for s in stops
    )


def without_issue_45(got: dict[str, Any], want: dict[str, Any]) -> tuple[dict, dict]:
    """Both fingerprints as they compare once issue 45's summary changes are checked.

    Added: ``console_gaps``, four definitions (the outage one extended), the no-root
    stretches' ``root_before``/``root_after``, and the incidents ``console_gap``,
    ``no_root`` and ``planned_stop``; ``restart`` became ``crash_restart`` or
    ``planned_restart``.  Taken away: the ``broker_outage`` of every broker a console gap
    explains and of a planned stop (in the incidents and in ``outages``).  The root
    timeline's hole is joined back.  Everything else must be unchanged.
    """
    got, want = json.loads(json.dumps(got)), json.loads(json.dumps(want))
    summary, before = got["summary"], want["summary"]
    [console] = summary.pop("console_gaps")
    definitions = summary["definitions"]
    assert {definitions.pop(k) for k in NEW_DEFINITIONS}
    assert definitions["outage"].startswith(before["definitions"]["outage"])
    definitions["outage"] = before["definitions"]["outage"]
    root = summary["root"]
    root["timeline"] = joined_segments(root["timeline"])
    for stretch in root["no_root"]:
        assert {stretch.pop("root_before"), stretch.pop("root_after")}
    incidents = summary["incidents"]
    gaps = [i for i in incidents if i["kind"] == "console_gap"]
    stops = [i for i in incidents if i["kind"] == "planned_stop"]
    no_root = [i["details"]["seconds"] for i in incidents if i["kind"] == "no_root"]
    assert sum(no_root) == pytest.approx(root["no_root_seconds"]) and no_root
    assert [(g["start"], g["end"]) for g in gaps] == [(console["start"], console["end"])]
    assert len(gaps[0]["details"]["brokers"]) == LAKE_ARGS["brokers"] and len(stops) == 1
    kept = []
    for incident in incidents:
        if incident["kind"] in NEW_KINDS:
            continue
        if incident["kind"] in RESTART_KINDS:
            planned = incident["kind"] == "planned_restart"
            assert planned == any(epoch(s["end"]) == epoch(incident["start"]) for s in stops)
            incident = {**incident, "kind": "restart"}
        kept.append(incident)
    old = [
        i
        for i in before["incidents"]
        if i["kind"] != "broker_outage" or not explained_by(i, gaps, stops)
    ]
    assert len(before["incidents"]) - len(old) == LAKE_ARGS["brokers"] + len(stops)
    order = lambda i: (i["start"], i["kind"], i["broker"])  # noqa: E731
    summary["incidents"], before["incidents"] = sorted(kept, key=order), sorted(old, key=order)
    before["outages"] = [o for o in before["outages"] if not explained_by(o, gaps, stops)]
    return got, want


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def without_issue_42(got: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint without issue 42's bridged traffic: a total per broker and
    cluster-wide (the generator bridges a tenth of each broker's intake, derived
    without a draw, so nothing else moved) and its definition."""
    summary = got["summary"]
    totals = summary["totals"]
    bridged = totals.pop("bridged")
    per_broker = [counts.pop("bridged") for counts in totals["per_broker"].values()]
    assert bridged == sum(per_broker) > 0
    assert 0 < bridged <= totals["published"] // 10  # a tenth, rounded down per sample
    assert summary["definitions"].pop("bridged")
    return got


def test_results_equal_the_previous_implementation(report: dict[str, Any], tmp_path: Path) -> None:
    want = json.loads(PREVIOUS.read_text())
    got, want = without_issue_45(fingerprint_before_issue_45(report["out"], tmp_path), want)
    got = without_issue_42(got)
    assert got["tables"].keys() == want["tables"].keys()
    assert compare.diff_fingerprints(got, want, rel=1e-9) == []
    # the fingerprint sees a change: one float nudged by far less than any real change
    want["summary"]["capacity"]["isr_peak_measured"] *= 1 + 1e-6
    assert compare.diff_fingerprints(got, want, rel=1e-9)


@pytest.mark.parametrize("buckets_per_block", [1, 7, 720])
def test_root_runs_joined_across_blocks_equal_one_window(
    spark: Any, lake_dir: Path, tmp_path: Path, buckets_per_block: int
) -> None:
    """Runs found per block and joined on the driver = runs of one global window."""
    from pipeline import collection, roots
    from pipeline.report import ReportOptions, read_lake

    interval = LAKE_ARGS["interval"]
    broker = read_lake(spark, ReportOptions(str(lake_dir), str(tmp_path)), "broker_samples")
    per_bucket = roots.majority_roots(broker, interval).persist()

    def runs(n: int) -> list[dict[str, Any]]:
        found = roots.block_runs(per_bucket, n, GAP).collect()
        return roots.join_runs([r.asDict() for r in found], GAP)

    whole = runs(10**12)  # one block: the whole history in one window, as before
    # root, no root during the failover, new root, the same after the console gap
    assert [r["root"] for r in whole][1] == ""
    assert len(whole) == 4 and whole[2]["root"] == whole[3]["root"]
    assert runs(buckets_per_block) == whole
    # the console gap: found per block and joined, as in one window
    gaps = collection.collection_gaps(per_bucket, buckets_per_block, GAP)
    assert gaps == collection.collection_gaps(per_bucket, 10**12, GAP)
    [gap] = gaps
    assert gap["missed"] == whole[3]["first"] - whole[2]["last"] - 1 >= GAP
    per_bucket.unpersist()


def test_join_runs_joins_only_the_same_root_across_a_boundary() -> None:
    from pipeline.roots import join_runs

    runs = [
        {"block": 1, "run": 1, "root": "b", "first": 10, "last": 12},
        {"block": 0, "run": 2, "root": "b", "first": 5, "last": 9},
        {"block": 0, "run": 1, "root": "a", "first": 0, "last": 4},
        {"block": 1, "run": 2, "root": "", "first": 13, "last": 19},
        {"block": 2, "run": 1, "root": "c", "first": 20, "last": 21},
    ]
    assert join_runs(runs) == [
        {"root": "a", "first": 0, "last": 4},
        {"root": "b", "first": 5, "last": 12},
        {"root": "", "first": 13, "last": 19},
        {"root": "c", "first": 20, "last": 21},
    ]


def test_join_runs_keeps_a_collection_gap_apart() -> None:
    from pipeline.roots import join_runs

    runs = [
        {"block": 0, "run": 1, "root": "a", "first": 0, "last": 4},
        {"block": 1, "run": 1, "root": "a", "first": 7, "last": 9},  # 2 missing: the same run
        {"block": 1, "run": 2, "root": "a", "first": 13, "last": 15},  # 3 missing: a gap
    ]
    assert join_runs(runs, 3) == [
        {"root": "a", "first": 0, "last": 9},
        {"root": "a", "first": 13, "last": 15},
    ]
    assert join_runs(runs) == [{"root": "a", "first": 0, "last": 15}]


def test_collection_gaps_are_stitched_inside_and_across_blocks() -> None:
    from pipeline.collection import stitch

    def row(block: int, bucket: int, prev: int | None, last: bool) -> dict[str, Any]:
        return {
            "block": block,
            "bucket": bucket,
            "first_t": bucket * 5.0 + 0.1,
            "last_t": bucket * 5.0 + 2.4,
            "prev_bucket": prev,
            "prev_last_t": None if prev is None else prev * 5.0 + 2.4,
            "next_bucket": None if last else bucket + 1,
        }

    # blocks of 10 buckets, present: 0-3 and 8-9 | 10-11 and 14-19 | none | 30-39; what
    # block_edges gives: each block's first and last, and a bucket after 3 or more missing
    rows = [
        row(0, 0, None, False), row(0, 8, 3, False), row(0, 9, 8, True),
        row(1, 10, None, False), row(1, 19, 18, True),
        row(3, 30, None, False), row(3, 39, 38, True),
    ]  # fmt: skip
    assert stitch(rows, 3) == [
        {"start": 3 * 5.0 + 2.4, "end": 8 * 5.0 + 0.1, "missed": 4},
        {"start": 19 * 5.0 + 2.4, "end": 30 * 5.0 + 0.1, "missed": 10},
    ]
