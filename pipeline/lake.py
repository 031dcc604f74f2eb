"""The heartbeat lake: Parquet datasets of broker, queue and peer samples.

Plain Python + pyarrow (no Spark) so the console's archive task can write it.

Layout, one dataset per table under ``root``::

    <root>/<table>/date=YYYY-MM-DD/broker=<quoted name>/part-<batch_id>.parquet

``date`` (UTC day of ``ts``) and ``broker`` are hive partition columns: they live
in the path only, not in the files.  The broker name (``host:port``) is
percent-encoded in the path (``:`` is not safe in Hadoop paths); Spark and
pyarrow both decode it when reading.  A file's name depends only on its batch,
so writing the same batch again replaces its files instead of adding rows: that
is what makes the archive task idempotent.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

TS = pa.timestamp("us", tz="UTC")

BROKER_SAMPLES = pa.schema(
    [
        ("ts", TS),
        ("broker", pa.string()),
        ("spid", pa.string()),
        ("broker_type", pa.string()),
        ("is_root", pa.bool_()),
        ("root", pa.string()),
        ("ready", pa.bool_()),
        ("peers_active", pa.int32()),
        ("peers_known", pa.int32()),
        ("connections", pa.int32()),
        ("consumers", pa.int32()),
        ("queues", pa.int32()),
        ("messages_ready", pa.int64()),
        ("messages_unacked", pa.int64()),
        ("published_total", pa.int64()),
        ("routed_total", pa.int64()),
        ("delivered_total", pa.int64()),
        ("rate_published", pa.float64()),
        ("rate_routed", pa.float64()),
        ("rate_delivered", pa.float64()),
        ("stopping", pa.bool_()),
        ("bridged_total", pa.int64()),
    ]
)

QUEUE_SAMPLES = pa.schema(
    [
        ("ts", TS),
        ("broker", pa.string()),
        ("vhost", pa.string()),
        ("queue", pa.string()),
        ("messages", pa.int64()),
        ("unacked", pa.int64()),
        ("consumers", pa.int32()),
        ("enqueued_total", pa.int64()),
        ("delivered_total", pa.int64()),
        ("rate_in", pa.float64()),
        ("rate_out", pa.float64()),
    ]
)

PEER_SAMPLES = pa.schema(
    [
        ("ts", TS),
        ("broker", pa.string()),
        ("peer", pa.string()),
        ("peer_address", pa.string()),
        ("active", pa.bool_()),
        ("rtt_ms", pa.float64()),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "broker_samples": BROKER_SAMPLES,
    "queue_samples": QUEUE_SAMPLES,
    "peer_samples": PEER_SAMPLES,
}

# Columns that may be null; every other column is required in each row.
NULLABLE: dict[str, frozenset[str]] = {
    "broker_samples": frozenset({"root", "rate_published", "rate_routed", "rate_delivered"}),
    "queue_samples": frozenset({"rate_in", "rate_out"}),
    "peer_samples": frozenset({"rtt_ms"}),
}

# Columns added after lakes were first written: a row may leave one out, and files
# written before lack it; both read as this value (``read_table``, the report's reader).
# ``stopping``: the broker announced a planned stop at or before this sample (issue 45).
# ``bridged_total``: messages its bridges forwarded since it started (issue 42).
ADDED: dict[str, dict[str, Any]] = {
    "broker_samples": {"stopping": False, "bridged_total": 0},
    "queue_samples": {},
    "peer_samples": {},
}

_BATCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class LakeError(ValueError):
    """Bad input to the lake writer (unknown table, bad batch id, bad row)."""


def file_schema(table: str) -> pa.Schema:
    """The schema stored in the files: the table's schema minus the ``broker`` partition."""
    schema = table_schema(table)
    return schema.remove(schema.get_field_index("broker"))


def table_schema(table: str) -> pa.Schema:
    """The full row schema of ``table`` (``broker`` included, ``date`` not)."""
    try:
        return SCHEMAS[table]
    except KeyError:
        raise LakeError(f"unknown table {table!r}; expected one of {sorted(SCHEMAS)}") from None


