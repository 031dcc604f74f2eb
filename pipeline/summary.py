"""summary.json: period, brokers, totals, peaks, capacity, root changes, incidents, outages.

Built on the driver from aggregated rows only (a few per broker, queue or incident), so
its size does not grow with the history.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.collection import summary_gaps
from pipeline.incidents import build_incidents, merge_outages, outage_incident
from pipeline.isotime import epoch_iso, iso
from pipeline.options import ReportOptions

__all__ = ["build_summary", "epoch_iso", "iso", "merge_outages", "outage_incident"]

CAPACITY_FORMULA = (
    "Seed 000: a broker switching each message into Q queues has an internal switching rate "
    "(ISR) of Q x C, C being what one broker can take in (messages/s); B brokers fanning out "
    "from the root give B x Q x C.  Here B = brokers seen, Q = median queues per broker, "
    "C = the highest one-minute average publish rate any broker sustained (a measured lower "
    "bound of its capacity).  Deliveries to clients (XSR) can never exceed the ISR and are "
    "capped per broker by its client bandwidth: XSR <= B x min(Q x C, link_bytes_per_s / "
    "message_bytes).  Utilisation = measured peak / estimate."
)


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.collect()]


def _first(df: DataFrame, order: Any) -> dict[str, Any] | None:
    row = df.orderBy(order).first()
    return None if row is None else row.asDict()


def build_summary(
    *,
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
    outages: DataFrame,
    timeline: dict[str, Any],
    collection: list[dict[str, Any]],
    peer_raw: DataFrame,
    queue_raw: DataFrame,
    first_t: float,
    last_t: float,
    broker_count: int,
    interval: float,
) -> dict[str, Any]:
    """summary.json: period, brokers, totals, peaks, capacity, incidents.

    ``gaps`` are the heartbeat gaps with their cause (``collection.explain_gaps``),
    ``collection`` the collection gaps (``collection.collection_gaps``).
    """
    counted = ("published", "routed", "delivered", "bridged")
    per_broker = {
        r["broker"]: {k: int(r[k] or 0) for k in counted}
        for r in broker.groupBy("broker")
        .agg(
            F.sum("n_in").alias("published"),
            F.sum("n_isr").alias("routed"),
            F.sum("n_out").alias("delivered"),
            F.sum("n_bridged").alias("bridged"),
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

    incidents, merged = build_incidents(
        timeline=timeline,
        collection=collection,
        gaps=_rows(gaps),
        link_outages=_rows(outages),
        restarts=_rows(restarts),
        backlogs=_rows(backlogs),
        flaps=_rows(flaps),
        interval=interval,
        allowance=opts.reconnect_allowance,
    )

    growing = [
        {k: r[k] for k in ("broker", "vhost", "queue", "messages_last", "recent_slope_per_s")}
        for r in _rows(trends.where(F.col("growing")))
    ]
    return {
        "period": {
            "from": iso(opts.start) or epoch_iso(first_t),
            "to": iso(opts.end) or epoch_iso(last_t),
            "first_sample": epoch_iso(first_t),
            "last_sample": epoch_iso(last_t),
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
            "cluster_isr": {"value": isr_peak["isr"], "minute": iso(isr_peak["minute"])}
            if isr_peak
            else None,
            "cluster_xsr": {"value": xsr_peak["xsr"], "minute": iso(xsr_peak["minute"])}
            if xsr_peak
            else None,
            "broker_in": {
                "value": in_peak["in_avg"],
                "broker": in_peak["broker"],
                "minute": iso(in_peak["minute"]),
            }
            if in_peak
            else None,
            "queue_backlog": {
                "messages": backlog_peak["messages"],
                "broker": backlog_peak["broker"],
                "vhost": backlog_peak["vhost"],
                "queue": backlog_peak["queue"],
                "ts": iso(backlog_peak["ts"]),
            }
            if backlog_peak
            else None,
        },
        "capacity": capacity,
        "root": {
            "timeline": [
                {"root": s["root"], "start": epoch_iso(s["start"]), "end": epoch_iso(s["end"])}
                for s in timeline["segments"]
            ],
            "changes": timeline["changes"],
            "no_root": timeline["no_root"],
            "no_root_seconds": timeline["no_root_seconds"],
        },
        "console_gaps": summary_gaps(collection),
        "queues_growing": growing,
        "incidents": incidents,
        "outages": merged,
        "definitions": {
            "rates": "counter difference / time since the previous sample; "
            "after a restart: counter / interval",
            "isr": "messages routed into queues per second (routed_total)",
            "xsr": "messages delivered to clients per second (delivered_total)",
            "bridged": "messages the brokers' bridges (shovels) forwarded to their "
            "destinations (bridged_total)",
            "heartbeat_gap": f"at least {opts.gap_intervals} consecutive samples missing",
            "link": "a broker's link to a peer address, up at a sample if any spid "
            "listed at that address is active; a sample without the peer listed, or "
            "without the broker's heartbeat, is no observation",
            "link_flap": (
                f">= {opts.flap_min_transitions} changes between consecutive observed "
                f"states of one link, each <= {opts.flap_window} s after the previous one"
            ),
            "outage": (
                "toward a broker: its heartbeat gaps and its peers' runs of down "
                f"observations (>= {opts.gap_intervals} samples, from the first sample "
                "that saw it down to the next that saw it up), one outage while they "
                "overlap, from the earliest start to the latest end; a heartbeat gap "
                "explained by a console gap or a planned stop is none"
            ),
            "console_gap": (
                f">= {opts.gap_intervals} intervals without a sample of any broker (the "
                "console was away), from the last sample before to the first after; it "
                "explains a broker's heartbeat gap that starts no earlier than one interval "
                f"before it and ends within {opts.reconnect_allowance} s (the reconnect "
                "allowance) of its end"
            ),
            "planned_stop": (
                "a heartbeat gap after the broker announced a planned stop (a sample marked "
                "stopping in the same run), from its last sample to its return"
            ),
            "restart": (
                "a new spid or counters that went down: planned_restart after a planned "
                "stop, crash_restart after anything else"
            ),
            "no_root": (
                "interval buckets where most brokers reporting saw no root; console gaps "
                "are no such time"
            ),
            "backlog": (
                f"ready count rising at every sample for >= {opts.backlog_min_seconds} s "
                f"and >= {opts.backlog_min_growth} messages"
            ),
        },
    }
