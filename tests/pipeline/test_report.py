"""The Spark traffic report checked against plain-Python computations on the same rows."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.pipeline import reference as ref
from tests.pipeline.conftest import LAKE_ARGS

INTERVAL = LAKE_ARGS["interval"]
BROKER_COUNTERS = {
    "published_total": "in",
    "routed_total": "isr",
    "delivered_total": "out",
    "bridged_total": "bridged",
}
QUEUE_COUNTERS = {"enqueued_total": "in", "delivered_total": "out"}


def output(report: dict[str, Any], table: str) -> list[dict[str, Any]]:
    return pq.read_table(report["out"] / table).to_pylist()


def epoch(value: str | datetime) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.timestamp()


@pytest.fixture(scope="module")
def broker_rows(lake_dir: Path) -> list[dict[str, Any]]:
    return ref.load(lake_dir, "broker_samples")


@pytest.fixture(scope="module")
def broker_rated(broker_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return ref.rated(broker_rows, ("broker",), BROKER_COUNTERS, INTERVAL, spid=True)


@pytest.fixture(scope="module")
def queue_rated(lake_dir: Path) -> list[dict[str, Any]]:
    rows = ref.load(lake_dir, "queue_samples")
    return ref.rated(rows, ("broker", "vhost", "queue"), QUEUE_COUNTERS, INTERVAL, spid=False)


def test_summary_file_matches_returned_summary(report: dict[str, Any]) -> None:
    on_disk = json.loads((report["out"] / "summary.json").read_text())
    assert on_disk["incidents"] == report["summary"]["incidents"]
    assert report["summary"]["interval_s"] == INTERVAL
    for path in report["summary"]["tables"].values():
        assert Path(path).is_dir()


def test_sample_counts_and_period(report: dict[str, Any], broker_rows: list, lake_dir: Path):
    summary = report["summary"]
    assert summary["samples"]["broker_samples"] == len(broker_rows)
    assert summary["samples"]["queue_samples"] == len(ref.load(lake_dir, "queue_samples"))
    assert summary["brokers"] == sorted({r["broker"] for r in broker_rows})
    assert epoch(summary["period"]["first_sample"]) == pytest.approx(
        min(r["t"] for r in broker_rows), abs=1e-6
    )
    assert epoch(summary["period"]["last_sample"]) == pytest.approx(
        max(r["t"] for r in broker_rows), abs=1e-6
    )


def test_rates_from_counters_agree_with_reported_rates(broker_rated: list) -> None:
    """The generator's counters and rate fields are consistent, restarts included (after
    a console gap a counter difference covers the whole gap, a rate field one interval)."""
    restarts = 0
    for s in broker_rated:
        restarts += s["restart"]
        if not s["restart"] and s["n_in"] != s["rate_published"] * INTERVAL:
            continue
        assert s["r_in"] == pytest.approx(s["rate_published"])
        assert s["r_isr"] == pytest.approx(s["rate_routed"])
        assert s["r_out"] == pytest.approx(s["rate_delivered"])
    assert restarts == 4


def same_keys(got: dict[Any, Any], expected: dict[Any, Any]) -> None:
    """The output has exactly the expected rows, and there are some: two empty
    sets are equal, and would pass a report that computed nothing."""
    assert expected, "the reference computed no rows: the lake is empty"
    assert set(got) == set(expected)


def test_broker_minute_rates(report: dict[str, Any], broker_rated: list) -> None:
    got = {(r["broker"], int(epoch(r["minute"]))): r for r in output(report, "broker_minute")}
    for name in ("in", "out", "isr"):
        expected = ref.minute_stats(broker_rated, ("broker",), f"r_{name}")
        same_keys(got, expected)
        for key, stats in expected.items():
            row = got[key]
            assert row["samples"] == stats["samples"]
            for stat in ("avg", "p50", "p95", "max"):
                assert row[f"{name}_{stat}"] == pytest.approx(stats[stat], rel=1e-9), (key, stat)


def test_queue_minute_rates(report: dict[str, Any], queue_rated: list) -> None:
    keys = ("broker", "vhost", "queue")
    got = {
        (r["broker"], r["vhost"], r["queue"], int(epoch(r["minute"]))): r
        for r in output(report, "queue_minute")
    }
    for name in ("in", "out"):
        expected = ref.minute_stats(queue_rated, keys, f"r_{name}")
        same_keys(got, expected)
        for key, stats in expected.items():
            for stat in ("avg", "p50", "p95", "max"):
                assert got[key][f"{name}_{stat}"] == pytest.approx(stats[stat], rel=1e-9)


def test_isr_xsr_per_broker_and_cluster(report: dict[str, Any], broker_rated: list) -> None:
    isr = ref.minute_stats(broker_rated, ("broker",), "r_isr")
    xsr = ref.minute_stats(broker_rated, ("broker",), "r_out")
    cluster: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (broker, minute), stats in isr.items():
        cluster[minute][0] += stats["avg"]
        cluster[minute][1] += xsr[(broker, minute)]["avg"]
    rows = output(report, "isr_xsr_minute")
    per_broker = {(r["broker"], int(epoch(r["minute"]))): r for r in rows if r["scope"] == "broker"}
    whole = {int(epoch(r["minute"])): r for r in rows if r["scope"] == "cluster"}
    same_keys(per_broker, isr)
    for key, stats in isr.items():
        assert per_broker[key]["isr"] == pytest.approx(stats["avg"], rel=1e-9)
        assert per_broker[key]["xsr"] == pytest.approx(xsr[key]["avg"], rel=1e-9)
    same_keys(whole, cluster)
    for minute, (i, x) in cluster.items():
        assert whole[minute]["isr"] == pytest.approx(i, rel=1e-9)
        assert whole[minute]["xsr"] == pytest.approx(x, rel=1e-9)
    peak_minute = max(cluster, key=lambda m: cluster[m][0])
    peak = report["summary"]["peaks"]["cluster_isr"]
    assert peak["value"] == pytest.approx(cluster[peak_minute][0], rel=1e-9)
    assert int(epoch(peak["minute"])) == peak_minute


def test_totals(report: dict[str, Any], broker_rated: list) -> None:
    totals = report["summary"]["totals"]
    assert totals["published"] == sum(s["n_in"] for s in broker_rated)
    assert totals["routed"] == sum(s["n_isr"] for s in broker_rated)
    assert totals["delivered"] == sum(s["n_out"] for s in broker_rated)
    # what the brokers' bridges forwarded (issue 42): counted like the others
    assert totals["bridged"] == sum(s["n_bridged"] for s in broker_rated) > 0
    for broker, per in totals["per_broker"].items():
        assert per["routed"] == sum(s["n_isr"] for s in broker_rated if s["broker"] == broker)


def test_capacity_estimate(report: dict[str, Any], broker_rated: list) -> None:
    cap = report["summary"]["capacity"]
    minute_in = ref.minute_stats(broker_rated, ("broker",), "r_in")
    c = max(stats["avg"] for stats in minute_in.values())
    b, q = LAKE_ARGS["brokers"], LAKE_ARGS["queues"]
    assert (cap["B"], cap["Q"]) == (b, q)
    assert cap["C_messages_per_s"] == pytest.approx(c, rel=1e-9)
    assert cap["isr_estimate"] == pytest.approx(b * q * c, rel=1e-9)
    link = 1e9 / 8 / 1000
    assert cap["xsr_estimate"] == pytest.approx(b * min(q * c, link), rel=1e-9)
    assert cap["isr_seed_reference"] == b * q * 10_000
    assert 0 < cap["isr_utilisation"] <= 1
    assert "B x Q x C" in cap["formula"]


def test_queue_trends(report: dict[str, Any], lake_dir: Path) -> None:
    rows = ref.load(lake_dir, "queue_samples")
    got = {(r["broker"], r["vhost"], r["queue"]): r for r in output(report, "queue_trends")}
    groups = ref.series(rows, ("broker", "vhost", "queue"))
    same_keys(got, groups)
    for key, group in groups.items():
        expected = ref.slope([(r["t"], r["messages"]) for r in group])
        assert got[key]["slope_per_s"] == pytest.approx(expected, rel=1e-6, abs=1e-9)
        assert got[key]["messages_last"] == group[-1]["messages"]
        assert got[key]["samples"] == len(group)
    # The backlog drained before the end: nothing is growing in the last window.
    assert report["summary"]["queues_growing"] == []


def test_root_timeline(report: dict[str, Any], lake_dir: Path) -> None:
    injected = json.loads((lake_dir / "_incidents.json").read_text())
    failover = next(i for i in injected["incidents"] if i["kind"] == "root_failover")
    gap = next(i for i in injected["incidents"] if i["kind"] == "console_gap")
    root = report["summary"]["root"]
    roots = [s["root"] for s in root["timeline"]]
    new_root = failover["details"]["new_root"]
    # the console gap is a hole in the new root's time: nobody recorded who was root
    assert roots == [failover["broker"], None, new_root, new_root]
    hole = (epoch(root["timeline"][2]["end"]), epoch(root["timeline"][3]["start"]))
    assert hole[0] <= epoch(gap["start"]) + INTERVAL and hole[1] >= epoch(gap["end"]) - INTERVAL
    assert root["changes"] == [
        {"at": failover["end"], "from": failover["broker"], "to": failover["details"]["new_root"]}
    ]
    assert root["no_root_seconds"] == pytest.approx(failover["details"]["no_root_seconds"])
    timeline = output(report, "root_timeline")
    assert [r["root"] for r in sorted(timeline, key=lambda r: r["start"])] == roots


def test_every_injected_incident_is_detected_at_the_right_time(
    report: dict[str, Any], lake_dir: Path
) -> None:
    injected = json.loads((lake_dir / "_incidents.json").read_text())["incidents"]
    detected = report["summary"]["incidents"]
    kinds = {i["kind"] for i in injected}
    assert kinds == {
        "root_failover", "no_root", "console_gap", "broker_outage", "crash_restart",
        "planned_stop", "planned_restart", "backlog", "link_flap",
    }  # fmt: skip
    assert len(detected) == len(injected), detected
    unmatched = list(detected)
    for want in injected:
        match = [
            d
            for d in unmatched
            if d["kind"] == want["kind"]
            and d["broker"] == want["broker"]
            and abs(epoch(d["start"]) - epoch(want["start"])) <= INTERVAL
            and abs(epoch(d["end"]) - epoch(want["end"])) <= INTERVAL
        ]
        assert match, f"not detected: {want}"
        unmatched.remove(match[0])
        if want["kind"] in ("backlog",):
            assert match[0]["details"]["queue"] == want["details"]["queue"]
        if want["kind"] == "link_flap":
            assert match[0]["details"]["peer_address"] == want["details"]["peer_address"]
            assert match[0]["details"]["transitions"] == want["details"]["transitions"]
        if want["kind"] in ("console_gap", "no_root", "root_failover"):
            for key, value in want["details"].items():
                if key not in ("old_spid", "new_spid"):  # the report names roots, not runs
                    assert match[0]["details"][key] == value, (key, want)
        if want["kind"] in ("planned_stop", "planned_restart", "crash_restart"):
            assert match[0]["details"]["spid"] == want["details"]["spid"]
    assert unmatched == []
    # the root figures and the incidents say the same
    no_root = [d["details"]["seconds"] for d in detected if d["kind"] == "no_root"]
    assert sum(no_root) == pytest.approx(report["summary"]["root"]["no_root_seconds"])


def test_heartbeat_gaps_table(report: dict[str, Any], broker_rows: list, lake_dir: Path) -> None:
    injected = json.loads((lake_dir / "_incidents.json").read_text())["incidents"]
    [gap] = [epoch(i["start"]) for i in injected if i["kind"] == "console_gap"]
    [stop] = [i["broker"] for i in injected if i["kind"] == "planned_stop"]
    expected = []
    for (broker,), group in ref.series(broker_rows, ("broker",)).items():
        marked = False  # this run announced its stop
        for prev, row in itertools.pairwise(group):
            marked = marked or prev["stopping"]
            missed = round((row["t"] - prev["t"]) / INTERVAL) - 1
            if missed >= 3:
                cause = "planned_stop" if marked else None
                cause = "console_gap" if abs(prev["t"] - gap) < INTERVAL else cause
                expected.append((broker, round(prev["t"] + INTERVAL, 3), round(row["t"], 3), cause))
            marked = marked and row["spid"] == prev["spid"]
    got = [
        (r["broker"], round(epoch(r["start"]), 3), round(epoch(r["end"]), 3), r["cause"])
        for r in output(report, "heartbeat_gaps")
    ]
    assert sorted(got, key=str) == sorted(expected, key=str)
    # two crashes, one planned stop, every broker once during the console gap
    assert len(expected) == 3 + LAKE_ARGS["brokers"]
    assert [g[0] for g in expected if g[3] == "planned_stop"] == [stop]


def test_time_window(spark: Any, lake_dir: Path, tmp_path: Path, broker_rows: list) -> None:
    """--from/--to keep only the samples in [from, to)."""
    from pipeline.generate import parse_time
    from pipeline.report import ReportOptions, run_report

    start, end = parse_time("2026-01-05T00:10:00Z"), parse_time("2026-01-05T00:20:00Z")
    summary = run_report(ReportOptions(str(lake_dir), str(tmp_path), start=start, end=end), spark)
    inside = [r for r in broker_rows if start.timestamp() <= r["t"] < end.timestamp()]
    assert summary["samples"]["broker_samples"] == len(inside)
    assert summary["period"]["from"] == "2026-01-05T00:10:00Z"
    assert summary["incidents"] == []


def test_bad_input_is_a_clear_error(spark: Any, tmp_path: Path, lake_dir: Path) -> None:
    from pipeline.generate import parse_time
    from pipeline.report import ReportError, ReportOptions, run_report

    with pytest.raises(ReportError, match="no such table"):
        run_report(ReportOptions(str(tmp_path / "nowhere"), str(tmp_path / "out")), spark)
    late = parse_time("2030-01-01T00:00:00Z")
    with pytest.raises(ReportError, match="no broker samples"):
        run_report(ReportOptions(str(lake_dir), str(tmp_path / "o2"), start=late), spark)
    with pytest.raises(ReportError, match="before"):
        run_report(ReportOptions(str(lake_dir), str(tmp_path / "o3"), start=late, end=late), spark)
