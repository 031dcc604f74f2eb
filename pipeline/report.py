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
- Root timeline: each interval bucket ``floor(epoch / interval)`` takes the root
  most brokers report in it (spids mapped to broker names); a root failover is a
  change from root X to another root Y (possibly through buckets without a root).
- Link flap: at least 4 changes of a peer link's ``active``, each within
  ``flap_window`` seconds of the previous one, seen by one broker.
- Backlog: a queue whose ready count rose at every sample (at least 5 samples) for
  at least ``backlog_min_seconds`` and by at least ``backlog_min_growth`` messages.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # spark-submit pipeline/report.py: make `pipeline` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline import lake

CAPACITY_FORMULA = (
    "Seed 000: a broker switching each message into Q queues has an internal switching rate "
    "(ISR) of Q x C, C being what one broker can take in (messages/s); B brokers fanning out "
    "from the root give B x Q x C.  Here B = brokers seen, Q = median queues per broker, "
    "C = the highest one-minute average publish rate any broker sustained (a measured lower "
    "bound of its capacity).  Deliveries to clients (XSR) can never exceed the ISR and are "
    "capped per broker by its client bandwidth: XSR <= B x min(Q x C, link_bytes_per_s / "
    "message_bytes).  Utilisation = measured peak / estimate."
)


class ReportError(ValueError):
    """The lake or the arguments cannot give a report (missing tables, empty period)."""


@dataclass
class ReportOptions:
    lake: str
    out: str
    start: datetime | None = None
    end: datetime | None = None
    master: str | None = None
    interval: float | None = None
    gap_intervals: int = 3
    message_bytes: int = 1000
    link_gbps: float = 1.0
    driver_memory: str | None = None
    flap_window: float = 300.0
    flap_min_transitions: int = 4
    backlog_min_seconds: float = 300.0
    backlog_min_growth: int = 100
    trend_window_seconds: float = 900.0


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


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _epoch_iso(seconds: float | None) -> str | None:
    return None if seconds is None else _iso(datetime.fromtimestamp(seconds, tz=UTC))


def read_lake(spark: SparkSession, opts: ReportOptions, table: str) -> DataFrame:
    """One lake table restricted to [start, end), with ``t`` = epoch seconds."""
    path = Path(opts.lake) / table if "://" not in opts.lake else None
    location = str(path) if path is not None else f"{opts.lake.rstrip('/')}/{table}"
    if path is not None and not path.is_dir():
        raise ReportError(f"{location}: no such table in the lake")
    schema = lake.table_schema(table)
    df = spark.read.option("basePath", location).parquet(location)
    missing = set(schema.names) - set(df.columns)
    if missing:
        raise ReportError(f"{location}: not a lake table (missing {sorted(missing)})")
    if opts.start is not None:
        df = df.where(F.col("date") >= opts.start.strftime("%Y-%m-%d"))
        df = df.where(F.col("ts") >= F.lit(opts.start))
    if opts.end is not None:
        df = df.where(F.col("date") <= opts.end.strftime("%Y-%m-%d"))
        df = df.where(F.col("ts") < F.lit(opts.end))
    return df.select(*schema.names).withColumn("t", F.col("ts").cast("double"))


def _stats(prefix: str, rate: str) -> list:
    col = F.col(rate)
    return [
        F.avg(col).alias(f"{prefix}_avg"),
        F.expr(f"percentile({rate}, 0.5)").alias(f"{prefix}_p50"),
        F.expr(f"percentile({rate}, 0.95)").alias(f"{prefix}_p95"),
        F.max(col).alias(f"{prefix}_max"),
    ]


