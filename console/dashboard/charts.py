"""The overview's message-rate chart: cluster-wide rates per time bucket from heartbeats."""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from typing import Any

from django.core.cache import cache
from django.db.models import Max
from django.utils import timezone

from clusterapi.models import Broker, HeartbeatSample

#: how much history the chart shows
WINDOW_SECONDS = 300
SERIES = ("published", "routed", "delivered")


def bucket_seconds() -> int:
    """One point per slowest heartbeat (at least a second), so every broker's status
    falls in every bucket and the cluster-wide sum does not saw up and down."""
    slowest = Broker.objects.aggregate(m=Max("heartbeat_interval"))["m"] or 1.0
    return max(1, math.ceil(slowest))


def message_rates(
    window: int = WINDOW_SECONDS, now: dt.datetime | None = None, bucket: int | None = None
) -> dict[str, Any]:
    """``{"t": [epoch s], "published": [...], "routed": [...], "delivered": [...]}``.

    Each point is the sum over brokers of each broker's mean rate in that bucket
    (messages per second). The bucket still filling is left out: its sum would
    lack the brokers that have not reported in it yet.
    """
    now = now or timezone.now()
    bucket = bucket or bucket_seconds()
    rows = HeartbeatSample.objects.filter(
        time__gte=now - dt.timedelta(seconds=window), time__lte=now
    ).values_list("broker_id", "time", "rate_published", "rate_routed", "rate_delivered")
    # bucket start -> broker -> list of (published, routed, delivered)
    buckets: dict[int, dict[int, list[tuple[float, float, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for broker_id, time, published, routed, delivered in rows:
        start = int(time.timestamp()) // bucket * bucket
        buckets[start][broker_id].append((published, routed, delivered))
    complete_before = now.timestamp() - bucket
    out: dict[str, list[float]] = {"t": [], **{name: [] for name in SERIES}}
    for start in sorted(buckets):
        if start > complete_before:
            continue
        sums = [0.0, 0.0, 0.0]
        for samples in buckets[start].values():
            for i in range(3):
                sums[i] += sum(s[i] for s in samples) / len(samples)
        out["t"].append(start)
        for name, value in zip(SERIES, sums, strict=True):
            out[name].append(round(value, 2))
    return out


def latest_message_rates(window: int = WINDOW_SECONDS) -> dict[str, Any]:
    """:func:`message_rates` up to the last complete bucket, kept in the cache and
    extended by the buckets completed since: every live overview re-renders a few
    times a second, and the series only gains a point per bucket, so each render
    reads the samples of new buckets only (reading and parsing five minutes of
    samples costs tens of milliseconds)."""
    bucket = bucket_seconds()
    edge = int(timezone.now().timestamp()) // bucket * bucket  # start of the filling bucket
    key = f"rookery:dashboard:rates:{window}:{bucket}"
    cached = cache.get(key)
    if cached is not None and cached["edge"] == edge:
        return cached["series"]
    until = dt.datetime.fromtimestamp(edge, dt.UTC)
    if cached is not None and 0 < edge - cached["edge"] < window:
        added = message_rates(edge - cached["edge"], now=until, bucket=bucket)
        series = _append(cached["series"], added, keep_from=edge - window)
    else:
        series = message_rates(window, now=until, bucket=bucket)
    cache.set(key, {"edge": edge, "series": series}, timeout=window)
    return series


def _append(series: dict[str, Any], added: dict[str, Any], keep_from: int) -> dict[str, Any]:
    """``series`` followed by ``added``, without the points older than ``keep_from``."""
    times = series["t"] + added["t"]
    first = next((i for i, t in enumerate(times) if t >= keep_from), len(times))
    return {name: (series[name] + added[name])[first:] for name in ("t", *SERIES)}
