"""Move heartbeat history from the database into the Parquet lake (``pipeline.lake``).

Samples older than ``ARCHIVE_AFTER`` minutes are archived per broker in batches
of at most ``ARCHIVE_BATCH_ROWS`` samples, ordered by id. Each batch is first
recorded as an :class:`ArchiveBatch` (broker, id range, time cutoff), then its
rows are written to the lake as ``part-<hb|qs>-<first id>-<last id>.parquet`` in
every (date, broker) partition they fall in, and finally deleted from the
database in the transaction that marks the batch done.

Why this is idempotent: a batch left undone (a crash, a failed delete) is redone
first on the next run. Its rows are all still in the database (the delete did
not commit), so the redo writes the same rows, possibly plus late-committed ones
of the same id range, under the same file names: the files are replaced, never
added to. A new batch always starts at an id that no earlier batch wrote (those
rows were deleted and ids are not reused), so its files never collide with
earlier ones.

Heartbeat samples become ``broker_samples`` rows and, one per entry of their
``peers``, ``peer_samples`` rows; queue samples become ``queue_samples`` rows. A
sample's fields that the lake has under the same name are copied as they are
(``BROKER_COPIED``), ``stopping`` among them: the mark ``ingest.record_stopping``
puts on a run's last sample when the broker announces a planned stop, which the
traffic report tells from a crash by. Files archived before that column existed
lack it; ``pipeline.lake.read_table`` and the report read them as false.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusterapi.models import ArchiveBatch, Broker, HeartbeatSample, QueueSample
from pipeline import lake

log = logging.getLogger(__name__)

#: lock file of archive passes in the lake root (``_``: readers skip it)
LOCK_NAME = "_archive.lock"
#: primary keys per DELETE statement (SQLite allows 32766 parameters)
DELETE_CHUNK = 5_000


def _copied(table: str, model: type[HeartbeatSample] | type[QueueSample]) -> tuple[str, ...]:
    """The columns of lake ``table`` that a sample of ``model`` carries under the same name."""
    fields = {f.attname for f in model._meta.concrete_fields}
    return tuple(name for name in lake.SCHEMAS[table].names if name in fields)


BROKER_COPIED = _copied("broker_samples", HeartbeatSample)
QUEUE_COPIED = _copied("queue_samples", QueueSample)

MODELS: dict[str, type[HeartbeatSample] | type[QueueSample]] = {
    ArchiveBatch.KIND_HEARTBEATS: HeartbeatSample,
    ArchiveBatch.KIND_QUEUE_SAMPLES: QueueSample,
}


@dataclass
class ArchiveResult:
    """What one archive pass did (the Celery task's return value)."""

    cutoff: str
    lake: str
    batches: int = 0
    redone: int = 0
    heartbeats: int = 0
    queue_samples: int = 0
    peer_samples: int = 0
    files: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "cutoff": self.cutoff,
            "lake": self.lake,
            "batches": self.batches,
            "redone": self.redone,
            "heartbeats": self.heartbeats,
            "queue_samples": self.queue_samples,
            "peer_samples": self.peer_samples,
            "files": len(self.files),
        }


def lake_root() -> Path:
    return Path(settings.LAKE_PATH)


def archive_cutoff(now: dt.datetime | None = None, minutes: float | None = None) -> dt.datetime:
    """Samples strictly older than this are archived."""
    minutes = settings.ARCHIVE_AFTER if minutes is None else minutes
    if minutes < 0:
        raise ValueError(f"ARCHIVE_AFTER must be 0 or more minutes, not {minutes}")
    return (now or timezone.now()) - dt.timedelta(minutes=minutes)


def cutoff_before_prune(now: dt.datetime | None = None) -> dt.datetime:
    """The archive cutoff that covers everything retention is about to delete: the
    later of ``ARCHIVE_AFTER`` minutes and ``HEARTBEAT_RETENTION`` hours ago."""
    now = now or timezone.now()
    retention = now - dt.timedelta(hours=settings.HEARTBEAT_RETENTION)
    return max(archive_cutoff(now), retention)


