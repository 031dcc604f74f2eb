"""A status writes only the snapshot rows that changed (issue 43: 50 brokers x 1,000
queues, whose full snapshots mostly repeat what is stored).

Each link remembers the rows it stored; these tests check that the memory never
leaves the database behind: unchanged rows are not written, a changed one is, a
queue gone is deleted, a restarted broker's new link starts from the database, and
a status that fails leaves nothing remembered that the database does not hold.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clusterapi import ingest
from clusterapi.ingest import LinkProtocolError, LinkState
from clusterapi.models import BindingSnapshot, ExchangeSnapshot, QueueSnapshot
from tests.support.linkmessages import hello

pytestmark = pytest.mark.django_db

NAME = "127.0.0.1:5701"
SNAPSHOT_TABLES = ("queuesnapshot", "exchangesnapshot", "bindingsnapshot")


def queue(name: str, **over: Any) -> dict[str, Any]:
    entry = {
        "vhost": "/",
        "name": name,
        "durable": True,
        "exclusive": False,
        "auto_delete": False,
        "shared": False,
        "messages": 1,
        "unacked": 0,
        "consumers": 0,
        "enqueued": 10,
        "delivered": 5,
        "arguments": {"x-max-length": 100},
    }
    entry.update(over)
    return entry


def binding(destination: str, **over: Any) -> dict[str, Any]:
    entry = {
        "vhost": "/",
        "source": "ex",
        "destination": destination,
        "destination_type": "queue",
        "routing_key": destination,
        "arguments": {},
    }
    entry.update(over)
    return entry


EXCHANGE = {
    "vhost": "/",
    "name": "ex",
    "type": "direct",
    "durable": True,
    "auto_delete": False,
    "internal": False,
    "arguments": {},
}


class Link:
    """One broker's link: hello, then statuses with consecutive seqs."""

    def __init__(self, spid: str = "spid-1", started: float | None = None) -> None:
        started = time.time() if started is None else started
        broker, _ = ingest.register_hello(
            ingest.parse_hello(hello(NAME, spid, start_time=started)), f"chan-{spid}"
        )
        self.started = started
        self.state = LinkState(broker.pk, broker.name, broker.broker_type, spid=spid)
        self.seq = 0

    def full(self, queues: list[dict], bindings: list[dict] | None = None) -> None:
        names = [q["name"] for q in queues]
        self.send(
            True,
            queues,
            [EXCHANGE],
            [binding(n) for n in names] if bindings is None else bindings,
        )

    def delta(self, upsert: list[dict], remove: list[str] = ()) -> None:  # type: ignore[assignment]
        self.send(
            False,
            {"upsert": upsert, "remove": [["/", name] for name in remove]},
            {"upsert": [], "remove": []},
            {"upsert": [], "remove": []},
        )

    def send(self, full: bool, queues: Any, exchanges: Any, bindings: Any) -> None:
        message = {
            "v": 1,
            "type": "status",
            "seq": self.seq,
            "time": time.time(),
            "full": full,
            "view": {"is_root": True, "ready": True, "root_enabled": True, "peers": []},
            "counts": {},
            "totals": {},
            "rates": {},
            "queues": queues,
            "exchanges": exchanges,
            "bindings": bindings,
        }
        self.seq += 1  # (a status that fails uses its seq up too)
        assert not ingest.apply_status(self.state, message).resync


def stamps() -> dict[str, float]:
    return {q.name: q.updated_at.timestamp() for q in QueueSnapshot.objects.all()}


def rows() -> dict[str, tuple]:
    return {
        q.name: (q.messages, q.enqueued, q.delivered, q.arguments)
        for q in QueueSnapshot.objects.all()
    }


def snapshot_writes(queries: CaptureQueriesContext) -> list[str]:
    """The statements that wrote snapshot rows (an executemany counts its rows)."""
    out = []
    for query in queries.captured_queries:
        sql = query["sql"]
        if re.match(r"(\d+ times: )?(INSERT|UPDATE|DELETE)", sql) and any(
            f"clusterapi_{table}" in sql for table in SNAPSHOT_TABLES
        ):
            out.append(sql)
    return out


def written_rows(queries: CaptureQueriesContext, table: str) -> int:
    total = 0
    for sql in snapshot_writes(queries):
        if f'"clusterapi_{table}"' in sql and "INSERT" in sql:
            times = re.match(r"(\d+) times: ", sql)
            total += int(times.group(1)) if times else 1
    return total


def test_an_unchanged_full_snapshot_writes_no_snapshot_row() -> None:
    link = Link()
    link.full([queue("a"), queue("b"), queue("c")])
    before = stamps()
    with CaptureQueriesContext(connection) as queries:
        link.full([queue("a"), queue("b"), queue("c")])
    assert snapshot_writes(queries) == []
    assert stamps() == before  # updated_at: the last change, not the last report
    # nor does a delta that lists a queue as it is
    with CaptureQueriesContext(connection) as queries:
        link.delta([queue("b")])
    assert snapshot_writes(queries) == []
    assert QueueSnapshot.objects.count() == 3 and BindingSnapshot.objects.count() == 3


