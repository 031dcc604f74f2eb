"""Per-series stages of the report: rates, minute statistics, trends, backlogs, gaps, links.

Every window here is partitioned by one series: a broker, a queue (broker, vhost, queue)
or a link (broker, peer address).  A series is small next to the whole history, so the
executors work through whole series in parallel after one shuffle, and a stage's result
does not depend on how the series are spread over partitions.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.options import ReportError, ReportOptions

BROKER_KEYS = ["broker"]
QUEUE_KEYS = ["broker", "vhost", "queue"]
LINK_KEYS = ["broker", "peer_address"]
BROKER_COUNTERS = {
    "published_total": "in",
    "routed_total": "isr",
    "delivered_total": "out",
    "bridged_total": "bridged",
}
QUEUE_COUNTERS = {"enqueued_total": "in", "delivered_total": "out"}
# What the stages read of each table besides keys and counters: the rest never goes
# through a shuffle or into the cache.
BROKER_USED = ["ts", "t", "spid", "root", "stopping"]
QUEUE_USED = ["ts", "t", "messages"]
LINK_USED = ["ts", "t", "active"]


def by_time(keys: list[str]) -> Window:
    """The window of one series in time order (never without a partition: see the module)."""
    if not keys:
        raise ValueError("a window needs partition keys")
    return Window.partitionBy(*keys).orderBy("t")


def counter_rates(
    df: DataFrame, keys: list[str], counters: dict[str, str], interval: float, spid: bool
) -> DataFrame:
    """Per-sample counts and rates from monotonic counters, restarts handled.

    Keeps ``prev_t`` (null: a series' first sample, which has no rate) and, with ``spid``,
    ``prev_spid``; the previous counter values are dropped once used.
    """
    w = by_time(keys)
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
    return df.drop(*(f"prev_{counter}" for counter in counters))


def stop_flags(broker: DataFrame) -> DataFrame:
    """``stop_t``: when the broker's current run announced its planned stop (the time of
    the sample the console marked ``stopping``), null if it did not; ``prev_stop_t``: the
    same at the previous sample.

    The console marks the last sample it has when the ``stopping`` message arrives, and a
    broker handing its queues over may send a status or two more: every later sample of
    that run (same spid) is still on its way out.  Needs ``prev_spid`` (``counter_rates``);
    the windows are ``counter_rates``' own (by broker, in time order), so no new shuffle.
    """
    w = by_time(BROKER_KEYS)
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    new_run = F.col("prev_spid").isNull() | (F.col("spid") != F.col("prev_spid"))
    run_t = F.last(F.when(new_run, F.col("t")), ignorenulls=True).over(upto)
    marked_t = F.last(F.when(F.col("stopping"), F.col("t")), ignorenulls=True).over(upto)
    return (
        broker.select("*", run_t.alias("run_t"), marked_t.alias("marked_t"))
        .withColumn("stop_t", F.when(F.col("marked_t") >= F.col("run_t"), F.col("marked_t")))
        .withColumn("prev_stop_t", F.lag("stop_t").over(w))
        .drop("run_t", "marked_t")
    )


def infer_interval(broker: DataFrame) -> float:
    """The median time between consecutive samples of a broker, to the millisecond."""
    row = (
        broker.select((F.col("t") - F.lag("t").over(by_time(BROKER_KEYS))).alias("dt"))
        .where(F.col("dt") > 0)
        .agg(F.percentile_approx("dt", 0.5).alias("dt"))
        .first()
    )
    if row is None or row["dt"] is None:
        raise ReportError("cannot infer the heartbeat interval: give --interval")
    return round(float(row["dt"]), 3)


def _stats(prefix: str, rate: str) -> list[Column]:
    """avg, both percentiles from one ``percentile`` (one value map per group, not two), max."""
    col = F.col(rate)
    return [
        F.avg(col).alias(f"{prefix}_avg"),
        F.expr(f"percentile({rate}, array(0.5, 0.95))").alias(f"{prefix}_pct"),
        F.max(col).alias(f"{prefix}_max"),
    ]


def _stat_columns(prefix: str) -> list[Column]:
    """The columns of ``_stats`` as the tables have them: avg, p50, p95, max."""
    return [
        F.col(f"{prefix}_avg"),
        F.col(f"{prefix}_pct")[0].alias(f"{prefix}_p50"),
        F.col(f"{prefix}_pct")[1].alias(f"{prefix}_p95"),
        F.col(f"{prefix}_max"),
    ]


def _minute() -> Column:
    return F.date_trunc("minute", F.col("ts")).alias("minute")


def broker_minute(broker: DataFrame) -> DataFrame:
    """In, out and ISR statistics per broker per minute (samples that have a rate)."""
    return (
        broker.where(F.col("prev_t").isNotNull())
        .groupBy(*BROKER_KEYS, _minute())
        .agg(
            F.count(F.lit(1)).alias("samples"),
            *_stats("in", "r_in"),
            *_stats("out", "r_out"),
            *_stats("isr", "r_isr"),
        )
        .select(
            *BROKER_KEYS,
            "minute",
            "samples",
            *_stat_columns("in"),
            *_stat_columns("out"),
            *_stat_columns("isr"),
        )
    )


def queue_minute(queue: DataFrame) -> DataFrame:
    """In and out statistics and the ready count per queue per minute."""
    return (
        queue.where(F.col("prev_t").isNotNull())
        .groupBy(*QUEUE_KEYS, _minute())
        .agg(
            F.count(F.lit(1)).alias("samples"),
            *_stats("in", "r_in"),
            *_stats("out", "r_out"),
            F.max("messages").alias("messages_max"),
            F.max_by("messages", "t").alias("messages_last"),
        )
        .select(
            *QUEUE_KEYS,
            "minute",
            "samples",
            *_stat_columns("in"),
            *_stat_columns("out"),
            "messages_max",
            "messages_last",
        )
    )


def cluster_minute(brokers: DataFrame) -> DataFrame:
    """Cluster ISR and XSR per minute: the sum of the brokers' minute averages."""
    return brokers.groupBy("minute").agg(
        F.sum("isr_avg").alias("isr"),
        F.sum("out_avg").alias("xsr"),
        F.count(F.lit(1)).alias("brokers"),
    )


