"""The report scales out: no window over the whole history, same results as before.

Before the root timeline was partitioned, Spark warned 24 times per report run
``No Partition Defined for Window operation! Moving all data to a single partition``.
``previous_report.json`` is the fingerprint (``python -m pipeline.compare --fingerprint``)
of the previous implementation's output over the session's lake (conftest.LAKE_ARGS),
taken at commit 937a7b5 before any of this changed.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline import compare
from tests.pipeline.conftest import LAKE_ARGS

SINGLE_PARTITION_WARNING = "No Partition Defined for Window operation"
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


def without_issue_25(got: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint as it was before issue 25 added link outages, checking what it changed.

    Added: the ``link_outages`` table, ``outages``, the ``link`` and ``outage``
    definitions; reworded: ``link_flap``; a ``broker_outage`` incident gained ``seconds``
    and ``seen_down_by``, and its start/end now cover its peers' view too (earlier
    start, later end, by less than one interval).  Everything else must be unchanged.
    """
    got = json.loads(json.dumps(got))
    assert got["tables"].pop("link_outages")["rows"] > 0
    summary = got["summary"]
    assert [o["broker"] for o in summary.pop("outages")] == [
        i["broker"] for i in want["summary"]["incidents"] if i["kind"] == "broker_outage"
    ]
    definitions = summary["definitions"]
    assert {definitions.pop("link"), definitions.pop("outage")}
    assert "consecutive observed states" in definitions["link_flap"]
    definitions["link_flap"] = want["summary"]["definitions"]["link_flap"]
    old = [i for i in want["summary"]["incidents"] if i["kind"] == "broker_outage"]
    new = [i for i in summary["incidents"] if i["kind"] == "broker_outage"]
    assert len(new) == len(old)
    for incident, before in zip(new, old, strict=True):
        details = incident["details"]
        assert len(details.pop("seen_down_by")) == LAKE_ARGS["brokers"] - 1
        seconds = details.pop("seconds")
        assert seconds >= details["missed_samples"] * LAKE_ARGS["interval"]
        for end in ("start", "end"):
            moved = abs(epoch(incident[end]) - epoch(before[end]))
            assert moved < LAKE_ARGS["interval"], (end, incident, before)
            incident[end] = before[end]
    return got


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_results_equal_the_previous_implementation(report: dict[str, Any]) -> None:
    want = json.loads(PREVIOUS.read_text())
    got = without_issue_25(compare.fingerprint(report["out"]), want)
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
    from pipeline import roots
    from pipeline.report import ReportOptions, read_lake

    interval = LAKE_ARGS["interval"]
    broker = read_lake(spark, ReportOptions(str(lake_dir), str(tmp_path)), "broker_samples")
    per_bucket = roots.majority_roots(broker, interval).persist()

    def runs(n: int) -> list[dict[str, Any]]:
        return roots.join_runs([r.asDict() for r in roots.block_runs(per_bucket, n).collect()])

    whole = runs(10**12)  # one block: the whole history in one window, as before
    assert [r["root"] for r in whole][1] == ""  # root, no root during the failover, new root
    assert len(whole) == 3
    assert runs(buckets_per_block) == whole
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
