"""The overview's message-rate chart: cluster-wide rates per time bucket from heartbeats."""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from typing import Any

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