def _counter_rates(
    df: DataFrame, keys: list[str], counters: dict[str, str], interval: float, spid: bool
) -> DataFrame:
    """Per-sample counts and rates from monotonic counters, restarts handled."""
    w = Window.partitionBy(*keys).orderBy("t")
    df = df.withColumn("prev_t", F.lag("t").over(w))
    restart = F.lit(False)
    if spid:
        df = df.withColumn("prev_spid", F.lag("spid").over(w))
        restart = restart | (F.col("spid") != F.col("prev_spid"))
    for counter in counters:
        df = df.withColumn(f"prev_{counter}", F.lag(counter).over(w))
        restart = restart | (F.col(counter) < F.col(f"prev_{counter}"))
    df = df.withColumn("restart", F.col("prev_t").isNotNull() & restart)
    dt = F.col("t") - F.col("prev_t")
    for counter, name in counters.items():
        count = F.when(F.col("prev_t").isNull(), None).otherwise(
            F.when(F.col("restart"), F.col(counter)).otherwise(
                F.col(counter) - F.col(f"prev_{counter}")
            )
        )
        df = df.withColumn(f"n_{name}", count)
        df = df.withColumn(
            f"r_{name}",
            F.when(F.col("restart"), F.col(f"n_{name}") / F.lit(interval)).otherwise(
                F.col(f"n_{name}") / dt
            ),
        )
    return df


def infer_interval(broker: DataFrame) -> float:
    """The median time between consecutive samples of a broker, to the millisecond."""
    w = Window.partitionBy("broker").orderBy("t")
    row = (
        broker.select((F.col("t") - F.lag("t").over(w)).alias("dt"))
        .where(F.col("dt") > 0)
        .agg(F.percentile_approx("dt", 0.5).alias("dt"))
        .first()
    )
    if row is None or row["dt"] is None:
        raise ReportError("cannot infer the heartbeat interval: give --interval")
    return round(float(row["dt"]), 3)


def _write(df: DataFrame, out: Path, name: str) -> str:
    target = out / name
    df.write.mode("overwrite").parquet(str(target))
    return name


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.collect()]


