"""The archive task: samples leave the database for the Parquet lake exactly once."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from clusterapi import archive, tasks
from clusterapi.models import ArchiveBatch, Broker, HeartbeatSample, QueueSample
from pipeline import lake

pytestmark = pytest.mark.django_db

NOW = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC)
PEERS = [
    {"spid": "spid-b", "address": "127.0.0.1:5702", "active": True, "rtt_ms": 1.5},
    {"spid": "", "address": "127.0.0.1:5703", "active": False, "rtt_ms": None},
]


@pytest.fixture
def lake_dir(tmp_path: Path, settings: Any) -> Path:
    settings.LAKE_PATH = tmp_path / "lake"
    settings.ARCHIVE_AFTER = 60
    return settings.LAKE_PATH


@pytest.fixture
def brokers() -> list[Broker]:
    return [
        Broker.objects.create(name="127.0.0.1:5701", spid="spid-a", broker_type="primary"),
        Broker.objects.create(name="127.0.0.1:5702", spid="spid-b", broker_type="secondary"),
    ]


def add_history(brokers: list[Broker], minutes: range, start: dt.datetime = NOW) -> None:
    """One heartbeat and two queue samples per broker and minute before ``start``."""
    for minute in minutes:
        time = start - dt.timedelta(minutes=minute)
        for i, broker in enumerate(brokers):
            HeartbeatSample.objects.create(
                broker=broker,
                time=time,
                published_total=1000 - minute,
                routed_total=2000 - minute,
                delivered_total=900 - minute,
                rate_published=1.0,
                is_root=i == 0,
                ready=True,
                peers=PEERS,
                spid="" if minute > 100 else broker.spid,  # rows from before the field
                root="spid-a" if minute <= 100 else "",
            )
            for queue in ("orders", "audit"):
                QueueSample.objects.create(
                    broker=broker, time=time, vhost="/", queue=queue, messages=minute
                )


def counts(root: Path) -> dict[str, int]:
    return {name: lake.read_table(root, name).num_rows for name in lake.SCHEMAS}


def test_old_samples_move_to_the_lake_and_leave_the_database(
    lake_dir: Path, brokers: list[Broker]
) -> None:
    add_history(brokers, range(0, 180, 10))  # 18 samples 10 min apart, 11 older than 60 min
    result = archive.archive_samples(archive.archive_cutoff(NOW))

    assert (result.heartbeats, result.queue_samples, result.peer_samples) == (22, 44, 44)
    assert counts(lake_dir) == {"broker_samples": 22, "queue_samples": 44, "peer_samples": 44}
    # only the archived rows were deleted: the last hour stays for the dashboard
    cutoff = NOW - dt.timedelta(minutes=60)
    assert not HeartbeatSample.objects.filter(time__lt=cutoff).exists()
    assert HeartbeatSample.objects.filter(time__gte=cutoff).count() == 14
    assert QueueSample.objects.filter(time__gte=cutoff).count() == 28
    assert not QueueSample.objects.filter(time__lt=cutoff).exists()
    assert all(b.done_at is not None for b in ArchiveBatch.objects.all())


def test_rows_keep_their_values_partitions_and_peer_links(
    lake_dir: Path, brokers: list[Broker]
) -> None:
    add_history(brokers, range(70, 200, 10))
    archive.archive_samples(archive.archive_cutoff(NOW))

    rows = lake.read_table(lake_dir, "broker_samples").sort_by([("ts", "ascending")]).to_pylist()
    newest_a = [r for r in rows if r["broker"] == "127.0.0.1:5701"][-1]
    assert newest_a["ts"] == NOW - dt.timedelta(minutes=70)
    assert newest_a["published_total"] == 930 and newest_a["routed_total"] == 1930
    assert (newest_a["spid"], newest_a["root"], newest_a["is_root"]) == ("spid-a", "spid-a", True)
    assert newest_a["broker_type"] == "primary"
    oldest_b = next(r for r in rows if r["broker"] == "127.0.0.1:5702")
    # a sample from before spid/root were recorded: the broker's spid, root unknown
    assert (oldest_b["spid"], oldest_b["root"], oldest_b["broker_type"]) == (
        "spid-b",
        None,
        "secondary",
    )

    peers = lake.read_table(lake_dir, "peer_samples").to_pylist()
    assert {(p["peer"], p["peer_address"], p["active"], p["rtt_ms"]) for p in peers} == {
        ("spid-b", "127.0.0.1:5702", True, 1.5),
        ("", "127.0.0.1:5703", False, None),
    }
    queues = lake.read_table(lake_dir, "queue_samples")
    assert set(queues.column("queue").to_pylist()) == {"orders", "audit"}
    # hive partitions: UTC day and the percent-encoded broker name, file named by batch
    files = sorted(p.relative_to(lake_dir).as_posix() for p in lake_dir.rglob("*.parquet"))
    assert "broker_samples/date=2026-03-02/broker=127.0.0.1%3A5701/" in files[0]
    batch = ArchiveBatch.objects.filter(kind="heartbeats", broker=brokers[0]).get()
    assert any(f.endswith(f"part-{batch.batch_id}.parquet") for f in files)


def test_running_twice_writes_nothing_twice(lake_dir: Path, brokers: list[Broker]) -> None:
    add_history(brokers, range(0, 300, 10))
    first = archive.archive_samples(archive.archive_cutoff(NOW))
    before = counts(lake_dir)
    files = sorted(lake_dir.rglob("*.parquet"))
    second = archive.archive_samples(archive.archive_cutoff(NOW))

    assert first.batches > 0 and second.batches == 0
    assert counts(lake_dir) == before
    assert sorted(lake_dir.rglob("*.parquet")) == files


def test_a_batch_whose_delete_failed_is_redone_under_the_same_files(
    lake_dir: Path, brokers: list[Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    add_history(brokers, range(60, 400, 10))
    real_delete = archive.delete_ids

    def crash(model: Any, ids: Any) -> int:
        raise OSError("database went away")

    monkeypatch.setattr(archive, "delete_ids", crash)
    with pytest.raises(OSError):
        archive.archive_samples(archive.archive_cutoff(NOW), batch_rows=10)
    written = counts(lake_dir)
    assert written["broker_samples"] == 10  # the first batch reached the lake ...
    assert HeartbeatSample.objects.count() == 2 * 34  # ... but left no row
    assert ArchiveBatch.objects.filter(done_at=None).count() == 1

    # new samples arrive meanwhile; the next run redoes the batch, then the rest
    add_history(brokers, range(1, 5), start=NOW - dt.timedelta(minutes=61, seconds=30))
    monkeypatch.setattr(archive, "delete_ids", real_delete)
    result = archive.archive_samples(archive.archive_cutoff(NOW), batch_rows=10)
    assert result.redone == 1
    total = 2 * 34 - 2 + 2 * 4  # every sample older than an hour, exactly once
    assert counts(lake_dir)["broker_samples"] == total
    assert counts(lake_dir)["queue_samples"] == 2 * total
    assert counts(lake_dir)["peer_samples"] == 2 * total
    assert HeartbeatSample.objects.count() == 2  # the two at exactly an hour old stay
    assert not ArchiveBatch.objects.filter(done_at=None).exists()
    # and once more: nothing to do, nothing rewritten
    again = archive.archive_samples(archive.archive_cutoff(NOW), batch_rows=10)
    assert again.batches == 0 and counts(lake_dir)["broker_samples"] == total


def test_a_redone_batch_whose_rows_were_deleted_changes_nothing(
    lake_dir: Path, brokers: list[Broker]
) -> None:
    """The crash came after the delete committed but the batch record was kept: no-op."""
    add_history(brokers, range(70, 100, 10))
    archive.archive_samples(archive.archive_cutoff(NOW))
    before = counts(lake_dir)
    ArchiveBatch.objects.update(done_at=None)
    result = archive.archive_samples(archive.archive_cutoff(NOW))
    assert result.redone == ArchiveBatch.objects.count() == 4
    assert counts(lake_dir) == before


def test_retention_prunes_only_what_was_archived(
    lake_dir: Path, brokers: list[Broker], settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention shorter than the archive age: the prune task archives up to its cutoff."""
    settings.ARCHIVE_AFTER = 240
    settings.HEARTBEAT_RETENTION = 2  # hours
    now = timezone.now() - dt.timedelta(minutes=1)
    add_history(brokers, range(0, 300, 30), start=now)  # 1, 31, ... 271 minutes old
    pruned = tasks.prune_heartbeats()

    assert counts(lake_dir)["broker_samples"] == 2 * 6  # 121..271 minutes: archived ...
    assert pruned["heartbeats"] == 0  # ... so retention found nothing left to prune
    assert HeartbeatSample.objects.count() == 2 * 4  # 0..90 minutes old

    # a failing archive prunes nothing
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("lake not writable")

    add_history(brokers, range(150, 160, 10), start=now)
    monkeypatch.setattr(archive.lake, "write_rows", broken)
    with pytest.raises(OSError):
        tasks.prune_heartbeats()
    assert HeartbeatSample.objects.count() == 2 * 5