def archive_samples(
    cutoff: dt.datetime | None = None,
    root: str | Path | None = None,
    batch_rows: int | None = None,
) -> ArchiveResult:
    """Archive every sample older than ``cutoff`` (default: ``ARCHIVE_AFTER`` minutes ago).

    Unfinished batches of an earlier run are completed first. Raises if a write or
    a delete fails; what was done before stays done, the rest is redone next time.
    """
    cutoff = cutoff or archive_cutoff()
    root = Path(root or lake_root())
    batch_rows = settings.ARCHIVE_BATCH_ROWS if batch_rows is None else batch_rows
    if batch_rows < 1:
        raise ValueError(f"ARCHIVE_BATCH_ROWS must be positive, not {batch_rows}")
    result = ArchiveResult(cutoff=cutoff.isoformat(), lake=str(root))
    with exclusive(root):
        names = dict(Broker.objects.values_list("id", "name"))
        for batch in ArchiveBatch.objects.filter(done_at=None).order_by("id"):
            log.info("archive: redoing unfinished batch %s of %s", batch.batch_id, batch.broker_id)
            _run_batch(batch, root, names, result)
            result.redone += 1
        for kind, model in MODELS.items():
            for batch in _plan(kind, model, cutoff, batch_rows):
                _run_batch(batch, root, names, result)
    if result.batches:
        log.info("archive: %s", result.as_dict())
    return result


@contextlib.contextmanager
def exclusive(root: Path) -> Iterator[None]:
    """One archive pass at a time per lake (the hourly pass and a report's may meet):
    two passes with different cutoffs would plan different batches over the same rows."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _plan(
    kind: str, model: type[HeartbeatSample] | type[QueueSample], cutoff: dt.datetime, size: int
) -> Iterator[ArchiveBatch]:
    """Batches of up to ``size`` samples of one broker, in id order, recorded before use."""
    old = model.objects.filter(time__lt=cutoff)
    for broker_id in old.order_by().values_list("broker_id", flat=True).distinct():
        after = 0
        while True:
            ids = list(
                old.filter(broker_id=broker_id, id__gt=after)
                .order_by("id")
                .values_list("id", flat=True)[:size]
            )
            if not ids:
                break
            yield ArchiveBatch.objects.create(
                kind=kind, broker_id=broker_id, first_id=ids[0], last_id=ids[-1], cutoff=cutoff
            )
            after = ids[-1]


def _run_batch(
    batch: ArchiveBatch, root: Path, names: dict[int, str], result: ArchiveResult
) -> None:
    """Write one batch's rows to the lake, then delete them and mark the batch done."""
    model = MODELS[batch.kind]
    rows = model.objects.filter(
        broker_id=batch.broker_id,
        id__gte=batch.first_id,
        id__lte=batch.last_id,
        time__lt=batch.cutoff,
    ).order_by("id")
    name = names.get(batch.broker_id)
    if name is None:  # a broker added since the names were read
        name = Broker.objects.values_list("name", flat=True).get(pk=batch.broker_id)
        names[batch.broker_id] = name
    files: list[Path] = []
    if batch.kind == ArchiveBatch.KIND_HEARTBEATS:
        samples = list(rows.values())
        broker = Broker.objects.values("spid", "broker_type").get(pk=batch.broker_id)
        broker_rows = [broker_row(s, name, broker["spid"], broker["broker_type"]) for s in samples]
        peer_rows = [row for s in samples for row in peer_sample_rows(s, name)]
        files += lake.write_rows(root, "broker_samples", broker_rows, batch.batch_id)
        files += lake.write_rows(root, "peer_samples", peer_rows, batch.batch_id)
        result.heartbeats += len(samples)
        result.peer_samples += len(peer_rows)
    else:
        samples = list(rows.values())
        queue_rows = [queue_row(s, name) for s in samples]
        files += lake.write_rows(root, "queue_samples", queue_rows, batch.batch_id)
        result.queue_samples += len(samples)
    with transaction.atomic():
        delete_ids(model, [s["id"] for s in samples])
        batch.done_at = timezone.now()
        batch.rows = len(samples)
        batch.files = [str(path.relative_to(root)) for path in files]
        batch.save(update_fields=["done_at", "rows", "files"])
    result.batches += 1
    result.files += [str(path) for path in files]


def delete_ids(model: type[HeartbeatSample] | type[QueueSample], ids: Sequence[int]) -> int:
    """Delete exactly the archived rows (not a range: a late commit in it was not written)."""
    deleted = 0
    for start in range(0, len(ids), DELETE_CHUNK):
        chunk = ids[start : start + DELETE_CHUNK]
        deleted += model.objects.filter(pk__in=chunk).delete()[0]
    return deleted