def run_report(opts: ReportOptions, spark: SparkSession | None = None) -> dict[str, Any]:
    """Compute every report table, write them and ``summary.json`` under ``opts.out``."""
    if opts.start and opts.end and opts.start >= opts.end:
        raise ReportError("--from must be before --to")
    if opts.gap_intervals < 1 or opts.message_bytes < 1 or not opts.link_gbps > 0:
        raise ReportError("--gap-intervals, --message-bytes and --link-gbps must be positive")
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
    interval = opts.interval or infer_interval(broker_raw)
    if not interval > 0:
        raise ReportError("--interval must be positive")

    broker = _counter_rates(
        broker_raw,
        ["broker"],
        {"published_total": "in", "routed_total": "isr", "delivered_total": "out"},
        interval,
        spid=True,
    ).persist()
    queue = _counter_rates(
        queue_raw,
        ["broker", "vhost", "queue"],
        {"enqueued_total": "in", "delivered_total": "out"},
        interval,
        spid=False,
    ).persist()

    minute = F.date_trunc("minute", F.col("ts")).alias("minute")
    broker_minute = (
        broker.where(F.col("prev_t").isNotNull())
        .groupBy("broker", minute)
        .agg(
            F.count(F.lit(1)).alias("samples"),
            *_stats("in", "r_in"),
            *_stats("out", "r_out"),
            *_stats("isr", "r_isr"),
        )
        .persist()
    )
    queue_minute = (
        queue.where(F.col("prev_t").isNotNull())
        .groupBy("broker", "vhost", "queue", minute)
        .agg(
            F.count(F.lit(1)).alias("samples"),
            *_stats("in", "r_in"),
            *_stats("out", "r_out"),
            F.max("messages").alias("messages_max"),
            F.max_by("messages", "t").alias("messages_last"),
        )
    )
    cluster_minute = broker_minute.groupBy("minute").agg(
        F.sum("isr_avg").alias("isr"),
        F.sum("out_avg").alias("xsr"),
        F.count(F.lit(1)).alias("brokers"),
    )
    isr_xsr_minute = broker_minute.select(
        F.lit("broker").alias("scope"),
        "broker",
        "minute",
        F.col("isr_avg").alias("isr"),
        F.col("out_avg").alias("xsr"),
        F.lit(1).cast("long").alias("brokers"),
    ).unionByName(
        cluster_minute.select(
            F.lit("cluster").alias("scope"),
            F.lit(None).cast("string").alias("broker"),
            "minute",
            "isr",
            "xsr",
            "brokers",
        )
    )

    trends = queue_trends(queue, last_t, opts)
    backlogs = backlog_episodes(queue, interval, opts)
    gaps = heartbeat_gaps(broker, interval, last_t, opts)
    restarts = broker.where(F.col("restart")).select(
        "broker", "ts", F.col("prev_spid").alias("old_spid"), F.col("spid").alias("new_spid")
    )
    flaps = link_flaps(peer_raw, opts)
    segments = root_segments(broker_raw, interval)

    tables = {
        "broker_minute": _write(broker_minute.drop("t"), out, "broker_minute"),
        "queue_minute": _write(queue_minute, out, "queue_minute"),
        "isr_xsr_minute": _write(isr_xsr_minute, out, "isr_xsr_minute"),
        "queue_trends": _write(trends, out, "queue_trends"),
        "backlogs": _write(backlogs, out, "backlogs"),
        "heartbeat_gaps": _write(gaps, out, "heartbeat_gaps"),
        "restarts": _write(restarts, out, "restarts"),
        "link_flaps": _write(flaps, out, "link_flaps"),
    }
    timeline = root_timeline(segments)
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
    ).coalesce(1).write.mode("overwrite").parquet(str(out / "root_timeline"))
    tables["root_timeline"] = "root_timeline"

    summary = build_summary(
        spark, opts, broker, queue, broker_minute, cluster_minute, trends, backlogs, gaps,
        restarts, flaps, timeline, peer_raw, queue_raw, first_t, last_t, broker_count, interval,
    )  # fmt: skip
    summary["tables"] = {name: str(out / path) for name, path in tables.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    broker.unpersist()
    queue.unpersist()
    broker_minute.unpersist()
    return summary


def queue_trends(queue: DataFrame, last_t: float, opts: ReportOptions) -> DataFrame:
    """Least-squares slope of ready messages over time, whole period and the last window."""
    keys = ["broker", "vhost", "queue"]
    recent_from = last_t - opts.trend_window_seconds
    recent = F.col("t") >= F.lit(recent_from)
    whole = queue.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("samples"),
        F.min("ts").alias("first_ts"),
        F.max("ts").alias("last_ts"),
        F.min_by("messages", "t").alias("messages_first"),
        F.max_by("messages", "t").alias("messages_last"),
        F.max("messages").alias("messages_max"),
        (F.covar_pop("t", "messages") / F.var_pop("t")).alias("slope_per_s"),
        (
            F.covar_pop(F.when(recent, F.col("t")), F.when(recent, F.col("messages")))
            / F.var_pop(F.when(recent, F.col("t")))
        ).alias("recent_slope_per_s"),
        F.min_by(F.when(recent, F.col("messages")), F.when(recent, F.col("t"))).alias(
            "recent_first"
        ),
    )
    return whole.withColumn(
        "growing",
        F.coalesce(
            (F.col("recent_slope_per_s") > 0)
            & (F.col("messages_last") - F.col("recent_first") >= opts.backlog_min_growth),
            F.lit(False),
        ),
    ).drop("recent_first")


def backlog_episodes(queue: DataFrame, interval: float, opts: ReportOptions) -> DataFrame:
    """Runs of samples where a queue's ready count rose every time."""
    keys = ["broker", "vhost", "queue"]
    w = Window.partitionBy(*keys).orderBy("t")
    rising = F.col("messages") > F.lag("messages").over(w)
    runs = (
        queue.withColumn("rising", F.coalesce(rising, F.lit(False)))
        .withColumn("run", F.sum(F.when(F.col("rising"), 0).otherwise(1)).over(w))
        .withColumn("before", F.lag("messages").over(w))
        .where(F.col("rising"))
        .groupBy(*keys, "run")
        .agg(
            F.min("ts").alias("start"),
            F.max("ts").alias("end"),
            F.count(F.lit(1)).alias("samples"),
            (F.max("messages") - F.min("before")).alias("growth"),
            F.max("messages").alias("messages_max"),
        )
        .drop("run")
    )
    duration = F.col("end").cast("double") - F.col("start").cast("double") + F.lit(interval)
    return runs.where(
        (duration >= opts.backlog_min_seconds)
        & (F.col("samples") >= 5)
        & (F.col("growth") >= opts.backlog_min_growth)
    ).withColumn("growth_per_s", F.col("growth") / duration)


