"""Issue 45 (report side): console gaps are no outages, planned stops are no crashes, and
the root figures agree with the incidents.

Histories of the quickstart's cluster (``walkthrough.py``, one status a second): the
console restarted (every broker's samples stop at once and come back as each link
reconnects), a broker killed while the console was away, a planned stop and a crash,
roots lost and regained around a console gap, and lakes written before the ``stopping``
column existed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pipeline import lake
from tests.pipeline.walkthrough import INTERVAL, NAMES, PHASES, START, History, write_history

pytestmark = pytest.mark.integration  # every test here runs the Spark job

AWAY = [(100.0, 105.0), (300.0, 340.0)]  # a 5 s and a 40 s console restart
RECONNECT = (0.0, 2.5, 4.0, 6.5)  # each link back at its own pace, within 15 s
STOPPED, STOP_AT, STOP_DOWN = 1, 150.0, 30.0
CRASHED, CRASH_AT, CRASH_DOWN = 2, 350.0, 30.0
ROOTS = [(0.0, 0), (100.0, None), (103.0, 0), (300.0, None), (304.0, 1), (395.0, None), (430.0, 2)]

HISTORIES = {
    "console_restarts": History(console_away=AWAY, reconnect=RECONNECT),
    # 5703 killed for good and 5704 stopped while the console was away (the console never
    # got its "stopping"), back 45 s after the console: both really down
    "killed_while_away": History(
        console_away=[(200.0, 240.0)],
        reconnect=(0.0, 3.0, 0.0, 0.0),
        kill=(2, 220.0, None),
        stop=(3, 225.0, 60.0),
    ),
    "stop_and_crash": History(
        stop=(STOPPED, STOP_AT, STOP_DOWN), kill=(CRASHED, CRASH_AT, CRASH_DOWN)
    ),
    "roots": History(roots=ROOTS, console_away=[(400.0, 420.0)]),
}


def rel(value: str | datetime) -> float:
    """A summary's time as seconds after START, to the millisecond."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return round(value.replace(tzinfo=value.tzinfo or UTC).timestamp() - START, 3)


def at(broker: int, seconds: float) -> float:
    """``broker``'s sample in the second starting ``seconds`` after START (as ``rel``)."""
    return round(seconds + PHASES[broker], 3)


def report_on(root: Path, spark: Any, out: Path) -> dict[str, Any]:
    from pipeline.report import ReportOptions, run_report

    return run_report(ReportOptions(lake=str(root), out=str(out)), spark)


