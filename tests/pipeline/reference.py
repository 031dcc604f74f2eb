"""Independent plain-Python versions of the report's metrics, computed from lake rows."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from pipeline import lake


def load(root: Path, table: str) -> list[dict[str, Any]]:
    """Rows of a lake table with ``t`` = epoch seconds."""
    rows = lake.read_table(root, table).to_pylist()
    for row in rows:
        row["t"] = row["ts"].timestamp()
    return rows


def series(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    """Rows grouped by ``keys`` and sorted by time."""
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        grouped[tuple(row[k] for k in keys)].append(row)
    for group in grouped.values():
        group.sort(key=lambda r: r["t"])
    return grouped


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def rated(
    rows: list[dict[str, Any]],
    keys: tuple[str, ...],
    counters: dict[str, str],
    interval: float,
    spid: bool,
) -> list[dict[str, Any]]:
    """Samples that have a predecessor, with ``n_<name>`` counts and ``r_<name>`` rates."""
    out = []
    for group in series(rows, keys).values():
        for prev, row in itertools.pairwise(group):
            restart = (spid and row["spid"] != prev["spid"]) or any(
                row[c] < prev[c] for c in counters
            )
            sample = dict(row, restart=restart)
            for counter, name in counters.items():
                n = row[counter] if restart else row[counter] - prev[counter]
                sample[f"n_{name}"] = n
                sample[f"r_{name}"] = n / interval if restart else n / (row["t"] - prev["t"])
            out.append(sample)
    return out


def minute_of(t: float) -> int:
    return int(t // 60 * 60)


def minute_stats(
    samples: list[dict[str, Any]], keys: tuple[str, ...], rate: str
) -> dict[tuple, dict[str, float]]:
    """avg/p50/p95/max of ``rate`` per key per minute."""
    buckets: dict[tuple, list[float]] = defaultdict(list)
    for s in samples:
        buckets[(*(s[k] for k in keys), minute_of(s["t"]))].append(s[rate])
    return {
        key: {
            "avg": sum(v) / len(v),
            "p50": percentile(v, 0.5),
            "p95": percentile(v, 0.95),
            "max": max(v),
            "samples": len(v),
        }
        for key, v in buckets.items()
    }


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def link_states(peer_rows: list[dict[str, Any]]) -> dict[tuple, list[tuple[float, bool]]]:
    """Per (broker, peer address): one (t, up) per sample, up if any listed spid is active."""
    states: dict[tuple, dict[float, bool]] = defaultdict(dict)
    for row in peer_rows:
        seen = states[(row["broker"], row["peer_address"])]
        seen[row["t"]] = seen.get(row["t"], False) or row["active"]
    return {key: sorted(by_t.items()) for key, by_t in states.items()}


def link_flaps(
    states: dict[tuple, list[tuple[float, bool]]], window: float, min_transitions: int
) -> list[dict[str, Any]]:
    """Bursts of changes between consecutive observed states, each <= window apart."""
    flaps = []
    for key, seq in states.items():
        changes = [(t, up) for (_, was), (t, up) in itertools.pairwise(seq) if up != was]
        bursts: list[list[tuple[float, bool]]] = []
        for change in changes:
            if bursts and change[0] - bursts[-1][-1][0] <= window:
                bursts[-1].append(change)
            else:
                bursts.append([change])
        flaps.extend(
            {
                "link": key,
                "start": burst[0][0],
                "end": burst[-1][0],
                "transitions": len(burst),
                "downs": sum(not up for _, up in burst),
            }
            for burst in bursts
            if len(burst) >= min_transitions
        )
    return flaps


def link_outages(states: dict[tuple, list[tuple[float, bool]]]) -> list[dict[str, Any]]:
    """Runs of down observations: last up before, first down, next up after (or None)."""
    outages = []
    for key, seq in states.items():
        last_up: float | None = None
        run: dict[str, Any] | None = None
        for t, up in seq:
            if up:
                if run is not None:
                    outages.append(dict(run, end=t))
                    run = None
                last_up = t
            elif run is None:
                run = {"link": key, "last_up": last_up, "start": t, "down_samples": 1}
            else:
                run["down_samples"] += 1
        if run is not None:
            outages.append(dict(run, end=None))
    return outages
