"""The root timeline: who was root when, root changes and the time without a root.

Each interval bucket ``floor(epoch / interval)`` takes the root most brokers report in it.
Runs of buckets with the same root are found per hour-long block of buckets (a window
partitioned by block, so the history never goes through one partition), and the driver
joins a run that crosses a block boundary back into one segment.  That gives exactly the
segments of one window over the whole history, for the cost of collecting one extra
segment per block.

A collection gap (``gap_intervals`` or more buckets without any sample: the console was
away) ends a segment: nobody knows who was root then, and it is no time "without a root"
either, so a segment never spans one and the timeline has a hole there (issue 45).
"""

from __future__ import annotations

import bisect
import itertools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline.isotime import epoch_iso

BLOCK_SECONDS = 3600.0


def block_buckets(interval: float) -> int:
    """How many interval buckets make one block (about an hour, at least one bucket)."""
    return max(1, int(BLOCK_SECONDS // interval))


def majority_roots(broker: DataFrame, interval: float) -> DataFrame:
    """One row per bucket: the root (a broker name, else its spid, else "") most brokers saw,
    and the bucket's first and last sample times (``first_t``, ``last_t``: what the
    collection gaps are found from, in the same pass).

    Ties go to the smallest name.  A hash aggregation per bucket, no window.
    """
    names = broker.select(F.col("spid").alias("root"), F.col("broker").alias("root_name"))
    names = names.dropDuplicates(["root"])
    votes = (
        broker.select(F.floor(F.col("t") / F.lit(interval)).alias("bucket"), "root", "t")
        .join(F.broadcast(names), "root", "left")
        .select("bucket", "t", F.coalesce("root_name", "root", F.lit("")).alias("root"))
        .groupBy("bucket", "root")
        .agg(F.count(F.lit(1)).alias("count"), F.min("t").alias("t0"), F.max("t").alias("t1"))
    )
    # min over (-count, root) = the most votes, then the smallest name
    best = F.min(F.struct((-F.col("count")).alias("minus_count"), F.col("root").alias("root")))
    return (
        votes.groupBy("bucket")
        .agg(best.alias("best"), F.min("t0").alias("first_t"), F.max("t1").alias("last_t"))
        .select("bucket", "best.root", "first_t", "last_t")
    )


def block_runs(per_bucket: DataFrame, buckets_per_block: int, gap_intervals: int) -> DataFrame:
    """Runs of consecutive buckets with the same root, within each block; a collection gap
    (``gap_intervals`` or more buckets missing) ends a run."""
    block = F.floor(F.col("bucket") / F.lit(buckets_per_block)).alias("block")
    w = Window.partitionBy("block").orderBy("bucket")
    changed = (F.col("root") != F.coalesce(F.lag("root").over(w), F.lit("\x00"))) | (
        F.col("bucket") - F.lag("bucket").over(w) > gap_intervals
    )
    return (
        per_bucket.select(block, "bucket", "root")
        .withColumn("run", F.sum(F.when(changed, 1).otherwise(0)).over(w))
        .groupBy("block", "run", "root")
        .agg(F.min("bucket").alias("first"), F.max("bucket").alias("last"))
    )


def join_runs(runs: list[dict[str, Any]], gap_intervals: int | None = None) -> list[dict[str, Any]]:
    """Runs ordered by (block, run) joined where a root carries on into the next block
    (not across a collection gap of ``gap_intervals`` or more missing buckets)."""
    joined: list[dict[str, Any]] = []
    for run in sorted(runs, key=lambda r: (r["block"], r["run"])):
        same = bool(joined) and joined[-1]["root"] == run["root"]
        if same and gap_intervals is not None:
            same = run["first"] - joined[-1]["last"] <= gap_intervals  # no collection gap
        if same:
            joined[-1]["last"] = run["last"]
        else:
            joined.append({"root": run["root"], "first": run["first"], "last": run["last"]})
    return joined


def root_segments(
    per_bucket: DataFrame, interval: float, gap_intervals: int
) -> list[dict[str, Any]]:
    """Consecutive interval buckets with the same majority root (names, or None), from
    ``majority_roots``; never across a collection gap."""
    runs = block_runs(per_bucket, block_buckets(interval), gap_intervals)
    return [
        {
            "root": seg["root"] or None,
            "start": seg["first"] * interval,
            "end": (seg["last"] + 1) * interval,
        }
        for seg in join_runs([row.asDict() for row in runs.collect()], gap_intervals)
    ]


def root_timeline(segments: list[dict[str, Any]]) -> dict[str, Any]:
    """Who was root when, the changes between roots, and the time with no root.

    Every segment without a root is one ``no_root`` stretch (with the roots before and
    after it, if any), and a failover's ``no_root_seconds`` is the no-root time between
    its two roots: so the total ``no_root_seconds`` is the sum over the stretches, and
    a stretch where the same root came back is counted too (issue 45: the root tile said
    4.0 s while the only failover said 0.0).
    """
    for s in segments:
        s["seconds"] = round(s["end"] - s["start"], 6)
    rooted = [i for i, s in enumerate(segments) if s["root"] is not None]
    changes = []
    failovers = []
    for before, after in itertools.pairwise(rooted):
        previous, seg = segments[before], segments[after]
        if seg["root"] == previous["root"]:
            continue
        changes.append({"at": epoch_iso(seg["start"]), "from": previous["root"], "to": seg["root"]})
        between = sum(s["seconds"] for s in segments[before + 1 : after] if s["root"] is None)
        failovers.append(
            {
                "kind": "root_failover",
                "broker": previous["root"],
                "start": epoch_iso(previous["end"]),
                "end": epoch_iso(seg["start"]),
                "details": {"new_root": seg["root"], "no_root_seconds": round(between, 6)},
            }
        )
    gaps = []
    for i, s in enumerate(segments):
        if s["root"] is not None:
            continue
        k = bisect.bisect_left(rooted, i)  # rooted[k - 1] < i < rooted[k]
        gaps.append(
            {
                "start": epoch_iso(s["start"]),
                "end": epoch_iso(s["end"]),
                "seconds": s["seconds"],
                "root_before": segments[rooted[k - 1]]["root"] if k > 0 else None,
                "root_after": segments[rooted[k]]["root"] if k < len(rooted) else None,
            }
        )
    return {
        "segments": segments,
        "changes": changes,
        "no_root": gaps,
        "no_root_seconds": round(sum(g["seconds"] for g in gaps), 6),
        "failovers": failovers,
    }


def write_root_timeline(spark: SparkSession, timeline: dict[str, Any], target: Path) -> None:
    """The segments as one small Parquet file (built on the driver, a few rows)."""
    spark.createDataFrame(
        [
            (
                s["root"],
                datetime.fromtimestamp(s["start"], UTC),
                datetime.fromtimestamp(s["end"], UTC),
                s["seconds"],
            )
            for s in timeline["segments"]
        ],
        "root string, start timestamp, end timestamp, seconds double",
    ).coalesce(1).write.mode("overwrite").parquet(str(target))
