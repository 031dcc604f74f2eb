"""Links, flaps and outages (issue 25): derived from observed states, not missing samples.

The walkthrough's history: 127.0.0.1:5703 killed and back 78 s later under a new spid.
The report once listed 314-318 "link flap" transitions toward it from each peer: after
the restart every status lists the address twice (old spid inactive, new spid active),
and two rows of one sample alternate in a window ordered by time.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from pipeline.incidents import merge_outages
from tests.pipeline import reference as ref
from tests.pipeline.walkthrough import INTERVAL, NAMES, START, History, write_history

KILLED = 2  # 127.0.0.1:5703
KILL_AT, DOWN = 200.5, 78.0
FLAPS = [(0, 1, 400.0 + 5 * i, 402.0 + 5 * i) for i in range(4)]  # down 2 s, up 3 s, 4 times
PARTITION = (0, 3, 300.0, 330.0)  # 5701 loses 5704 for 30 s; 5704 keeps reporting

HISTORIES = {
    "walkthrough": History(kill=(KILLED, KILL_AT, DOWN)),
    "flapping": History(unseen=[*FLAPS, PARTITION]),
}


def epoch(value: str | datetime) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.replace(tzinfo=value.tzinfo or UTC).timestamp()


def run_history(name: str, spark: Any, tmp: pytest.TempPathFactory) -> dict[str, Any]:
    """Write one of HISTORIES as a lake and run the report over it."""
    from pipeline.report import ReportOptions, run_report

    root = tmp.mktemp(f"lake-{name}")
    write_history(root, HISTORIES[name])
    out = tmp.mktemp(f"report-{name}")
    summary = run_report(ReportOptions(lake=str(root), out=str(out)), spark)
    return {"summary": summary, "out": out, "lake": root}


@pytest.fixture(scope="module")
def walkthrough(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_history("walkthrough", spark, tmp_path_factory)


@pytest.fixture(scope="module")
def flapping(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_history("flapping", spark, tmp_path_factory)


def table(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return pq.read_table(report["out"] / name).to_pylist()


def test_one_restart_is_one_outage_of_78_s_not_hundreds_of_flaps(
    walkthrough: dict[str, Any],
) -> None:
    summary = walkthrough["summary"]
    killed, others = NAMES[KILLED], [n for i, n in enumerate(NAMES) if i != KILLED]
    [outage] = summary["outages"]
    assert outage["broker"] == killed
    assert outage["seconds"] == pytest.approx(DOWN, abs=INTERVAL)
    assert epoch(outage["start"]) == pytest.approx(START + KILL_AT, abs=INTERVAL)
    assert epoch(outage["end"]) == pytest.approx(START + KILL_AT + DOWN, abs=INTERVAL)
    assert outage["missed_samples"] == DOWN / INTERVAL
    assert outage["seen_down_by"] == others
    # The incidents: that outage and the restart (a crash: no stop announced), nothing else.
    incidents = [(i["kind"], i["broker"]) for i in summary["incidents"]]
    assert incidents == [("broker_outage", killed), ("crash_restart", killed)]
    assert summary["incidents"][0]["details"]["seconds"] == outage["seconds"]
    assert table(walkthrough, "link_flaps") == []


def test_each_peer_sees_one_outage_of_the_same_link_across_the_new_spid(
    walkthrough: dict[str, Any],
) -> None:
    outages = table(walkthrough, "link_outages")
    toward = [o for o in outages if o["peer_address"] == NAMES[KILLED]]
    assert sorted(o["broker"] for o in toward) == [n for i, n in enumerate(NAMES) if i != KILLED]
    for o in toward:
        assert o["seconds"] == pytest.approx(DOWN, abs=INTERVAL)
        assert o["down_samples"] == pytest.approx(DOWN / INTERVAL, abs=1)
        assert epoch(o["start"]) - epoch(o["last_up"]) == pytest.approx(INTERVAL)
    # The restarted broker listed its peers down in its first status: one sample, well
    # under a heartbeat gap, so no outage of theirs.
    rest = [o for o in outages if o["peer_address"] != NAMES[KILLED]]
    assert {o["broker"] for o in rest} == {NAMES[KILLED]}
    assert all(o["down_samples"] == 1 and o["seconds"] == INTERVAL for o in rest)
    states = ref.link_states(ref.load(walkthrough["lake"], "peer_samples"))
    for (observer, address), seq in states.items():
        changes = sum(a != b for (_, a), (_, b) in itertools.pairwise(seq))
        assert changes == (2 if KILLED in (NAMES.index(observer), NAMES.index(address)) else 0)


def test_real_flapping_is_counted_and_a_partition_is_a_link_outage(
    flapping: dict[str, Any],
) -> None:
    [flap] = table(flapping, "link_flaps")
    assert (flap["broker"], flap["peer_address"]) == (NAMES[0], NAMES[1])
    assert flap["transitions"] == 2 * len(FLAPS)
    assert flap["downs"] == len(FLAPS)
    assert epoch(flap["start"]) == pytest.approx(START + FLAPS[0][2] + 0.1)
    assert epoch(flap["end"]) == pytest.approx(START + FLAPS[-1][3] + 0.1)
    summary = flapping["summary"]
    observer, peer, since, until = PARTITION
    # The flap's downs last 2 samples: in link_outages, not outages of the report.
    [outage] = summary["outages"]
    assert outage == {
        "broker": NAMES[peer],
        "start": outage["start"],
        "end": outage["end"],
        "seconds": until - since,
        "missed_samples": None,
        "seen_down_by": [NAMES[observer]],
    }
    assert epoch(outage["start"]) == pytest.approx(START + since + 0.1)
    kinds = sorted((i["kind"], i["broker"]) for i in summary["incidents"])
    assert kinds == [("link_flap", NAMES[0]), ("link_outage", NAMES[peer])]
    assert len(table(flapping, "link_outages")) == 1 + len(FLAPS)


def secs(value: float | datetime | None) -> float | None:
    """Epoch seconds to the millisecond, for comparing Spark's rows with the reference's."""
    if value is None:
        return None
    return round(value if isinstance(value, float) else epoch(value), 3)


@pytest.mark.integration  # its histories' reports need the session's Spark
@pytest.mark.parametrize("fixture", ["walkthrough", "flapping", "report"])
def test_link_tables_agree_with_the_reference(fixture: str, request: pytest.FixtureRequest) -> None:
    """Spark's flaps and outages equal the plain-Python ones, on both histories and on the
    session's generated lake (whose failover and outage brokers come back, new spids)."""
    report = request.getfixturevalue(fixture)
    lake_dir = report["lake"] if "lake" in report else request.getfixturevalue("lake_dir")
    states = ref.link_states(ref.load(lake_dir, "peer_samples"))
    got_flaps = sorted(
        ((r["broker"], r["peer_address"]), secs(r["start"]), secs(r["end"]),
         r["transitions"], r["downs"])
        for r in table(report, "link_flaps")
    )  # fmt: skip
    want_flaps = sorted(
        (f["link"], secs(f["start"]), secs(f["end"]), f["transitions"], f["downs"])
        for f in ref.link_flaps(states, window=300.0, min_transitions=4)
    )
    assert got_flaps == want_flaps
    got_outages = sorted(
        ((r["broker"], r["peer_address"]), secs(r["last_up"]), secs(r["start"]),
         secs(r["end"]), r["down_samples"])
        for r in table(report, "link_outages")
    )  # fmt: skip
    want_outages = sorted(
        (o["link"], secs(o["last_up"]), secs(o["start"]), secs(o["end"]), o["down_samples"])
        for o in ref.link_outages(states)
    )
    assert got_outages == want_outages
    assert want_outages, "no outage in this history: the comparison would prove nothing"


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(START + seconds, tz=UTC)