def _to_ts(value: Any, table: str, index: int) -> datetime:
    """Rows carry datetimes (naive means UTC) or epoch seconds, as the console link does."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), tz=UTC)
    raise LakeError(f"{table} row {index}: ts must be a datetime or epoch seconds, not {value!r}")


def rows_to_table(table: str, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Validate dict rows and build an Arrow table with the table's schema."""
    schema = table_schema(table)
    nullable = NULLABLE[table]
    added = ADDED[table]
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise LakeError(f"{table} row {index}: expected a mapping, got {type(row).__name__}")
        for name in schema.names:
            value = row.get(name)
            if value is None and name in added:
                value = added[name]
            if value is None and name not in nullable:
                raise LakeError(f"{table} row {index}: missing required field {name!r}")
            if name == "ts":
                value = _to_ts(value, table, index)
            columns[name].append(value)
    try:
        return pa.Table.from_pydict(columns, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise LakeError(f"{table}: bad field value: {exc}") from None


def partition_dir(root: str | os.PathLike[str], table: str, day: str, broker: str) -> Path:
    """The directory of one (date, broker) partition of ``table``."""
    return Path(root) / table / f"date={day}" / f"broker={quote(broker, safe='')}"


def write_table(
    root: str | os.PathLike[str], table: str, data: pa.Table, batch_id: str
) -> list[Path]:
    """Write an Arrow table (the table's schema) into the lake; returns the files written.

    Rows are split by (UTC date, broker); each partition gets ``part-<batch_id>.parquet``,
    written to a temporary name and renamed, so a reader never sees half a file and a
    repeated batch replaces its files.
    """
    schema = table_schema(table)
    if not isinstance(batch_id, str) or not _BATCH_ID.match(batch_id):
        raise LakeError(
            f"bad batch id {batch_id!r}: 1-128 characters of letters, digits, '_', '.', '-'"
        )
    if data.num_rows == 0:
        return []
    data = data.select(schema.names).cast(schema)
    days = pc.strftime(data.column("ts"), format="%Y-%m-%d")
    keys = pa.table({"day": days, "broker": data.column("broker")})
    groups = keys.group_by(["day", "broker"], use_threads=False).aggregate([])
    stored = file_schema(table)
    written: list[Path] = []
    for day, broker in zip(
        groups.column("day").to_pylist(), groups.column("broker").to_pylist(), strict=True
    ):
        mask = pc.and_(pc.equal(days, day), pc.equal(data.column("broker"), broker))
        part = data.filter(mask).select(stored.names).sort_by("ts")
        directory = partition_dir(root, table, day, broker)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"part-{batch_id}.parquet"
        tmp = directory / f".part-{batch_id}.{uuid.uuid4().hex}.tmp"
        pq.write_table(part, tmp, compression="zstd")
        os.replace(tmp, target)
        written.append(target)
    return written


def write_rows(
    root: str | os.PathLike[str], table: str, rows: list[dict[str, Any]], batch_id: str
) -> list[Path]:
    """Write dict rows (one per sample) as batch ``batch_id``; idempotent per batch."""
    return write_table(root, table, rows_to_table(table, rows), batch_id)


def read_table(root: str | os.PathLike[str], table: str) -> pa.Table:
    """Read a whole table back (``broker`` decoded from the path, ``date`` dropped).

    The dataset's schema is given, not inferred from one file: files written before a
    column was ``ADDED`` lack it, and read as its default.
    """
    schema = table_schema(table)
    base = Path(root) / table
    if not base.is_dir():
        return schema.empty_table()
    keys = pa.schema([("date", pa.string()), ("broker", pa.string())])
    dataset = ds.dataset(
        base,
        schema=pa.unify_schemas([file_schema(table), keys]),
        format="parquet",
        partitioning=ds.partitioning(keys, flavor="hive"),
        exclude_invalid_files=False,
        ignore_prefixes=[".", "_"],
    )
    data = dataset.to_table(columns=schema.names)
    for name, default in ADDED[table].items():
        index = data.schema.get_field_index(name)
        filled = pc.fill_null(data.column(name), pa.scalar(default, schema.field(name).type))
        data = data.set_column(index, name, filled)
    return data.cast(schema)