# -- rows of the lake ------------------------------------------------------------------------


def broker_row(
    sample: dict[str, Any], broker: str, broker_spid: str, broker_type: str
) -> dict[str, Any]:
    """A heartbeat sample as a ``broker_samples`` row.

    Older samples have no spid or root: the broker's current spid stands in, and the
    root is the broker itself when it was root, else unknown (null).
    """
    row = {name: sample[name] for name in BROKER_COPIED}
    spid = sample["spid"] or broker_spid
    row.update(
        ts=sample["time"],
        broker=broker,
        spid=spid,
        broker_type=broker_type,
        root=sample["root"] or (spid if sample["is_root"] else None),
    )
    return row


def peer_sample_rows(sample: dict[str, Any], broker: str) -> list[dict[str, Any]]:
    """One ``peer_samples`` row per peer link the broker reported in this status."""
    rows = []
    for peer in sample["peers"] or []:
        if not isinstance(peer, dict):
            continue
        rtt = peer.get("rtt_ms")
        rows.append(
            {
                "ts": sample["time"],
                "broker": broker,
                "peer": str(peer.get("spid") or ""),
                "peer_address": str(peer.get("address") or ""),
                "active": bool(peer.get("active")),
                "rtt_ms": float(rtt) if isinstance(rtt, int | float) else None,
            }
        )
    return rows


def queue_row(sample: dict[str, Any], broker: str) -> dict[str, Any]:
    """A queue sample as a ``queue_samples`` row."""
    row = {name: sample[name] for name in QUEUE_COPIED}
    row.update(ts=sample["time"], broker=broker)
    return row


# -- a lake for one report run: the archive plus what is not archived yet -------------------

#: batch-id prefix of the not-yet-archived samples a report lake holds
LIVE_PREFIX = "live"
#: partition of the empty file that stands for a table without rows (Spark needs a file)
EMPTY_PARTITION = ("1970-01-01", "-")


@dataclass
class ReportLake:
    """What :func:`report_lake` put together for one run."""

    root: Path
    linked: int = 0
    live: dict[str, int] = field(default_factory=dict)
    broker_samples: int = 0


def report_lake(dest: Path, start: dt.datetime | None, end: dt.datetime | None) -> ReportLake:
    """A lake at ``dest`` for a report over ``[start, end)``: the archive's files of the
    days in the period (symbolic links, nothing copied) plus every sample still in the
    database, written as Parquet there (never moved: the dashboard's charts need them).

    This is why a report works from a fresh install's first minute, before anything is
    old enough to archive, and why a report never misses the last hour. Built while
    holding the archive lock, so no archive pass moves rows between the two halves:
    every sample is read once, from the lake or from the database (an unfinished
    batch's files are left out, its rows being still in the database).
    """
    root = lake_root()
    result = ReportLake(root=dest)
    dest.mkdir(parents=True, exist_ok=True)
    with exclusive(root):
        unfinished = {batch.batch_id for batch in ArchiveBatch.objects.filter(done_at=None)}
        for table in lake.SCHEMAS:
            for part in _archived_parts(root / table, start, end):
                if part.stem.removeprefix("part-") in unfinished:
                    continue
                target = dest / part.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(part.resolve())
                result.linked += 1
        names = dict(Broker.objects.values_list("id", "name"))
        brokers = {b["id"]: b for b in Broker.objects.values("id", "spid", "broker_type")}
        for kind, model in MODELS.items():
            rows = model.objects.all()
            if start is not None:
                rows = rows.filter(time__gte=start)
            if end is not None:
                rows = rows.filter(time__lt=end)
            for chunk in _chunks(rows):
                _write_live(dest, kind, chunk, names, brokers, result)
    for table in lake.SCHEMAS:
        if not (dest / table).is_dir():  # Spark cannot read a table that has no file
            day, broker = EMPTY_PARTITION
            directory = lake.partition_dir(dest, table, day, broker)
            directory.mkdir(parents=True)
            pq.write_table(lake.file_schema(table).empty_table(), directory / "part-empty.parquet")
    result.broker_samples = count_rows(dest, "broker_samples", start, end)
    return result


