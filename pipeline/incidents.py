"""summary.json's ``incidents`` and ``outages``, from the few rows the report collects.

Kinds (docs/architecture.md, "The report"): ``root_failover``, ``no_root``,
``console_gap``, ``broker_outage``, ``link_outage``, ``planned_stop``,
``planned_restart``, ``crash_restart``, ``backlog``, ``link_flap``.  Plain Python on the
driver: every input is an aggregated row (a gap, an outage, a restart), never a sample.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pipeline.collection import console_gap_incidents
from pipeline.isotime import iso

Row = dict[str, Any]


def incident(
    kind: str, row: Row, start: datetime | None, end: datetime | None, **details: Any
) -> Row:
    """One entry of summary.json's ``incidents`` from a row of a report table."""
    return {
        "kind": kind,
        "broker": row["broker"],
        "start": iso(start),
        "end": iso(end),
        "details": details,
    }


def merge_outages(gaps: list[Row], links: list[Row]) -> list[Row]:
    """Outages toward each broker: its heartbeat gaps and its peers' link outages toward
    its address, joined while they overlap.

    Every source says the broker was not seen up from its ``start`` to its ``end`` (null:
    not back by the end of the period); one dead broker is silent to the console and down
    for each of its peers at once, which is one outage, not one per observer.  An outage
    goes from its earliest start to its latest end: never shorter than any source saw it.
    """
    sources: dict[str, list[tuple[datetime, datetime | None, str | None, int | None]]] = {}
    for row in gaps:
        sources.setdefault(row["broker"], []).append(
            (row["start"], row["end"], None, int(row["missed"]))
        )
    for row in links:
        sources.setdefault(row["peer_address"], []).append(
            (row["start"], row["end"], row["broker"], None)
        )
    outages: list[dict[str, Any]] = []
    for broker, found in sources.items():
        found.sort(key=lambda source: source[0])
        current: dict[str, Any] | None = None
        for start, end, observer, missed in found:
            if current is None or (current["end"] is not None and start > current["end"]):
                current = {"broker": broker, "start": start, "end": end, "missed": [], "by": set()}
                outages.append(current)
            elif end is None or current["end"] is None:
                current["end"] = None
            else:
                current["end"] = max(current["end"], end)
            if observer is not None:
                current["by"].add(observer)
            if missed is not None:
                current["missed"].append(missed)
    return [
        {
            "broker": o["broker"],
            "start": iso(o["start"]),
            "end": iso(o["end"]),
            "seconds": None
            if o["end"] is None
            else round((o["end"] - o["start"]).total_seconds(), 6),
            "missed_samples": sum(o["missed"]) if o["missed"] else None,
            "seen_down_by": sorted(o["by"]),
        }
        for o in sorted(outages, key=lambda o: (o["start"], o["broker"]))
    ]


def outage_incident(outage: Row) -> Row:
    """``broker_outage`` when the broker's own heartbeats stopped, ``link_outage`` when only
    its peers lost it (it kept reporting to the console)."""
    details: dict[str, Any] = {"seconds": outage["seconds"], "seen_down_by": outage["seen_down_by"]}
    if outage["missed_samples"] is not None:
        details = {"missed_samples": outage["missed_samples"], **details}
    return {
        "kind": "broker_outage" if outage["missed_samples"] is not None else "link_outage",
        "broker": outage["broker"],
        "start": outage["start"],
        "end": outage["end"],
        "details": details,
    }


def planned_stops(
    gaps: list[Row], links: list[Row], interval: float, allowance: float
) -> tuple[list[Row], list[Row]]:
    """``planned_stop`` incidents, and the link outages they do not explain.

    A stopped broker is down for its peers too: a peer's link outage toward it that began
    after the stop was announced (less one interval), before the broker was back, and
    ended within ``allowance`` of its return (the peers' links reconnecting) belongs to
    the planned stop (``seen_down_by``), not to an outage.
    """
    stops = [g for g in gaps if g["cause"] == "planned_stop"]
    observers: list[set[str]] = [set() for _ in stops]
    left = []
    for link in links:
        for i, gap in enumerate(stops):
            if link["peer_address"] == gap["broker"] and _within(link, gap, interval, allowance):
                observers[i].add(link["broker"])
                break
        else:
            left.append(link)
    found = []
    for gap, seen in zip(stops, observers, strict=True):
        seconds = None if gap["end"] is None else (gap["end"] - gap["last_seen"]).total_seconds()
        found.append(
            incident(
                "planned_stop",
                gap,
                gap["last_seen"],
                gap["end"],
                spid=gap["last_spid"],
                announced=iso(gap["stop_announced"]),
                missed_samples=int(gap["missed"]),
                seconds=None if seconds is None else round(seconds, 6),
                seen_down_by=sorted(seen),
            )
        )
    return found, left


def _within(link: Row, gap: Row, interval: float, allowance: float) -> bool:
    """Whether a link outage toward a stopped broker is part of its planned stop."""
    if link["start"] < gap["stop_announced"] - timedelta(seconds=interval):
        return False
    if gap["end"] is None:
        return True
    if link["start"] > gap["end"] or link["end"] is None:
        return False
    return link["end"] <= gap["end"] + timedelta(seconds=allowance)


def restart_incident(row: Row) -> Row:
    """``planned_restart`` after an announced stop, ``crash_restart`` after anything else."""
    kind = "planned_restart" if row["planned"] else "crash_restart"
    return incident(kind, row, row["ts"], row["ts"], spid=row["new_spid"], old_spid=row["old_spid"])


def no_root_incidents(timeline: dict[str, Any]) -> list[Row]:
    """One ``no_root`` incident per stretch without a root (all of ``timeline["no_root"]``,
    so their seconds add up to the summary's ``no_root_seconds``)."""
    return [
        {
            "kind": "no_root",
            "broker": gap["root_before"],
            "start": gap["start"],
            "end": gap["end"],
            "details": {
                "seconds": gap["seconds"],
                "root_before": gap["root_before"],
                "root_after": gap["root_after"],
            },
        }
        for gap in timeline["no_root"]
    ]


def build_incidents(
    *,
    timeline: dict[str, Any],
    collection: list[Row],
    gaps: list[Row],
    link_outages: list[Row],
    restarts: list[Row],
    backlogs: list[Row],
    flaps: list[Row],
    interval: float,
    allowance: float,
) -> tuple[list[Row], list[Row]]:
    """Every incident in time order, and the outages (the ``outages`` of summary.json).

    ``gaps`` are ``collection.explain_gaps`` rows: a gap with a cause (``console_gap``,
    ``planned_stop``) is no outage; a console gap is one incident for all the brokers it
    explains.
    """
    stops, links = planned_stops(gaps, link_outages, interval, allowance)
    outages = merge_outages([g for g in gaps if g["cause"] is None], links)
    found: list[Row] = [
        *timeline["failovers"],
        *no_root_incidents(timeline),
        *console_gap_incidents(collection, gaps),
        *stops,
        *(outage_incident(outage) for outage in outages),
        *(restart_incident(row) for row in restarts),
    ]
    found += [
        incident(
            "backlog",
            row,
            row["start"],
            row["end"],
            vhost=row["vhost"],
            queue=row["queue"],
            growth=int(row["growth"]),
            growth_per_s=row["growth_per_s"],
        )
        for row in backlogs
    ]
    found += [
        incident(
            "link_flap",
            row,
            row["start"],
            row["end"],
            peer_address=row["peer_address"],
            transitions=row["transitions"],
        )
        for row in flaps
    ]
    found.sort(key=lambda i: (i["start"] or "", i["kind"], i["broker"] or ""))
    return found, outages