def test_a_change_writes_only_that_row() -> None:
    link = Link()
    link.full([queue("a"), queue("b"), queue("c")])
    before = stamps()
    with CaptureQueriesContext(connection) as queries:
        link.full([queue("a"), queue("b", messages=7, enqueued=16), queue("c")])
    assert written_rows(queries, "queuesnapshot") == 1
    assert written_rows(queries, "bindingsnapshot") == 0
    after = stamps()
    assert after["a"] == before["a"] and after["c"] == before["c"]
    assert after["b"] > before["b"]
    assert rows()["b"] == (7, 16, 5, {"x-max-length": 100})
    # a delta's change too, and an argument is a change
    with CaptureQueriesContext(connection) as queries:
        link.delta([queue("a"), queue("c", arguments={"x-max-length": 5})])
    assert written_rows(queries, "queuesnapshot") == 1
    assert rows()["c"] == (1, 10, 5, {"x-max-length": 5})
    assert rows()["a"] == (1, 10, 5, {"x-max-length": 100})


def test_a_changed_binding_is_written_alone() -> None:
    link = Link()
    link.full([queue("a"), queue("b")])
    with CaptureQueriesContext(connection) as queries:
        link.full(
            [queue("a"), queue("b")],
            bindings=[binding("a"), binding("b", arguments={"x-match": "all"})],
        )
    assert written_rows(queries, "bindingsnapshot") == 1
    assert written_rows(queries, "queuesnapshot") == 0
    got = dict(BindingSnapshot.objects.values_list("destination", "arguments"))
    assert got == {"a": {}, "b": {"x-match": "all"}}


def test_a_queue_gone_is_removed_and_can_come_back() -> None:
    link = Link()
    link.full([queue("a"), queue("b"), queue("c")])
    link.full([queue("a"), queue("c")])  # b was deleted on the broker
    assert sorted(rows()) == ["a", "c"]
    assert sorted(BindingSnapshot.objects.values_list("destination", flat=True)) == ["a", "c"]
    link.delta([], remove=["c"])
    assert sorted(rows()) == ["a"]
    # declared again (its counters from 0): written again, though it looks as it once did
    link.delta([queue("b"), queue("c")])
    assert sorted(rows()) == ["a", "b", "c"]
    link.full([queue("a")], bindings=[])
    assert sorted(rows()) == ["a"] and BindingSnapshot.objects.count() == 0
    assert ExchangeSnapshot.objects.count() == 1


def test_a_restarted_broker_replaces_its_rows() -> None:
    """A new run (new spid, new link) starts from what the database holds: what the old
    run had and the new one lacks goes, counts continue from the stored ones."""
    old = Link("spid-1")
    old.full([queue("a", enqueued=10, delivered=4), queue("b")])
    new = Link("spid-2")  # the broker restarted: its counters begin again at 0
    new.full([queue("a", enqueued=3, delivered=1, messages=2), queue("c")])
    assert sorted(rows()) == ["a", "c"]
    assert rows()["a"] == (2, 13, 5, {"x-max-length": 100})
    assert sorted(BindingSnapshot.objects.values_list("destination", flat=True)) == ["a", "c"]
    # and it goes on from there: only what changes is written
    with CaptureQueriesContext(connection) as queries:
        new.full([queue("a", enqueued=4, delivered=1, messages=3), queue("c")])
    assert written_rows(queries, "queuesnapshot") == 1
    assert rows()["a"] == (3, 14, 5, {"x-max-length": 100})


def test_a_console_restart_reads_the_rows_again() -> None:
    """A new link of the same run (the console restarted) finds the rows as stored."""
    first = Link("spid-1")
    first.full([queue("a"), queue("b")])
    again = Link("spid-1", first.started)  # the same run: its start time too
    with CaptureQueriesContext(connection) as queries:
        again.full([queue("a"), queue("b", messages=4)])
    assert written_rows(queries, "queuesnapshot") == 1
    assert rows()["b"][0] == 4


def test_a_status_that_fails_leaves_nothing_remembered() -> None:
    """A status whose transaction rolls back (here: a malformed binding after its
    queues were applied) must not leave the link believing its rows were stored."""
    link = Link()
    link.full([queue("a"), queue("b")])
    bad = [binding("a"), binding("b", destination_type="topic")]
    with pytest.raises(LinkProtocolError, match="destination_type"):
        link.full([queue("a", messages=9), queue("b")], bindings=bad)
    assert rows()["a"][0] == 1  # rolled back
    link.full([queue("a", messages=9), queue("b")])  # the same change, well formed
    assert rows()["a"][0] == 9