def _archived_parts(table_dir: Path, start: dt.datetime | None, end: dt.datetime | None):
    """The Parquet files of one lake table on the days ``[start, end)`` touches."""
    if not table_dir.is_dir():
        return
    first = start.astimezone(dt.UTC).date().isoformat() if start else None
    last = end.astimezone(dt.UTC).date().isoformat() if end else None
    for day_dir in sorted(table_dir.glob("date=*")):
        day = day_dir.name.removeprefix("date=")
        if (first and day < first) or (last and day > last):
            continue
        yield from sorted(day_dir.glob("broker=*/part-*.parquet"))


def _chunks(rows: Any) -> Iterator[list[dict[str, Any]]]:
    """``rows`` (a queryset) in id order, ``ARCHIVE_BATCH_ROWS`` at a time."""
    size = settings.ARCHIVE_BATCH_ROWS
    after = 0
    while True:
        chunk = list(rows.filter(id__gt=after).order_by("id").values()[:size])
        if not chunk:
            return
        yield chunk
        after = chunk[-1]["id"]


def _write_live(
    dest: Path,
    kind: str,
    samples: list[dict[str, Any]],
    names: dict[int, str],
    brokers: dict[int, dict[str, Any]],
    result: ReportLake,
) -> None:
    batch = f"{LIVE_PREFIX}-{kind}-{samples[0]['id']}-{samples[-1]['id']}"
    if kind == ArchiveBatch.KIND_HEARTBEATS:
        broker_rows = [
            broker_row(
                s,
                names[s["broker_id"]],
                brokers[s["broker_id"]]["spid"],
                brokers[s["broker_id"]]["broker_type"],
            )
            for s in samples
        ]
        peer_rows = [row for s in samples for row in peer_sample_rows(s, names[s["broker_id"]])]
        lake.write_rows(dest, "broker_samples", broker_rows, batch)
        lake.write_rows(dest, "peer_samples", peer_rows, batch)
        result.live["broker_samples"] = result.live.get("broker_samples", 0) + len(broker_rows)
        result.live["peer_samples"] = result.live.get("peer_samples", 0) + len(peer_rows)
    else:
        rows = [queue_row(s, names[s["broker_id"]]) for s in samples]
        lake.write_rows(dest, "queue_samples", rows, batch)
        result.live["queue_samples"] = result.live.get("queue_samples", 0) + len(rows)


def count_rows(root: Path, table: str, start: dt.datetime | None, end: dt.datetime | None) -> int:
    """Rows of ``table`` under ``root`` with ``ts`` in ``[start, end)`` (pyarrow, no Spark)."""
    base = root / table
    if not base.is_dir():
        return 0
    dataset = ds.dataset(base, format="parquet", partitioning="hive", ignore_prefixes=[".", "_"])
    condition = None
    for bound, op in ((start, "ge"), (end, "lt")):
        if bound is None:
            continue
        value = pa.scalar(bound.astimezone(dt.UTC), type=lake.TS)
        term = pc.field("ts") >= value if op == "ge" else pc.field("ts") < value
        condition = term if condition is None else condition & term
    return dataset.count_rows(filter=condition)


def has_samples(start: dt.datetime | None, end: dt.datetime | None) -> bool:
    """Whether any broker sample lies in ``[start, end)``: in the database, or in the
    archived files of the days the period touches.

    Asked before a report run is accepted, so a period without data is refused at once
    instead of becoming a failed run; cheap (one EXISTS, then row counts of the few
    Parquet files of those days, which pyarrow answers from their statistics).
    """
    rows = HeartbeatSample.objects.all()
    if start is not None:
        rows = rows.filter(time__gte=start)
    if end is not None:
        rows = rows.filter(time__lt=end)
    if rows.exists():
        return True
    parts = [str(p) for p in _archived_parts(lake_root() / "broker_samples", start, end)]
    if not parts:
        return False
    dataset = ds.dataset(parts, format="parquet", schema=lake.file_schema("broker_samples"))
    condition = None
    for bound, op in ((start, "ge"), (end, "lt")):
        if bound is None:
            continue
        value = pa.scalar(bound.astimezone(dt.UTC), type=lake.TS)
        term = pc.field("ts") >= value if op == "ge" else pc.field("ts") < value
        condition = term if condition is None else condition & term
    return dataset.count_rows(filter=condition) > 0