def heartbeat_gaps(
    broker: DataFrame, interval: float, last_t: float, opts: ReportOptions
) -> DataFrame:
    """Missing samples: between two samples, and at the end of the period."""
    missed = F.round((F.col("t") - F.col("prev_t")) / F.lit(interval)).cast("long") - 1
    inside = broker.where(F.col("prev_t").isNotNull()).where(missed >= opts.gap_intervals)
    inside = inside.select(
        "broker",
        F.timestamp_seconds(F.col("prev_t")).alias("last_seen"),
        F.timestamp_seconds(F.col("prev_t") + F.lit(interval)).alias("start"),
        F.col("ts").alias("end"),
        missed.alias("missed"),
    )
    tail_missed = F.floor((F.lit(last_t) - F.col("last_t")) / F.lit(interval)).cast("long")
    tail = (
        broker.groupBy("broker")
        .agg(F.max("t").alias("last_t"))
        .where(tail_missed >= opts.gap_intervals)
        .select(
            "broker",
            F.timestamp_seconds(F.col("last_t")).alias("last_seen"),
            F.timestamp_seconds(F.col("last_t") + F.lit(interval)).alias("start"),
            F.lit(None).cast("timestamp").alias("end"),
            tail_missed.alias("missed"),
        )
    )
    return inside.unionByName(tail)


def link_flaps(peer: DataFrame, opts: ReportOptions) -> DataFrame:
    """Bursts of active/inactive changes on one broker's link to one peer address."""
    keys = ["broker", "peer_address"]
    w = Window.partitionBy(*keys).orderBy("t")
    changes = (
        peer.withColumn("prev_active", F.lag("active").over(w))
        .where(F.col("prev_active").isNotNull() & (F.col("active") != F.col("prev_active")))
        .select(*keys, "ts", "t", "active")
    )
    burst = F.col("t") - F.lag("t").over(w)
    return (
        changes.withColumn(
            "new_burst", F.when(burst.isNull() | (burst > opts.flap_window), 1).otherwise(0)
        )
        .withColumn("burst", F.sum("new_burst").over(w))
        .groupBy(*keys, "burst")
        .agg(
            F.min("ts").alias("start"),
            F.max("ts").alias("end"),
            F.count(F.lit(1)).alias("transitions"),
            F.sum(F.when(~F.col("active"), 1).otherwise(0)).alias("downs"),
        )
        .where(F.col("transitions") >= opts.flap_min_transitions)
        .drop("burst")
    )


