"""The per-queue journal: record format and CRC, torn tails, group commit, recovery,
compaction, and a property: replaying any prefix of a journal gives the state the
queue had when that prefix was written."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brokerd.store import records as rec
from brokerd.store.committer import Committer
from brokerd.store.journal import CorruptRecord as QueueJournalCorrupt
from brokerd.store.journal import QueueJournal
from tests.support.examples import examples


def journal(tmp_path: Path, segment_size: int = 4096) -> QueueJournal:
    j = QueueJournal(tmp_path / "q", segment_size)
    j.dir.mkdir(parents=True, exist_ok=True)
    return j


def commit(j: QueueJournal) -> None:
    committer = Committer()
    committer.register(j)
    committer.close()


def reopen(j: QueueJournal) -> tuple[QueueJournal, list]:
    j.close()
    again = QueueJournal(j.dir, j.segment_size)
    return again, again.recover()


# -- the record format ------------------------------------------------------------------


def test_records_round_trip_with_their_offsets() -> None:
    head, body = rec.enqueue_parts(7, rec.PERSISTENT, "x", "rk", b"\x10\x00\x02", b"body!")
    data = head + body + rec.ref(rec.ACQUIRE, 7) + rec.ref(rec.DEQUEUE, 7)
    records, end, problem = rec.scan(data)
    assert problem is None and end == len(data)
    enqueue = records[0]
    assert isinstance(enqueue, rec.Enqueue)
    assert (enqueue.id, enqueue.exchange, enqueue.routing_key, enqueue.body) == (
        7,
        "x",
        "rk",
        b"body!",
    )
    assert data[enqueue.body_offset : enqueue.body_offset + 5] == b"body!"
    assert [(r.kind, r.id) for r in records[1:]] == [(rec.ACQUIRE, 7), (rec.DEQUEUE, 7)]
    assert rec.starts(data, 3) == [0, len(head) + len(body), len(head) + len(body) + 17]


def test_a_flipped_bit_fails_the_crc_and_ends_the_reading() -> None:
    good = rec.ref(rec.ACQUIRE, 1)
    bad = bytearray(rec.ref(rec.DEQUEUE, 2))
    bad[-1] ^= 0x01
    records, end, problem = rec.scan(good + bytes(bad))
    assert len(records) == 1 and end == len(good)
    assert problem is not None and "CRC" in problem


@pytest.mark.parametrize("cut", range(1, 30))
def test_a_torn_last_record_is_dropped(cut: int) -> None:
    first = rec.ref(rec.ACQUIRE, 1)
    head, body = rec.enqueue_parts(2, rec.PERSISTENT, "", "q", b"", b"x" * 20)
    whole = first + head + body
    records, end, problem = rec.scan(whole[: len(first) + cut])
    assert [r.id for r in records] == [1] and end == len(first)
    assert problem is not None and "torn" in problem


def test_zeros_after_the_last_record_end_the_segment_quietly() -> None:
    data = rec.ref(rec.ACQUIRE, 1) + bytes(100)
    records, end, problem = rec.scan(data)
    assert len(records) == 1 and problem is None and end == 17


# -- the journal on disk --------------------------------------------------------------------


def test_recovery_brings_back_live_persistent_messages_in_order(tmp_path: Path) -> None:
    j = journal(tmp_path)
    ids = [j.enqueue("", "q", b"", b"m%d" % i, persistent=True) for i in range(5)]
    j.enqueue("", "q", b"", b"transient", persistent=False)  # paged only: not recovered
    j.mark(rec.ACQUIRE, ids[1])  # delivered, never settled: comes back redelivered
    j.mark(rec.ACQUIRE, ids[2])
    j.mark(rec.DEQUEUE, ids[2])  # acked: gone for good
    commit(j)
    again, recovered = reopen(j)
    assert [(r.body, r.redelivered) for r in recovered] == [
        (b"m0", False),
        (b"m1", True),
        (b"m3", False),
        (b"m4", False),
    ]
    new = again.enqueue("", "q", b"", b"after", persistent=True)
    assert new > max(ids) + 1  # ids keep growing, past the transient one too


def test_records_roll_into_fixed_size_segments_and_big_ones_get_their_own(tmp_path: Path) -> None:
    j = journal(tmp_path, segment_size=1024)
    for _i in range(20):
        j.enqueue("", "q", b"", b"x" * 100, persistent=True)
    big = j.enqueue("", "q", b"", b"y" * 5000, persistent=True)
    commit(j)
    assert len(j.segments) >= 3
    assert all(os.path.getsize(s.path) == s.capacity for s in j.segments.values())
    assert j.read_body(big) == b"y" * 5000
    _again, recovered = reopen(j)
    assert len(recovered) == 21


def test_recovery_after_a_torn_tail_on_disk(tmp_path: Path) -> None:
    j = journal(tmp_path)
    ids = [j.enqueue("", "q", b"", b"m%d" % i, persistent=True) for i in range(3)]
    commit(j)
    segment = j.segments[1]
    j.close()
    # a crash in the middle of the next write: half a record after the last good one
    head, body = rec.enqueue_parts(99, rec.PERSISTENT, "", "q", b"", b"torn" * 50)
    with open(segment.path, "r+b") as f:
        f.seek(segment.tail)
        f.write((head + body)[:40])
    again = QueueJournal(j.dir, j.segment_size)
    recovered = again.recover()
    assert [r.id for r in recovered] == ids


def test_paged_bodies_read_back_once_durable(tmp_path: Path) -> None:
    j = journal(tmp_path)
    jid = j.enqueue("ex", "rk", b"", b"paged body", persistent=False)
    assert not j.is_durable(jid)
    commit(j)
    assert j.is_durable(jid)
    assert j.read_body(jid) == b"paged body"


def test_compaction_frees_the_oldest_segments_and_keeps_live_messages(tmp_path: Path) -> None:
    from brokerd.store.disk import DiskStore

    j = journal(tmp_path, segment_size=1024)
    ids = [j.enqueue("", "q", b"", b"x" * 100, persistent=True) for i in range(40)]
    keep = ids[3]
    j.mark(rec.ACQUIRE, keep)  # delivered and unsettled when compacted
    for jid in ids:
        if jid != keep:
            j.mark(rec.DEQUEUE, jid)
    commit(j)
    before = len(j.segments)

    class Holder:
        journal = j

    store = DiskStore.__new__(DiskStore)
    store.stores = {("/", "q"): Holder()}  # type: ignore[dict-item]
    store.committer = Committer()
    store.segments_freed = store.records_copied = 0
    for _ in range(10):
        store.compact()
        store.committer.commit_now()
    assert len(j.segments) < before
    assert min(j.segments) > 1  # the oldest went
    _again, recovered = reopen(j)
    assert [(r.id, r.redelivered) for r in recovered] == [(keep, True)]


# -- the replay property -------------------------------------------------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.booleans(), st.binary(max_size=300)),
        st.tuples(st.just("acquire"), st.integers(0, 30)),
        st.tuples(st.just("dequeue"), st.integers(0, 30)),
    ),
    max_size=40,
)


def _apply(ops: list, j: QueueJournal | None) -> tuple[dict[int, tuple[bytes, bool]], list[int]]:
    """The state a sequence of operations leaves (the model), driving ``j`` too;
    returns the live persistent messages and the byte length after each op."""
    live: dict[int, tuple[bytes, bool]] = {}
    order: list[int] = []
    next_id = 1
    for op in ops:
        if op[0] == "enqueue":
            _kind, persistent, body = op
            jid = j.enqueue("", "q", b"", body, persistent=persistent) if j else next_id
            next_id = jid + 1
            order.append(jid)
            if persistent:
                live[jid] = (body, False)
        else:
            kind, index = op
            if not order:
                continue
            jid = order[index % len(order)]
            if jid not in live and j is not None and jid in j.where:
                continue  # a transient message: its records matter only while paged
            if jid not in live:
                continue
            if kind == "acquire":
                if j:
                    j.mark(rec.ACQUIRE, jid)
                live[jid] = (live[jid][0], True)
            else:
                if j:
                    j.mark(rec.DEQUEUE, jid)
                del live[jid]
    return live, order


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=OPS, data=st.data())
def test_replaying_any_prefix_gives_the_state_at_that_point(
    tmp_path_factory: pytest.TempPathFactory, ops: list, data: st.DataObject
) -> None:
    tmp = tmp_path_factory.mktemp("replay")
    j = journal(tmp, segment_size=2048)
    cut = data.draw(st.integers(0, len(ops)))
    _apply(ops[:cut], j)
    commit(j)
    expected, _ = _apply(ops[:cut], None)
    _again, recovered = reopen(j)
    assert {r.id: (r.body, r.redelivered) for r in recovered} == expected


def test_crc_is_over_the_payload() -> None:
    payload = struct.pack("!BQ", rec.ACQUIRE, 5)
    length, crc = rec.HEADER.unpack_from(rec.ref(rec.ACQUIRE, 5))
    assert length == len(payload) and crc == zlib.crc32(payload)


# -- reads never run ahead of the committer (issue 20) ----------------------------------


def test_a_body_compaction_moved_reads_back_before_the_copy_is_written(tmp_path: Path) -> None:
    """Compaction appends a sparse segment's live records at the head and points the
    message there at once; a read before the committer writes the copy used to
    ``pread`` the preallocated zeros (issue 20's zero-filled bodies)."""
    j = journal(tmp_path, segment_size=1024)
    ids = [j.enqueue("", "q", b"", bytes([i]) * 100, persistent=True) for i in range(40)]
    keep = ids[2]
    for jid in ids:
        if jid != keep:
            j.mark(rec.DEQUEUE, jid)
    commit(j)
    first = j.oldest()
    assert first is not None and j.sparse(first)
    moved, corrupt = j.copy_live(first)
    assert (moved, corrupt) == (1, [])
    assert j.where[keep].segment != first.number  # points at the copy, not yet written
    assert j.read_body(keep) == bytes([2]) * 100
    assert not j.removable(first)  # the copy is not on disk: the old one stays
    commit(j)
    assert j.removable(first)
    assert j.read_body(keep) == bytes([2]) * 100  # now from disk, CRC-checked


def test_a_damaged_record_is_refused_and_quarantined(tmp_path: Path) -> None:
    j = journal(tmp_path)
    jid = j.enqueue("ex", "rk", b"", b"A" * 200, persistent=True)
    commit(j)
    where = j.where[jid]
    fd = j.segments[where.segment].open()
    os.pwrite(fd, b"B", where.body_offset + 17)  # one byte of the body rots
    with pytest.raises(QueueJournalCorrupt) as caught:
        j.read_body(jid)
    error = caught.value
    assert error.jid == jid and "CRC" in error.reason
    path = j.quarantine(error)
    assert path is not None and path.read_bytes() == error.raw
    assert jid not in j.where  # no longer live: a restart does not bring it back
    with pytest.raises(QueueJournalCorrupt):
        j.read_body(jid)  # asked again, still refused
