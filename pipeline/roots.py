"""The root timeline: who was root when, root changes and the time without a root.

Each interval bucket ``floor(epoch / interval)`` takes the root most brokers report in it.
Runs of buckets with the same root are found per hour-long block of buckets (a window
partitioned by block, so the history never goes through one partition), and the driver
joins a run that crosses a block boundary back into one segment.  That gives exactly the
segments of one window over the whole history, for the cost of collecting one extra
segment per block.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline.summary import epoch_iso

BLOCK_SECONDS = 3600.0


def block_buckets(interval: float) -> int:
    """How many interval buckets make one block (about an hour, at least one bucket)."""
    return max(1, int(BLOCK_SECONDS // interval))


def majority_roots(broker: DataFrame, interval: float) -> DataFrame:
    """One row per bucket: the root (a broker name, else its spid, else "") most brokers saw.

    Ties go to the smallest name.  A hash aggregation per bucket, no window.
    """
    names = broker.select(F.col("spid").alias("root"), F.col("broker").alias("root_name"))
    names = names.dropDuplicates(["root"])
    votes = (
        broker.select(F.floor(F.col("t") / F.lit(interval)).alias("bucket"), "root")
        .join(F.broadcast(names), "root", "left")
        .select("bucket", F.coalesce("root_name", "root", F.lit("")).alias("root"))
        .groupBy("bucket", "root")
        .count()
    )
    # min over (-count, root) = the most votes, then the smallest name
    best = F.min(F.struct((-F.col("count")).alias("minus_count"), F.col("root").alias("root")))
    return votes.groupBy("bucket").agg(best.alias("best")).select("bucket", "best.root")


def block_runs(per_bucket: DataFrame, buckets_per_block: int) -> DataFrame:
    """Runs of consecutive buckets with the same root, within each block."""
    block = F.floor(F.col("bucket") / F.lit(buckets_per_block)).alias("block")
    w = Window.partitionBy("block").orderBy("bucket")
    changed = F.col("root") != F.coalesce(F.lag("root").over(w), F.lit("\x00"))
    return (
        per_bucket.select(block, "bucket", "root")
        .withColumn("run", F.sum(F.when(changed, 1).otherwise(0)).over(w))
        .groupBy("block", "run", "root")
        .agg(F.min("bucket").alias("first"), F.max("bucket").alias("last"))
    )


def join_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs ordered by (block, run) joined where a root carries on into the next block."""
    joined: list[dict[str, Any]] = []
    for run in sorted(runs, key=lambda r: (r["block"], r["run"])):
        if joined and joined[-1]["root"] == run["root"]:
            joined[-1]["last"] = run["last"]
        else:
            joined.append({"root": run["root"], "first": run["first"], "last": run["last"]})
    return joined


def root_segments(broker: DataFrame, interval: float) -> list[dict[str, Any]]:
    """Consecutive interval buckets with the same majority root (names, or None)."""
    runs = block_runs(majority_roots(broker, interval), block_buckets(interval))
    return [
        {
            "root": seg["root"] or None,
            "start": seg["first"] * interval,
            "end": (seg["last"] + 1) * interval,
        }
        for seg in join_runs([row.asDict() for row in runs.collect()])
    ]


def root_timeline(segments: list[dict[str, Any]]) -> dict[str, Any]:
    """Who was root when, the changes between roots, and the time with no root."""
    for s in segments:
        s["seconds"] = round(s["end"] - s["start"], 6)
    changes = []
    failovers = []
    previous: dict[str, Any] | None = None  # the last segment that had a root
    for seg in segments:
        if seg["root"] is None:
            continue
        if previous is not None and seg["root"] != previous["root"]:
            changes.append(
                {"at": epoch_iso(seg["start"]), "from": previous["root"], "to": seg["root"]}
            )
            failovers.append(
                {
                    "kind": "root_failover",
                    "broker": previous["root"],
                    "start": epoch_iso(previous["end"]),
                    "end": epoch_iso(seg["start"]),
                    "details": {
                        "new_root": seg["root"],
                        "no_root_seconds": round(seg["start"] - previous["end"], 6),
                    },
                }
            )
        previous = seg
    gaps = [
        {"start": epoch_iso(s["start"]), "end": epoch_iso(s["end"]), "seconds": s["seconds"]}
        for s in segments
        if s["root"] is None
    ]
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