def test_merge_outages_joins_overlapping_sources_per_broker() -> None:
    gaps = [
        {"broker": "b", "start": at(10), "end": at(20), "missed": 10},
        {"broker": "b", "start": at(100), "end": None, "missed": 50},
    ]
    links = [
        {"broker": "a", "peer_address": "b", "start": at(11), "end": at(21)},
        {"broker": "c", "peer_address": "b", "start": at(21), "end": at(25)},  # chained
        {"broker": "a", "peer_address": "b", "start": at(120), "end": at(130)},  # in the open one
        {"broker": "b", "peer_address": "c", "start": at(50), "end": at(60)},
    ]
    assert merge_outages(gaps, links) == [
        {
            "broker": "b",
            "start": "2026-01-05T10:00:10Z",
            "end": "2026-01-05T10:00:25Z",
            "seconds": 15.0,
            "missed_samples": 10,
            "seen_down_by": ["a", "c"],
        },
        {
            "broker": "c",
            "start": "2026-01-05T10:00:50Z",
            "end": "2026-01-05T10:01:00Z",
            "seconds": 10.0,
            "missed_samples": None,
            "seen_down_by": ["b"],
        },
        {
            "broker": "b",
            "start": "2026-01-05T10:01:40Z",
            "end": None,
            "seconds": None,
            "missed_samples": 50,
            "seen_down_by": ["a"],
        },
    ]


def test_walkthrough_lake_is_written_as_brokerd_lists_peers(tmp_path: Path) -> None:
    """After the restart each status lists the address twice: the old spid, inactive."""
    rows = write_history(tmp_path, History(seconds=300, kill=(KILLED, KILL_AT, DOWN)))
    late = [
        r
        for r in rows["peer_samples"]
        if r["broker"] == NAMES[0] and r["ts"] > START + KILL_AT + DOWN + 1
    ]
    toward = [r for r in late if r["peer_address"] == NAMES[KILLED]]
    assert len({r["peer"] for r in toward}) == 2
    assert {r["active"] for r in toward} == {True, False}
