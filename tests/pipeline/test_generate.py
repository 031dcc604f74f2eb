"""The synthetic history: deterministic, consistent counters, incidents placed."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import lake
from pipeline.generate import GenerateError, generate, parse_time
from pipeline.isotime import iso
from tests.pipeline import reference as ref

SMALL = {"brokers": 3, "queues": 2, "hours": 1.0, "interval": 10.0}


def test_same_seed_same_history_other_seed_differs(tmp_path: Path) -> None:
    generate(tmp_path / "a", seed=5, **SMALL)
    generate(tmp_path / "b", seed=5, **SMALL)
    generate(tmp_path / "c", seed=6, **SMALL)
    for table in lake.SCHEMAS:
        a = lake.read_table(tmp_path / "a", table).sort_by(
            [("broker", "ascending"), ("ts", "ascending")]
        )
        b = lake.read_table(tmp_path / "b", table).sort_by(
            [("broker", "ascending"), ("ts", "ascending")]
        )
        assert a.equals(b)
    qa = lake.read_table(tmp_path / "a", "queue_samples").column("enqueued_total")
    qc = lake.read_table(tmp_path / "c", "queue_samples").column("enqueued_total")
    assert qa.to_pylist() != qc.to_pylist()
    assert (tmp_path / "a" / "_incidents.json").read_text() == (
        tmp_path / "b" / "_incidents.json"
    ).read_text()


def test_counters_follow_rates_and_reset_on_restart(lake_dir: Path) -> None:
    rows = ref.load(lake_dir, "queue_samples")
    resets = across_console_gap = 0
    for group in ref.series(rows, ("broker", "vhost", "queue")).values():
        for prev, row in itertools.pairwise(group):
            if row["enqueued_total"] < prev["enqueued_total"]:
                resets += 1
                assert row["enqueued_total"] == row["rate_in"] * 5.0
            elif row["t"] - prev["t"] > 7.5:
                # the console was away: the broker counted on, nobody recorded it
                across_console_gap += 1
                assert row["enqueued_total"] - prev["enqueued_total"] >= row["rate_in"] * 5.0
            else:
                assert row["t"] - prev["t"] == pytest.approx(5.0)
                assert row["enqueued_total"] - prev["enqueued_total"] == row["rate_in"] * 5.0
                assert row["delivered_total"] - prev["delivered_total"] == row["rate_out"] * 5.0
                # ready = previous + in - out
                delta = (row["rate_in"] - row["rate_out"]) * 5.0
                assert row["messages"] == pytest.approx(prev["messages"] + delta)
    assert resets == 4 * 3  # three crashes and a planned stop, three queues each
    assert across_console_gap == 4 * 3  # every broker, every queue


def test_broker_rows_are_the_sum_of_their_queues(lake_dir: Path) -> None:
    queues = ref.load(lake_dir, "queue_samples")
    sums: dict[tuple, list[float]] = {}
    for q in queues:
        acc = sums.setdefault((q["broker"], q["ts"]), [0, 0.0])
        acc[0] += q["messages"]
        acc[1] += q["rate_in"]
    for b in ref.load(lake_dir, "broker_samples"):
        messages, rate_in = sums[(b["broker"], b["ts"])]
        assert b["messages_ready"] == messages
        assert b["rate_routed"] == pytest.approx(rate_in)
        assert b["peers_known"] == 3


def test_diurnal_traffic_peaks_in_the_afternoon(tmp_path: Path) -> None:
    generate(tmp_path, seed=3, brokers=3, queues=2, hours=24, interval=60.0)
    by_hour: dict[int, float] = {}
    for row in ref.load(tmp_path, "broker_samples"):
        by_hour[row["ts"].hour] = by_hour.get(row["ts"].hour, 0.0) + row["rate_routed"]
    assert by_hour[15] > 1.8 * by_hour[3]


def test_a_planned_stop_is_marked_and_the_console_gap_leaves_no_sample(lake_dir: Path) -> None:
    doc = json.loads((lake_dir / "_incidents.json").read_text())
    [stop] = [i for i in doc["incidents"] if i["kind"] == "planned_stop"]
    [gap] = [i for i in doc["incidents"] if i["kind"] == "console_gap"]
    rows = ref.load(lake_dir, "broker_samples")
    marked = [r for r in rows if r["stopping"]]
    assert [r["broker"] for r in marked] == [stop["broker"]]
    [mine] = ref.series([r for r in rows if r["broker"] == stop["broker"]], ("broker",)).values()
    at = mine.index(marked[0])
    # one more status after the marked one: the stop's start, then nothing until its end
    last, back = mine[at + 1], mine[at + 2]
    assert last["t"] - marked[0]["t"] == 5.0 and iso(last["ts"]) == stop["start"]
    assert iso(back["ts"]) == stop["end"] and back["spid"] != last["spid"]
    start, end = (parse_time(gap[k]).timestamp() for k in ("start", "end"))
    for table in lake.SCHEMAS:
        assert not [r for r in ref.load(lake_dir, table) if start < r["t"] < end]
    assert gap["details"]["brokers"] == doc["brokers"]


def test_outage_peers_see_the_broker_inactive(lake_dir: Path) -> None:
    doc = json.loads((lake_dir / "_incidents.json").read_text())
    outage = [i for i in doc["incidents"] if i["kind"] == "broker_outage"][-1]
    start = ref.load(lake_dir, "broker_samples")[0]["ts"].fromisoformat(
        outage["start"].replace("Z", "+00:00")
    )
    seen = [
        p
        for p in ref.load(lake_dir, "peer_samples")
        if p["peer_address"] == outage["broker"] and 0 <= p["t"] - start.timestamp() < 60
    ]
    assert seen and all(not p["active"] and p["rtt_ms"] is None for p in seen)


def test_generate_refuses_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(GenerateError, match="at least 3"):
        generate(tmp_path, seed=1, brokers=2, queues=1, hours=1, interval=5)
    with pytest.raises(GenerateError, match="at least 200"):
        generate(tmp_path, seed=1, brokers=3, queues=1, hours=0.1, interval=5)
    generate(tmp_path, seed=1, **SMALL)
    with pytest.raises(GenerateError, match="--overwrite"):
        generate(tmp_path, seed=1, **SMALL)
    generate(tmp_path, seed=1, overwrite=True, **SMALL)


@pytest.mark.integration  # runs the CLI as a process
def test_cli_reports_errors_with_exit_status_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "generate", "--lake", str(tmp_path), "--brokers",
         "2", "--queues", "1", "--hours", "1", "--seed", "1"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "at least 3" in proc.stderr and "Traceback" not in proc.stderr