@pytest.fixture(scope="module")
def reports(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every history of HISTORIES as a lake, and the report over it."""
    done = {}
    for name, history in HISTORIES.items():
        root = tmp_path_factory.mktemp(f"lake-{name}")
        write_history(root, history)
        out = tmp_path_factory.mktemp(f"report-{name}")
        done[name] = {"summary": report_on(root, spark, out), "out": out, "lake": root}
    return done


def kinds(summary: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(i["kind"], i["broker"]) for i in summary["incidents"]]


def table(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return pq.read_table(report["out"] / name).to_pylist()


def test_a_console_restart_is_one_console_gap_and_no_outage(reports: dict[str, Any]) -> None:
    report = reports["console_restarts"]
    summary = report["summary"]
    assert kinds(summary) == [("console_gap", None), ("console_gap", None)]
    assert summary["outages"] == []
    for incident, (away, back) in zip(summary["incidents"], AWAY, strict=True):
        # from the last sample before (5704's, the latest phase) to the first after (5701's)
        assert rel(incident["start"]) == at(3, away - 1)
        assert rel(incident["end"]) == at(0, back)
        assert incident["details"]["brokers"] == NAMES
        assert incident["details"]["seconds"] == pytest.approx(back - away + 0.25)
    assert [(g["start"], g["end"]) for g in summary["console_gaps"]] == [
        (i["start"], i["end"]) for i in summary["incidents"]
    ]
    # every broker's own gap is in the table, explained by the console
    gaps = table(report, "heartbeat_gaps")
    assert len(gaps) == len(NAMES) * len(AWAY)
    assert {g["cause"] for g in gaps} == {"console_gap"}
    # nobody knows who was root while the console was away: a hole, not "no root"
    root = summary["root"]
    assert [s["root"] for s in root["timeline"]] == [NAMES[0]] * 3
    assert root["changes"] == [] and root["no_root"] == [] and root["no_root_seconds"] == 0


def test_a_broker_that_died_while_the_console_was_away_is_an_outage(
    reports: dict[str, Any],
) -> None:
    summary = reports["killed_while_away"]["summary"]
    assert kinds(summary) == [
        ("console_gap", None),
        ("broker_outage", NAMES[2]),
        ("broker_outage", NAMES[3]),
        ("crash_restart", NAMES[3]),  # its "stopping" never reached the console
    ]
    gap, killed, late, _ = summary["incidents"]
    assert gap["details"]["brokers"] == NAMES[:2]
    # from its last sample (before the console went away), never back
    assert rel(killed["start"]) == at(2, 199 + INTERVAL)
    assert killed["end"] is None
    assert killed["details"]["seen_down_by"] == [NAMES[0], NAMES[1], NAMES[3]]
    # back 45 s after the console, past the reconnect allowance
    assert rel(late["start"]) == at(3, 199 + INTERVAL)
    assert rel(late["end"]) == at(3, 285)
    assert [o["broker"] for o in summary["outages"]] == [NAMES[2], NAMES[3]]


def test_a_planned_stop_and_a_crash_are_told_apart(reports: dict[str, Any]) -> None:
    report = reports["stop_and_crash"]
    summary = report["summary"]
    assert kinds(summary) == [
        ("planned_stop", NAMES[STOPPED]),
        ("planned_restart", NAMES[STOPPED]),
        ("broker_outage", NAMES[CRASHED]),
        ("crash_restart", NAMES[CRASHED]),
    ]
    stop, planned, outage, crash = summary["incidents"]
    # from its last sample (one status after the marked one) to its return
    assert rel(stop["start"]) == at(STOPPED, STOP_AT - 1)
    assert rel(stop["end"]) == at(STOPPED, STOP_AT + STOP_DOWN)
    assert rel(stop["details"]["announced"]) == at(STOPPED, STOP_AT - 2)
    assert stop["details"]["seconds"] == pytest.approx(STOP_DOWN + 1)
    # its peers saw it down: part of the planned stop, not a link outage
    assert stop["details"]["seen_down_by"] == [n for i, n in enumerate(NAMES) if i != STOPPED]
    assert planned["start"] == stop["end"]
    assert planned["details"]["old_spid"] == stop["details"]["spid"] != planned["details"]["spid"]
    # from the first that saw it gone to the last that saw it back (its peers 5701, 5704)
    assert rel(outage["start"]) == at(0, CRASH_AT)
    assert rel(outage["end"]) == at(3, CRASH_AT + CRASH_DOWN)
    assert crash["start"] == crash["end"] and crash["details"]["old_spid"]
    assert [o["broker"] for o in summary["outages"]] == [NAMES[CRASHED]]
    causes = {(g["broker"], g["cause"]) for g in table(report, "heartbeat_gaps")}
    assert causes == {(NAMES[STOPPED], "planned_stop"), (NAMES[CRASHED], None)}
    restarts = {(r["broker"], r["planned"]) for r in table(report, "restarts")}
    assert restarts == {(NAMES[STOPPED], True), (NAMES[CRASHED], False)}


def test_root_figures_and_incidents_agree(reports: dict[str, Any]) -> None:
    summary = reports["roots"]["summary"]
    root = summary["root"]
    no_root = [i for i in summary["incidents"] if i["kind"] == "no_root"]
    # every stretch without a root is an incident, and their seconds make the total
    assert sum(i["details"]["seconds"] for i in no_root) == pytest.approx(root["no_root_seconds"])
    assert root["no_root_seconds"] == pytest.approx(3 + 4 + 5 + 10)  # the console gap is none
    got = [
        (rel(i["start"]), rel(i["end"]), i["details"]["seconds"],
         i["details"]["root_before"], i["details"]["root_after"])
        for i in no_root
    ]  # fmt: skip
    assert got == [
        (100, 103, 3, NAMES[0], NAMES[0]),  # lost and regained: no failover, still no root
        (300, 304, 4, NAMES[0], NAMES[1]),
        (395, 400, 5, NAMES[1], NAMES[2]),
        (420, 430, 10, NAMES[1], NAMES[2]),
    ]
    failovers = [i for i in summary["incidents"] if i["kind"] == "root_failover"]
    assert [(f["broker"], f["details"]) for f in failovers] == [
        (NAMES[0], {"new_root": NAMES[1], "no_root_seconds": 4.0}),
        (NAMES[1], {"new_root": NAMES[2], "no_root_seconds": 15.0}),
    ]
    assert [(c["from"], c["to"]) for c in root["changes"]] == [
        (NAMES[0], NAMES[1]),
        (NAMES[1], NAMES[2]),
    ]
    assert kinds(summary).count(("console_gap", None)) == 1
    # the timeline has a hole for the console gap: no segment covers 400-420 s
    for segment in root["timeline"]:
        assert not rel(segment["start"]) < 410 < rel(segment["end"])


def rewrite_without_stopping(root: Path, brokers: list[str] | None = None) -> int:
    """Make ``broker_samples`` files look as written before the column existed."""
    dirs = {lake.partition_dir(root, "broker_samples", "-", b).name for b in brokers or NAMES}
    rewritten = 0
    for path in sorted((root / "broker_samples").rglob("*.parquet")):
        if path.parent.name not in dirs:
            continue
        data = pq.read_table(path)
        pq.write_table(data.drop(["stopping"]), path)
        rewritten += 1
    return rewritten


def test_a_lake_written_before_the_stopping_column_still_reports(
    spark: Any, tmp_path: Path
) -> None:
    history = HISTORIES["stop_and_crash"]
    write_history(tmp_path / "old", history)
    assert rewrite_without_stopping(tmp_path / "old") == len(NAMES)
    summary = report_on(tmp_path / "old", spark, tmp_path / "old-out")
    # nothing says the stop was planned: as every report said before
    assert kinds(summary) == [
        ("broker_outage", NAMES[STOPPED]),
        ("crash_restart", NAMES[STOPPED]),
        ("broker_outage", NAMES[CRASHED]),
        ("crash_restart", NAMES[CRASHED]),
    ]
    # Files of both kinds in one table (archived before the upgrade, and after): the
    # marked sample is still read, whichever file Spark takes the schema from.
    write_history(tmp_path / "mixed", history)
    others = [n for i, n in enumerate(NAMES) if i != STOPPED]
    assert rewrite_without_stopping(tmp_path / "mixed", others) == len(others)
    summary = report_on(tmp_path / "mixed", spark, tmp_path / "mixed-out")
    assert kinds(summary)[:2] == [
        ("planned_stop", NAMES[STOPPED]),
        ("planned_restart", NAMES[STOPPED]),
    ]
    marked = lake.read_table(tmp_path / "mixed", "broker_samples").column("stopping")
    assert marked.to_pylist().count(True) == 1
