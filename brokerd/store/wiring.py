"""The wiring store: durable exchanges, queues and bindings, and the console's
configuration, in SQLite in the data directory.

WAL mode with ``synchronous=NORMAL``: every change is committed at once and
survives a crash of the broker (kill -9); only a power loss can take the
last ones. AMQP field tables (arguments) are kept as JSON with tagged values
for what JSON lacks (bytes, decimals, timestamps), so they come back exactly.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS exchanges (
    vhost TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
    auto_delete INTEGER NOT NULL, internal INTEGER NOT NULL, arguments TEXT NOT NULL,
    PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS queues (
    vhost TEXT NOT NULL, name TEXT NOT NULL,
    auto_delete INTEGER NOT NULL, arguments TEXT NOT NULL, journal TEXT NOT NULL,
    PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS bindings (
    vhost TEXT NOT NULL, source TEXT NOT NULL, destination TEXT NOT NULL,
    kind TEXT NOT NULL, routing_key TEXT NOT NULL, arguments TEXT NOT NULL,
    PRIMARY KEY (vhost, source, destination, kind, routing_key, arguments));
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS owners (
    vhost TEXT NOT NULL, name TEXT NOT NULL, address TEXT NOT NULL,
    PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS groups (
    vhost TEXT NOT NULL, name TEXT NOT NULL, addresses TEXT NOT NULL,
    PRIMARY KEY (vhost, name));
"""


def encode_table(table: dict[str, Any]) -> str:
    """An AMQP field table as JSON, deterministic (sorted keys: the binding's key)."""
    return json.dumps(_tag(table), sort_keys=True, separators=(",", ":"))


def decode_table(text: str) -> dict[str, Any]:
    value = _untag(json.loads(text))
    return value if isinstance(value, dict) else {}


def _tag(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _tag(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_tag(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, datetime.datetime):
        return {"$time": value.isoformat()}
    return value


def _untag(value: Any) -> Any:
    if isinstance(value, list):
        return [_untag(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, inner),) = value.items()
            if key == "$bytes":
                return base64.b64decode(inner)
            if key == "$decimal":
                return decimal.Decimal(inner)
            if key == "$time":
                return datetime.datetime.fromisoformat(inner)
        return {k: _untag(v) for k, v in value.items()}
    return value


@dataclass
class StoredExchange:
    vhost: str
    name: str
    type: str
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]


@dataclass
class StoredQueue:
    vhost: str
    name: str
    auto_delete: bool
    arguments: dict[str, Any]
    journal: str


@dataclass
class StoredBinding:
    vhost: str
    source: str
    destination: str
    kind: str  # "queue" or "exchange"
    routing_key: str
    arguments: dict[str, Any]


class WiringStore:
    """The SQLite database of durable wiring (one per broker)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # -- changes ---------------------------------------------------------------------

    def put_exchange(self, x: StoredExchange) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO exchanges VALUES (?, ?, ?, ?, ?, ?)",
            (
                x.vhost,
                x.name,
                x.type,
                int(x.auto_delete),
                int(x.internal),
                encode_table(x.arguments),
            ),
        )

    def delete_exchange(self, vhost: str, name: str) -> None:
        with self.db:
            self.db.execute("DELETE FROM exchanges WHERE vhost = ? AND name = ?", (vhost, name))
            self.db.execute(
                "DELETE FROM bindings WHERE vhost = ? AND (source = ? OR "
                "(kind = 'exchange' AND destination = ?))",
                (vhost, name, name),
            )

    def put_queue(self, q: StoredQueue) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO queues VALUES (?, ?, ?, ?, ?)",
            (q.vhost, q.name, int(q.auto_delete), encode_table(q.arguments), q.journal),
        )

    def delete_queue(self, vhost: str, name: str) -> None:
        with self.db:
            self.db.execute("DELETE FROM queues WHERE vhost = ? AND name = ?", (vhost, name))
            self.db.execute("DELETE FROM owners WHERE vhost = ? AND name = ?", (vhost, name))
            self.db.execute("DELETE FROM groups WHERE vhost = ? AND name = ?", (vhost, name))
            self.db.execute(
                "DELETE FROM bindings WHERE vhost = ? AND kind = 'queue' AND destination = ?",
                (vhost, name),
            )

    def put_binding(self, b: StoredBinding) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO bindings VALUES (?, ?, ?, ?, ?, ?)",
            (b.vhost, b.source, b.destination, b.kind, b.routing_key, encode_table(b.arguments)),
        )

    def delete_binding(self, b: StoredBinding) -> None:
        self.db.execute(
            "DELETE FROM bindings WHERE vhost = ? AND source = ? AND destination = ? "
            "AND kind = ? AND routing_key = ? AND arguments = ?",
            (b.vhost, b.source, b.destination, b.kind, b.routing_key, encode_table(b.arguments)),
        )

    def put_owner(
        self, vhost: str, name: str, address: str, group: tuple[str, ...] | None = None
    ) -> None:
        """A durable shared queue's last owner, by address (a cluster's whole restart
        places the queue there again: its copy holds what it confirmed), and its
        group's if it names one (a quorum queue kept by some primaries only)."""
        self.db.execute("INSERT OR REPLACE INTO owners VALUES (?, ?, ?)", (vhost, name, address))
        if group is not None:
            self.db.execute(
                "INSERT OR REPLACE INTO groups VALUES (?, ?, ?)",
                (vhost, name, json.dumps(list(group))),
            )

    def put_setting(self, key: str, value: Any) -> None:
        self.db.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (key, json.dumps(value)))

    # -- reading it back ---------------------------------------------------------------

    def exchanges(self) -> list[StoredExchange]:
        rows = self.db.execute("SELECT * FROM exchanges ORDER BY rowid").fetchall()
        return [
            StoredExchange(v, n, t, bool(a), bool(i), decode_table(args))
            for v, n, t, a, i, args in rows
        ]

    def queues(self) -> list[StoredQueue]:
        rows = self.db.execute("SELECT * FROM queues ORDER BY rowid").fetchall()
        return [StoredQueue(v, n, bool(a), decode_table(args), j) for v, n, a, args, j in rows]

    def bindings(self) -> list[StoredBinding]:
        rows = self.db.execute("SELECT * FROM bindings ORDER BY rowid").fetchall()
        return [StoredBinding(v, s, d, k, r, decode_table(args)) for v, s, d, k, r, args in rows]

    def owners(self, vhost: str) -> dict[str, str]:
        rows = self.db.execute("SELECT name, address FROM owners WHERE vhost = ?", (vhost,))
        return dict(rows.fetchall())

    def groups(self, vhost: str) -> dict[str, tuple[str, ...]]:
        rows = self.db.execute("SELECT name, addresses FROM groups WHERE vhost = ?", (vhost,))
        return {name: tuple(json.loads(addresses)) for name, addresses in rows.fetchall()}

    def setting(self, key: str) -> Any:
        row = self.db.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])