def test_bad_settings_are_refused(lake_dir: Path, settings: Any) -> None:
    settings.ARCHIVE_AFTER = -1
    with pytest.raises(ValueError, match="ARCHIVE_AFTER"):
        archive.archive_cutoff()
    with pytest.raises(ValueError, match="ARCHIVE_BATCH_ROWS"):
        archive.archive_samples(NOW, batch_rows=0)


def test_ingested_statuses_reach_the_lake_with_spid_root_and_peers(lake_dir: Path) -> None:
    """From a link's hello and status through ingest to lake rows (the spid comes from
    the hello, the root from the status's view)."""
    from clusterapi import ingest
    from tests.unit.test_clusterapi_ingest import hello, status

    broker, _ = ingest.register_hello(ingest.parse_hello(hello(spid="spid-7")), "chan")
    link = ingest.LinkState(broker.pk, broker.name, broker.broker_type, spid=broker.spid)
    ingest.apply_status(link, status(0, True, []))
    sample = HeartbeatSample.objects.get()
    assert (sample.spid, sample.root) == ("spid-7", "spid-1")

    archive.archive_samples(timezone.now() + dt.timedelta(seconds=1))
    (row,) = lake.read_table(lake_dir, "broker_samples").to_pylist()
    assert (row["broker"], row["spid"], row["root"], row["broker_type"]) == (
        "127.0.0.1:5701",
        "spid-7",
        "spid-1",
        "primary",
    )
    peers = lake.read_table(lake_dir, "peer_samples").to_pylist()
    assert sorted((p["peer"], p["peer_address"], p["active"], p["rtt_ms"]) for p in peers) == [
        ("spid-2", "127.0.0.1:5702", True, 0.4),
        ("spid-3", "127.0.0.1:5703", False, None),
    ]
    assert not HeartbeatSample.objects.exists()


