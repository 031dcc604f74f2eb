"""Collection gaps: stretches where the console recorded no broker at all (issue 45).

When the console process is down (a restart, a deploy), nobody records the brokers'
statuses: every broker's samples stop at once, and each broker showed as one
``broker_outage``.  A *collection gap* is a stretch of at least ``gap_intervals`` interval
buckets without any sample; a broker's heartbeat gap it explains (the broker was last
seen when the console went away, and was back within the reconnect allowance of the
console's return) is the console's absence, not the broker's.

Presence per bucket comes from the root votes' aggregation (``roots.majority_roots``,
``first_t``/``last_t``).  As for the root runs, the buckets are ordered within hour-long
blocks only (a window partitioned by block), and the driver joins the blocks: each block
gives its first and last bucket and the gaps inside it, a few rows per block whatever the
history's length.
"""

from __future__ import annotations

import itertools
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline.isotime import epoch_iso


def block_edges(per_bucket: DataFrame, buckets_per_block: int, gap_intervals: int) -> DataFrame:
    """Per block: its first and last present bucket, and every bucket that ends a gap of
    ``gap_intervals`` or more missing buckets inside the block (with the bucket before)."""
    block = F.floor(F.col("bucket") / F.lit(buckets_per_block)).alias("block")
    w = Window.partitionBy("block").orderBy("bucket")
    rows = (
        per_bucket.select(block, "bucket", "first_t", "last_t")
        .withColumn("prev_bucket", F.lag("bucket").over(w))
        .withColumn("prev_last_t", F.lag("last_t").over(w))
        .withColumn("next_bucket", F.lead("bucket").over(w))
    )
    return rows.where(
        F.col("prev_bucket").isNull()
        | F.col("next_bucket").isNull()
        | (F.col("bucket") - F.col("prev_bucket") > gap_intervals)
    ).select("block", "bucket", "first_t", "last_t", "prev_bucket", "prev_last_t", "next_bucket")


def stitch(rows: list[dict[str, Any]], gap_intervals: int) -> list[dict[str, Any]]:
    """The collection gaps from ``block_edges`` rows: those inside blocks, and those
    between the last bucket of one block and the first of the next present one.

    A gap goes from the last sample before it to the first sample after it (epoch
    seconds); ``missed`` counts the empty buckets.
    """
    gaps = []
    for row in rows:
        if row["prev_bucket"] is not None and row["bucket"] - row["prev_bucket"] > gap_intervals:
            gaps.append(
                _gap(row["prev_last_t"], row["first_t"], row["bucket"] - row["prev_bucket"])
            )
    firsts = {r["block"]: r for r in rows if r["prev_bucket"] is None}
    lasts = {r["block"]: r for r in rows if r["next_bucket"] is None}
    blocks = sorted(firsts)
    for before, after in itertools.pairwise(blocks):
        last, first = lasts[before], firsts[after]
        if first["bucket"] - last["bucket"] > gap_intervals:
            gaps.append(_gap(last["last_t"], first["first_t"], first["bucket"] - last["bucket"]))
    return sorted(gaps, key=lambda g: g["start"])


def _gap(last_t: float, first_t: float, buckets_apart: int) -> dict[str, Any]:
    return {"start": last_t, "end": first_t, "missed": buckets_apart - 1}


def collection_gaps(
    per_bucket: DataFrame, buckets_per_block: int, gap_intervals: int
) -> list[dict[str, Any]]:
    """Every stretch of ``gap_intervals`` or more buckets in which no broker has a sample."""
    rows = block_edges(per_bucket, buckets_per_block, gap_intervals).collect()
    return stitch([row.asDict() for row in rows], gap_intervals)


def explain_gaps(
    spark: SparkSession,
    gaps: DataFrame,
    collection: list[dict[str, Any]],
    interval: float,
    allowance: float,
) -> DataFrame:
    """The heartbeat gaps with their ``cause``: ``planned_stop`` (the broker announced its
    stop before it), ``console_gap`` (a collection gap explains it), else null (an outage);
    ``console_gap_start`` names the collection gap (its start) that explains it.

    A collection gap explains a broker's gap that starts no earlier than one interval
    before the collection gap starts (the broker was sending until the console went
    away) and ends no later than ``allowance`` seconds after it ended (its link came
    back): a broker that died meanwhile comes back later, or never.  The collection gaps
    are a few rows, broadcast; at most one can match a gap (they are apart by more than
    the window on the start side).
    """
    found = spark.createDataFrame(
        [(g["start"], g["end"]) for g in collection], "cg_start double, cg_end double"
    )
    seen = F.col("last_seen").cast("double")
    end = F.col("end").cast("double")
    covers = (
        (seen <= F.col("cg_start"))
        & (seen + F.lit(interval) >= F.col("cg_start") - F.lit(interval))
        & (end >= F.col("cg_end"))
        & (end <= F.col("cg_end") + F.lit(allowance))
    )
    explained = gaps.join(F.broadcast(found), covers, "left")
    cause = F.when(F.col("stop_announced").isNotNull(), F.lit("planned_stop")).when(
        F.col("cg_start").isNotNull(), F.lit("console_gap")
    )
    return explained.select(
        *gaps.columns,
        cause.alias("cause"),
        F.when(F.col("stop_announced").isNull(), F.timestamp_seconds("cg_start")).alias(
            "console_gap_start"
        ),
    )


def console_gap_incidents(
    collection: list[dict[str, Any]], explained: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One ``console_gap`` incident per collection gap, naming the brokers whose heartbeat
    gaps it explains (rows of ``explain_gaps`` with that cause)."""
    brokers: list[set[str]] = [set() for _ in collection]
    for row in explained:
        if row["cause"] == "console_gap" and collection:
            # the gap it names: the nearest start (a timestamp column keeps microseconds
            # only, and collection gaps are intervals apart)
            at = row["console_gap_start"].timestamp()
            nearest = min(range(len(collection)), key=lambda i: abs(collection[i]["start"] - at))
            brokers[nearest].add(row["broker"])
    return [
        {
            "kind": "console_gap",
            "broker": None,
            "start": epoch_iso(g["start"]),
            "end": epoch_iso(g["end"]),
            "details": {
                "seconds": round(g["end"] - g["start"], 6),
                "missed_intervals": g["missed"],
                "brokers": sorted(explains),
            },
        }
        for g, explains in zip(collection, brokers, strict=True)
    ]


def summary_gaps(collection: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """summary.json's ``console_gaps``."""
    return [
        {
            "start": epoch_iso(g["start"]),
            "end": epoch_iso(g["end"]),
            "seconds": round(g["end"] - g["start"], 6),
            "missed_intervals": g["missed"],
        }
        for g in collection
    ]