def root_segments(broker: DataFrame, interval: float) -> list[dict[str, Any]]:
    """Consecutive interval buckets with the same majority root (names, or None)."""
    names = broker.select(F.col("spid").alias("root"), F.col("broker").alias("root_name"))
    names = names.dropDuplicates(["root"])
    votes = (
        broker.select(F.floor(F.col("t") / F.lit(interval)).alias("bucket"), "root")
        .join(F.broadcast(names), "root", "left")
        .select("bucket", F.coalesce("root_name", "root", F.lit("")).alias("root"))
        .groupBy("bucket", "root")
        .count()
    )
    best = Window.partitionBy("bucket").orderBy(F.desc("count"), F.asc("root"))
    per_bucket = votes.withColumn("rank", F.row_number().over(best)).where(F.col("rank") == 1)
    order = Window.orderBy("bucket")
    changed = F.col("root") != F.coalesce(F.lag("root").over(order), F.lit("\x00"))
    segments = (
        per_bucket.withColumn("segment", F.sum(F.when(changed, 1).otherwise(0)).over(order))
        .groupBy("segment", "root")
        .agg(F.min("bucket").alias("first"), F.max("bucket").alias("last"))
        .orderBy("segment")
    )
    return [
        {
            "root": row["root"] or None,
            "start": row["first"] * interval,
            "end": (row["last"] + 1) * interval,
        }
        for row in segments.collect()
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
                {"at": _epoch_iso(seg["start"]), "from": previous["root"], "to": seg["root"]}
            )
            failovers.append(
                {
                    "kind": "root_failover",
                    "broker": previous["root"],
                    "start": _epoch_iso(previous["end"]),
                    "end": _epoch_iso(seg["start"]),
                    "details": {
                        "new_root": seg["root"],
                        "no_root_seconds": round(seg["start"] - previous["end"], 6),
                    },
                }
            )
        previous = seg
    gaps = [
        {"start": _epoch_iso(s["start"]), "end": _epoch_iso(s["end"]), "seconds": s["seconds"]}
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


def _first(df: DataFrame, order: Any) -> dict[str, Any] | None:
    row = df.orderBy(order).first()
    return None if row is None else row.asDict()


def _incident(
    kind: str, row: dict[str, Any], start: datetime | None, end: datetime | None, **details: Any
) -> dict[str, Any]:
    """One entry of summary.json's ``incidents`` from a row of a report table."""
    return {
        "kind": kind,
        "broker": row["broker"],
        "start": _iso(start),
        "end": _iso(end),
        "details": details,
    }


def build_summary(
    spark: SparkSession,
    opts: ReportOptions,
    broker: DataFrame,
    queue: DataFrame,
    broker_minute: DataFrame,
    cluster_minute: DataFrame,
    trends: DataFrame,
    backlogs: DataFrame,
    gaps: DataFrame,
    restarts: DataFrame,
    flaps: DataFrame,
    timeline: dict[str, Any],
    peer_raw: DataFrame,
    queue_raw: DataFrame,
    first_t: float,
    last_t: float,
    broker_count: int,
    interval: float,
) -> dict[str, Any]:
    """summary.json: period, brokers, totals, peaks, capacity, incidents."""
    counted = ("published", "routed", "delivered")
    per_broker = {
        r["broker"]: {k: int(r[k] or 0) for k in counted}
        for r in broker.groupBy("broker")
        .agg(
            F.sum("n_in").alias("published"),
            F.sum("n_isr").alias("routed"),
            F.sum("n_out").alias("delivered"),
        )
        .collect()
    }
    # The cluster's totals add up the brokers' (one Spark job, not two).
    totals = {k: sum(counts[k] for counts in per_broker.values()) for k in counted}
    brokers = sorted(per_broker)
    isr_peak = _first(cluster_minute, F.desc("isr"))
    xsr_peak = _first(cluster_minute, F.desc("xsr"))
    in_peak = _first(broker_minute.select("broker", "minute", "in_avg"), F.desc("in_avg"))
    backlog_peak = _first(
        queue.select("broker", "vhost", "queue", "ts", "messages"), F.desc("messages")
    )
    queues_per_broker = (
        queue.groupBy("broker")
        .agg(F.countDistinct("vhost", "queue").alias("q"))
        .agg(F.percentile_approx("q", 0.5))
        .first()[0]
    )

    b = len(brokers)
    q = int(queues_per_broker or 0)
    c = float(in_peak["in_avg"]) if in_peak else 0.0
    link_mps = opts.link_gbps * 1e9 / 8 / opts.message_bytes
    isr_est = b * q * c
    xsr_est = b * min(q * c, link_mps)
    capacity = {
        "formula": CAPACITY_FORMULA,
        "B": b,
        "Q": q,
        "C_messages_per_s": c,
        "C_broker": in_peak["broker"] if in_peak else None,
        "fanout_measured": (totals["routed"] / totals["published"])
        if totals["published"]
        else None,
        "link_messages_per_s": link_mps,
        "isr_estimate": isr_est,
        "xsr_estimate": xsr_est,
        "isr_seed_reference": b * q * 10_000,
        "isr_peak_measured": isr_peak["isr"] if isr_peak else None,
        "xsr_peak_measured": xsr_peak["xsr"] if xsr_peak else None,
        "isr_utilisation": (isr_peak["isr"] / isr_est) if isr_peak and isr_est else None,
        "xsr_utilisation": (xsr_peak["xsr"] / xsr_est) if xsr_peak and xsr_est else None,
    }

    incidents: list[dict[str, Any]] = list(timeline["failovers"])
    for row in _rows(gaps):
        incidents.append(
            _incident("broker_outage", row, row["start"], row["end"], missed_samples=row["missed"])
        )
    for row in _rows(restarts):
        incidents.append(
            _incident(
                "restart", row, row["ts"], row["ts"], spid=row["new_spid"], old_spid=row["old_spid"]
            )
        )
    for row in _rows(backlogs):
        incidents.append(
            _incident(
                "backlog",
                row,
                row["start"],
                row["end"],
                vhost=row["vhost"],
                queue=row["queue"],
                growth=int(row["growth"]),
                growth_per_s=row["growth_per_s"],
            )
        )
    for row in _rows(flaps):
        incidents.append(
            _incident(
                "link_flap",
                row,
                row["start"],
                row["end"],
                peer_address=row["peer_address"],
                transitions=row["transitions"],
            )
        )
    incidents.sort(key=lambda i: (i["start"] or "", i["kind"], i["broker"]))

    growing = [
        {k: r[k] for k in ("broker", "vhost", "queue", "messages_last", "recent_slope_per_s")}
        for r in _rows(trends.where(F.col("growing")))
    ]
    return {
        "period": {
            "from": _iso(opts.start) or _epoch_iso(first_t),
            "to": _iso(opts.end) or _epoch_iso(last_t),
            "first_sample": _epoch_iso(first_t),
            "last_sample": _epoch_iso(last_t),
            "seconds": round(last_t - first_t, 6),
        },
        "interval_s": interval,
        "brokers": brokers,
        "samples": {
            "broker_samples": broker_count,
            "queue_samples": queue_raw.count(),
            "peer_samples": peer_raw.count(),
        },
        "totals": {**totals, "per_broker": per_broker},
        "peaks": {
            "cluster_isr": {"value": isr_peak["isr"], "minute": _iso(isr_peak["minute"])}
            if isr_peak
            else None,
            "cluster_xsr": {"value": xsr_peak["xsr"], "minute": _iso(xsr_peak["minute"])}
            if xsr_peak
            else None,
            "broker_in": {
                "value": in_peak["in_avg"],
                "broker": in_peak["broker"],
                "minute": _iso(in_peak["minute"]),
            }
            if in_peak
            else None,
            "queue_backlog": {
                "messages": backlog_peak["messages"],
                "broker": backlog_peak["broker"],
                "vhost": backlog_peak["vhost"],
                "queue": backlog_peak["queue"],
                "ts": _iso(backlog_peak["ts"]),
            }
            if backlog_peak
            else None,
        },
        "capacity": capacity,
        "root": {
            "timeline": [
                {"root": s["root"], "start": _epoch_iso(s["start"]), "end": _epoch_iso(s["end"])}
                for s in timeline["segments"]
            ],
            "changes": timeline["changes"],
            "no_root": timeline["no_root"],
            "no_root_seconds": timeline["no_root_seconds"],
        },
        "queues_growing": growing,
        "incidents": incidents,
        "definitions": {
            "rates": "counter difference / time since the previous sample; "
            "after a restart: counter / interval",
            "isr": "messages routed into queues per second (routed_total)",
            "xsr": "messages delivered to clients per second (delivered_total)",
            "heartbeat_gap": f"at least {opts.gap_intervals} consecutive samples missing",
            "link_flap": (
                f">= {opts.flap_min_transitions} active changes, each <= {opts.flap_window} s "
                "after the previous one"
            ),
            "backlog": (
                f"ready count rising at every sample for >= {opts.backlog_min_seconds} s "
                f"and >= {opts.backlog_min_growth} messages"
            ),
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``spark-submit pipeline/report.py``."""
    import argparse

    from pipeline.cli import add_report_arguments, run_report_command

    parser = argparse.ArgumentParser(prog="report.py", description="Rookery traffic report")
    add_report_arguments(parser)
    return run_report_command(parser.parse_args(argv), "report")


if __name__ == "__main__":
    raise SystemExit(main())
