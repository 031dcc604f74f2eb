"""The traffic report: a Spark job over the heartbeat lake.

Run ``python -m pipeline report --lake L --out O`` or
``spark-submit pipeline/report.py --lake L --out O``.  Definitions (also in
docs/architecture.md):

- A sample's rate is the counter difference over the time since the previous
  sample of the same broker (or queue).  After a restart (new spid, or a counter
  that went down) the counter counts from the start, which is at most one
  interval earlier: rate = counter / interval.  A series' first sample has no rate.
- Broker "in" is messages published per second, "out" messages delivered to
  clients per second (= XSR); ISR is copies routed into queues per second
  (seed 000).  Per minute: average, p50, p95 (exact, linear interpolation) and
  max of the per-sample rates whose sample time falls in that minute.  Cluster
  ISR/XSR for a minute = the sum over brokers of their minute averages.
- Heartbeat gap: ``round(dt / interval) - 1 >= gap_intervals`` missed samples.
- Console gap (collection gap): ``gap_intervals`` or more interval buckets without a
  sample of any broker: the console was away.  It explains a broker's heartbeat gap
  that starts no earlier than one interval before it and ends within
  ``reconnect_allowance`` seconds of its end: no outage, one ``console_gap`` incident.
- Planned stop: a heartbeat gap after the broker's run announced its stop (a sample
  marked ``stopping``): a ``planned_stop`` incident, no outage; the restart after it
  is a ``planned_restart``, any other restart a ``crash_restart``.
- Root timeline: each interval bucket ``floor(epoch / interval)`` takes the root
  most brokers report in it (spids mapped to broker names); a root failover is a
  change from root X to another root Y (possibly through buckets without a root).
  Each run of buckets without a root is a ``no_root`` incident; a console gap ends a
  segment and is no time without a root.
- Link: a broker's link to a peer address, whatever spid answers there (a restarted
  peer is the same link).  Its observed state at a sample is up if any spid listed at
  that address is active; a sample without the peer listed, or without a heartbeat
  from the observer, is no observation.
- Link flap: at least 4 changes between consecutive observed states of one link, each
  within ``flap_window`` seconds of the previous one.
- Outage: a link's run of down observations, from the first sample that saw it down to
  the next that saw it up (``link_outages``).  Toward a broker, its peers' link outages
  of at least ``gap_intervals`` samples and its own heartbeat gaps are one outage while
  they overlap (summary ``outages``, and the incidents ``broker_outage``, or
  ``link_outage`` when the broker kept sending heartbeats).
- Backlog: a queue whose ready count rose at every sample (at least 5 samples) for
  at least ``backlog_min_seconds`` and by at least ``backlog_min_growth`` messages.

Stages by concern: ``series`` (per broker, queue and link; every window partitioned by
its series), ``roots`` and ``collection`` (the root timeline and the console gaps,
windows partitioned by hour-long blocks of interval buckets), ``incidents`` and
``summary`` (summary.json from aggregated rows); this module reads the lake and writes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # spark-submit pipeline/report.py: make `pipeline` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DataType, StructField

from pipeline import collection, lake, roots, series
from pipeline.options import ReportError, ReportOptions
from pipeline.summary import build_summary

__all__ = ["SESSION_SQL_CONF", "ReportError", "ReportOptions", "run_report", "spark_session"]

# SQL settings the report relies on; set on any session it is given.
SESSION_SQL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    # broker=10.0.0.1%3A5701 and date=... stay strings
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    # readable by pyarrow and the console without INT96 quirks
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}


def spark_session(
    master: str | None = None,
    driver_memory: str | None = None,
    extra: dict[str, str] | None = None,
) -> SparkSession:
    """``--master``, else ``$SPARK_MASTER``, else ``local[*]``; small shuffles when local."""
    master = master or os.environ.get("SPARK_MASTER") or "local[*]"
    builder = (
        SparkSession.builder.appName("rookery-traffic-report")
        .master(master)
        .config("spark.ui.showConsoleProgress", "false")
    )
    conf = dict(SESSION_SQL_CONF)
    if master.startswith("local"):
        conf["spark.sql.shuffle.partitions"] = "8"
    if driver_memory:
        conf["spark.driver.memory"] = driver_memory
    conf.update(extra or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


# Spark types of the columns ``lake.ADDED`` may leave out of older files
ADDED_TYPES: dict[pa.DataType, DataType] = {pa.bool_(): BooleanType()}


def read_lake(spark: SparkSession, opts: ReportOptions, table: str) -> DataFrame:
    """One lake table restricted to [start, end), with ``t`` = epoch seconds.

    Spark takes the schema from one file.  Files written before a column was added
    (``lake.ADDED``) lack it, and read as null where the schema has it; when the file
    Spark read lacks it, the table is read again with the column in the schema (the
    files are listed twice, no footer read: cheaper than ``mergeSchema``).  Either way
    a missing value is the column's default.
    """
    path = Path(opts.lake) / table if "://" not in opts.lake else None
    location = str(path) if path is not None else f"{opts.lake.rstrip('/')}/{table}"
    if path is not None and not path.is_dir():
        raise ReportError(f"{location}: no such table in the lake")
    schema = lake.table_schema(table)
    added = lake.ADDED[table]
    df = spark.read.option("basePath", location).parquet(location)
    missing = set(schema.names) - set(df.columns) - set(added)
    if missing:
        raise ReportError(f"{location}: not a lake table (missing {sorted(missing)})")
    absent = [name for name in added if name not in df.columns]
    if absent:
        wanted = df.schema
        for name in absent:
            wanted = wanted.add(StructField(name, ADDED_TYPES[schema.field(name).type]))
        df = spark.read.schema(wanted).option("basePath", location).parquet(location)
    for name, default in added.items():
        df = df.withColumn(name, F.coalesce(F.col(name), F.lit(default)))
    if opts.start is not None:
        df = df.where(F.col("date") >= opts.start.strftime("%Y-%m-%d"))
        df = df.where(F.col("ts") >= F.lit(opts.start))
    if opts.end is not None:
        df = df.where(F.col("date") <= opts.end.strftime("%Y-%m-%d"))
        df = df.where(F.col("ts") < F.lit(opts.end))
    return df.select(*schema.names).withColumn("t", F.col("ts").cast("double"))


def _write(df: DataFrame, out: Path, name: str) -> str:
    df.write.mode("overwrite").parquet(str(out / name))
    return name


def run_report(opts: ReportOptions, spark: SparkSession | None = None) -> dict[str, Any]:
    """Compute every report table, write them and ``summary.json`` under ``opts.out``."""
    if opts.start and opts.end and opts.start >= opts.end:
        raise ReportError("--from must be before --to")
    if opts.gap_intervals < 1 or opts.message_bytes < 1 or not opts.link_gbps > 0:
        raise ReportError("--gap-intervals, --message-bytes and --link-gbps must be positive")
    if not opts.reconnect_allowance >= 0:
        raise ReportError("--reconnect-allowance must be 0 or more seconds")
    spark = spark or spark_session(opts.master, opts.driver_memory)
    for key, value in SESSION_SQL_CONF.items():
        spark.conf.set(key, value)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)

    broker_raw = read_lake(spark, opts, "broker_samples")
    queue_raw = read_lake(spark, opts, "queue_samples")
    peer_raw = read_lake(spark, opts, "peer_samples")
    bounds = broker_raw.agg(F.min("t"), F.max("t"), F.count(F.lit(1))).first()
    if bounds is None or not bounds[2]:
        raise ReportError("no broker samples in the lake for this period")
    first_t, last_t, broker_count = float(bounds[0]), float(bounds[1]), int(bounds[2])
    interval = opts.interval or series.infer_interval(broker_raw)
    if not interval > 0:
        raise ReportError("--interval must be positive")

    broker = series.stop_flags(
        series.counter_rates(
            broker_raw.select(*series.BROKER_KEYS, *series.BROKER_USED, *series.BROKER_COUNTERS),
            series.BROKER_KEYS,
            series.BROKER_COUNTERS,
            interval,
            spid=True,
        )
    ).persist()
    queue = series.counter_rates(
        queue_raw.select(*series.QUEUE_KEYS, *series.QUEUE_USED, *series.QUEUE_COUNTERS),
        series.QUEUE_KEYS,
        series.QUEUE_COUNTERS,
        interval,
        spid=False,
    ).persist()
    # Small results that are both written and read by the summary: computed once.
    broker_minute = series.broker_minute(broker).persist()
    cluster_minute = series.cluster_minute(broker_minute)
    trends = series.queue_trends(queue, last_t, opts).persist()
    backlogs = series.backlog_episodes(queue, interval, opts).persist()
    # Per interval bucket: the majority root and the first and last sample (presence).
    per_bucket = roots.majority_roots(broker_raw.select("broker", "spid", "root", "t"), interval)
    per_bucket = per_bucket.persist()
    gap_list = collection.collection_gaps(
        per_bucket, roots.block_buckets(interval), opts.gap_intervals
    )
    gaps = collection.explain_gaps(
        spark,
        series.heartbeat_gaps(broker, interval, last_t, opts),
        gap_list,
        interval,
        opts.reconnect_allowance,
    ).persist()
    restarts = series.restarts(broker).persist()
    links = series.link_states(peer_raw.select(*series.LINK_KEYS, *series.LINK_USED)).persist()
    flaps = series.link_flaps(links, opts).persist()
    outages = series.link_outages(links).persist()
    segments = roots.root_segments(per_bucket, interval, opts.gap_intervals)

    tables = {
        "broker_minute": _write(broker_minute, out, "broker_minute"),
        "queue_minute": _write(series.queue_minute(queue), out, "queue_minute"),
        "isr_xsr_minute": _write(
            series.isr_xsr_minute(broker_minute, cluster_minute), out, "isr_xsr_minute"
        ),
        "queue_trends": _write(trends, out, "queue_trends"),
        "backlogs": _write(backlogs, out, "backlogs"),
        "heartbeat_gaps": _write(gaps, out, "heartbeat_gaps"),
        "restarts": _write(restarts, out, "restarts"),
        "link_flaps": _write(flaps, out, "link_flaps"),
        "link_outages": _write(outages, out, "link_outages"),
    }
    timeline = roots.root_timeline(segments)
    roots.write_root_timeline(spark, timeline, out / "root_timeline")
    tables["root_timeline"] = "root_timeline"

    summary = build_summary(
        opts=opts, broker=broker, queue=queue, broker_minute=broker_minute,
        cluster_minute=cluster_minute, trends=trends, backlogs=backlogs, gaps=gaps,
        restarts=restarts, flaps=flaps, outages=series.significant_outages(outages, interval, opts),
        timeline=timeline, collection=gap_list, peer_raw=peer_raw, queue_raw=queue_raw,
        first_t=first_t, last_t=last_t, broker_count=broker_count, interval=interval,
    )  # fmt: skip
    summary["tables"] = {name: str(out / path) for name, path in tables.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    persisted = (broker, queue, broker_minute, trends, backlogs, gaps, restarts, links, flaps)
    for df in (*persisted, outages, per_bucket):
        df.unpersist()
    return summary


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``spark-submit pipeline/report.py``."""
    import argparse

    from pipeline.cli import add_report_arguments, run_report_command

    parser = argparse.ArgumentParser(prog="report.py", description="Rookery traffic report")
    add_report_arguments(parser)
    return run_report_command(parser.parse_args(argv), "report")


if __name__ == "__main__":
    raise SystemExit(main())