def isr_xsr_minute(brokers: DataFrame, cluster: DataFrame) -> DataFrame:
    """Per-broker and cluster-wide ISR/XSR in one table (``scope`` tells which)."""
    return brokers.select(
        F.lit("broker").alias("scope"),
        "broker",
        "minute",
        F.col("isr_avg").alias("isr"),
        F.col("out_avg").alias("xsr"),
        F.lit(1).cast("long").alias("brokers"),
    ).unionByName(
        cluster.select(
            F.lit("cluster").alias("scope"),
            F.lit(None).cast("string").alias("broker"),
            "minute",
            "isr",
            "xsr",
            "brokers",
        )
    )


def queue_trends(queue: DataFrame, last_t: float, opts: ReportOptions) -> DataFrame:
    """Least-squares slope of ready messages over time, whole period and the last window."""
    recent_from = last_t - opts.trend_window_seconds
    recent = F.col("t") >= F.lit(recent_from)
    whole = queue.groupBy(*QUEUE_KEYS).agg(
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
    w = by_time(QUEUE_KEYS)
    rising = F.col("messages") > F.lag("messages").over(w)
    runs = (
        queue.withColumn("rising", F.coalesce(rising, F.lit(False)))
        .withColumn("run", F.sum(F.when(F.col("rising"), 0).otherwise(1)).over(w))
        .withColumn("before", F.lag("messages").over(w))
        .where(F.col("rising"))
        .groupBy(*QUEUE_KEYS, "run")
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
    """Missing samples: between two samples, and at the end of the period.

    ``last_spid`` is the run the broker was in before the gap, ``stop_announced`` when
    that run announced a planned stop (null: it did not; ``stop_flags``).
    """
    missed = F.round((F.col("t") - F.col("prev_t")) / F.lit(interval)).cast("long") - 1
    inside = broker.where(F.col("prev_t").isNotNull()).where(missed >= opts.gap_intervals)
    inside = inside.select(
        "broker",
        F.timestamp_seconds(F.col("prev_t")).alias("last_seen"),
        F.timestamp_seconds(F.col("prev_t") + F.lit(interval)).alias("start"),
        F.col("ts").alias("end"),
        missed.alias("missed"),
        F.col("prev_spid").alias("last_spid"),
        F.timestamp_seconds(F.col("prev_stop_t")).alias("stop_announced"),
    )
    tail_missed = F.floor((F.lit(last_t) - F.col("last_t")) / F.lit(interval)).cast("long")
    tail = (
        broker.groupBy(*BROKER_KEYS)
        .agg(
            F.max("t").alias("last_t"),
            F.max_by("spid", "t").alias("last_spid"),
            F.max_by("stop_t", "t").alias("stop_t"),
        )
        .where(tail_missed >= opts.gap_intervals)
        .select(
            "broker",
            F.timestamp_seconds(F.col("last_t")).alias("last_seen"),
            F.timestamp_seconds(F.col("last_t") + F.lit(interval)).alias("start"),
            F.lit(None).cast("timestamp").alias("end"),
            tail_missed.alias("missed"),
            "last_spid",
            F.timestamp_seconds(F.col("stop_t")).alias("stop_announced"),
        )
    )
    return inside.unionByName(tail)


def restarts(broker: DataFrame) -> DataFrame:
    """Samples where a broker came back with a new spid or reset counters; ``planned``
    when the run before had announced a planned stop (``stop_flags``)."""
    return broker.where(F.col("restart")).select(
        "broker",
        "ts",
        F.col("prev_spid").alias("old_spid"),
        F.col("spid").alias("new_spid"),
        F.col("prev_stop_t").isNotNull().alias("planned"),
    )


def link_states(peer: DataFrame) -> DataFrame:
    """One observed state per link and sample: up if any spid listed at the address is active.

    A link is the observer's link to an address, whatever spid answers there: a restarted
    peer is listed twice (its old spid, gone, and its new one) in every sample after it
    came back.  Two rows of one sample come in any order in a window ordered by time, so
    reading them as states read a change at every sample (hundreds of "flaps" after one
    restart).  A sample where the peer is not listed, or the observer sent no heartbeat,
    has no row: it is no observation, never a change.  Repartitioned by link first, so
    the windows over the states reuse this shuffle.
    """
    return (
        peer.repartition(*LINK_KEYS)
        .groupBy(*LINK_KEYS, "ts", "t")
        .agg(F.max("active").alias("active"))
    )


def link_flaps(states: DataFrame, opts: ReportOptions) -> DataFrame:
    """Bursts of up/down changes between consecutive observed states of one link."""
    w = by_time(LINK_KEYS)
    changes = (
        states.withColumn("prev_active", F.lag("active").over(w))
        .where(F.col("prev_active").isNotNull() & (F.col("active") != F.col("prev_active")))
        .select(*LINK_KEYS, "ts", "t", "active")
    )
    burst = F.col("t") - F.lag("t").over(w)
    return (
        changes.withColumn(
            "new_burst", F.when(burst.isNull() | (burst > opts.flap_window), 1).otherwise(0)
        )
        .withColumn("burst", F.sum("new_burst").over(w))
        .groupBy(*LINK_KEYS, "burst")
        .agg(
            F.min("ts").alias("start"),
            F.max("ts").alias("end"),
            F.count(F.lit(1)).alias("transitions"),
            F.sum(F.when(~F.col("active"), 1).otherwise(0)).alias("downs"),
        )
        .where(F.col("transitions") >= opts.flap_min_transitions)
        .drop("burst")
    )


def link_outages(states: DataFrame) -> DataFrame:
    """Each run of down observations of a link, as one outage.

    ``start`` is the first sample that saw the link down, ``end`` the next that saw it up
    (null: still down at the link's last observation), ``last_up`` the last that saw it up
    before (null: down from its first observation).  Samples missing in between (the
    observer silent, or the peer not listed) neither end nor split the outage.  Starting at
    the first down sample rather than after ``last_up`` keeps an observer's own silence
    out: a restarted observer that lists its peers down for one sample before their
    statuses arrive shows a one-sample outage, not one as long as its own restart.
    """
    w = by_time(LINK_KEYS)
    before = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    after = w.rowsBetween(Window.currentRow, Window.unboundedFollowing)
    up_ts = F.when(F.col("active"), F.col("ts"))
    runs = (
        states.withColumn("run", F.sum(F.col("active").cast("long")).over(before))
        .withColumn("last_up", F.last(up_ts, ignorenulls=True).over(before))
        .withColumn("next_up", F.first(up_ts, ignorenulls=True).over(after))
        .where(~F.col("active"))
        .groupBy(*LINK_KEYS, "run")
        .agg(
            F.max("last_up").alias("last_up"),
            F.min("ts").alias("start"),
            F.max("next_up").alias("end"),
            F.count(F.lit(1)).alias("down_samples"),
        )
    )
    return runs.select(
        *LINK_KEYS,
        "last_up",
        "start",
        "end",
        (F.col("end").cast("double") - F.col("start").cast("double")).alias("seconds"),
        "down_samples",
    )


def significant_outages(outages: DataFrame, interval: float, opts: ReportOptions) -> DataFrame:
    """Link outages as long as a heartbeat gap must be: ``gap_intervals`` samples not up.

    A flap's short downs stay in the ``link_outages`` table and out of the incidents.
    """
    samples = F.round(F.col("seconds") / F.lit(interval))
    return outages.where(
        F.when(F.col("end").isNull(), F.col("down_samples")).otherwise(samples)
        >= opts.gap_intervals
    )