def test_a_planned_stop_reaches_the_lake_and_older_files_read_as_no_stop(
    lake_dir: Path, tmp_path: Path
) -> None:
    """The ``stopping`` mark goes into the lake's ``stopping`` column (issue 45); files
    archived before the column existed lack it and read as false, next to new ones."""
    import pyarrow.parquet as pq

    from clusterapi import ingest
    from tests.unit.test_clusterapi_ingest import hello, status

    broker, _ = ingest.register_hello(ingest.parse_hello(hello(spid="spid-7")), "chan")
    link = ingest.LinkState(broker.pk, broker.name, broker.broker_type, spid=broker.spid)
    now = timezone.now().timestamp()
    ingest.apply_status(link, status(0, True, [], t=now - 2))
    ingest.apply_status(link, status(1, True, [], t=now - 1))
    assert ingest.record_stopping(link, "spid-7", "SIGTERM")
    ingest.apply_status(link, status(2, True, [], t=now))  # on its way out
    # a file archived by an older console: no stopping column
    old = lake.rows_to_table("broker_samples", [archive.broker_row(
        {**HeartbeatSample.objects.values().first(), "time": NOW - dt.timedelta(days=1)},
        "127.0.0.1:5709", "spid-9", "primary",
    )]).drop_columns(["broker", "stopping"])  # fmt: skip
    directory = lake.partition_dir(lake_dir, "broker_samples", "2026-03-01", "127.0.0.1:5709")
    directory.mkdir(parents=True)
    pq.write_table(old, directory / "part-old.parquet")

    archive.archive_samples(timezone.now() + dt.timedelta(seconds=1))
    rows = lake.read_table(lake_dir, "broker_samples").sort_by([("ts", "ascending")]).to_pylist()
    assert [(r["broker"], r["stopping"]) for r in rows] == [
        ("127.0.0.1:5709", False),
        ("127.0.0.1:5701", False),
        ("127.0.0.1:5701", True),
        ("127.0.0.1:5701", False),
    ]
    # a report's own lake: the archive's files (old and new) linked, read alike
    view = archive.report_lake(tmp_path / "run-lake", None, None)
    assert view.broker_samples == 4
    linked = lake.read_table(view.root, "broker_samples").column("stopping").to_pylist()
    assert sorted(linked) == [False, False, False, True]


def test_archive_passes_take_turns(tmp_path: Path) -> None:
    """A second pass waits for the first (flock on the lake's _archive.lock)."""
    import threading

    entered = threading.Event()

    def second() -> None:
        with archive.exclusive(tmp_path):
            entered.set()

    with archive.exclusive(tmp_path):
        worker = threading.Thread(target=second)
        worker.start()
        assert not entered.wait(0.3)
    assert entered.wait(5)
    worker.join()
    assert (tmp_path / "_archive.lock").exists()
    assert lake.read_table(tmp_path, "broker_samples").num_rows == 0  # readers skip it
