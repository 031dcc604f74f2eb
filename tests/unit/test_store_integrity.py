"""Store integrity (issue 20): a body read back from disk is checked against its
record, and a damaged one is never delivered as if it were the message. It is
skipped by the queue, counted (queue, store, metrics), raised as the ``store``
alarm, kept in ``quarantine/`` for recovery tooling, and does not come back after
a restart; recovery skips a record damaged in place instead of dropping the rest
of its segment."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from brokerd.config import default_config
from brokerd.model.broker import Broker
from brokerd.model.queue import Queue
from brokerd.model.vhost import VirtualHost
from brokerd.store import committer as committer_module
from brokerd.store import records as rec
from brokerd.store.committer import Committer
from brokerd.store.disk import DiskStore
from brokerd.store.journal import QueueJournal
from brokerd.store.queues import JournalQueueStore
from tests.unit.queue_support import Sink, msg


def durable_queue(store: DiskStore, name: str = "q") -> Queue:
    vhost = VirtualHost("/", store)
    queue, _ = vhost.declare_queue(name, connection_id=0, durable=True)
    return queue


def fill(queue: Queue, count: int) -> None:
    for i in range(count):
        queue.push(msg(f"body-{i:04d}" * 8, delivery_mode=2))


def rot(journal: QueueJournal, jid: int, at: int = 5) -> None:
    """Flip one byte of a message's body on disk, as a failing disk would."""
    where = journal.where[jid]
    fd = journal.segments[where.segment].open()
    offset = where.body_offset + at
    byte = os.pread(fd, 1, offset)
    os.pwrite(fd, bytes([byte[0] ^ 0xFF]), offset)


def test_a_paged_message_found_corrupt_is_skipped_counted_and_kept(tmp_path: Path) -> None:
    disk = DiskStore(tmp_path, page_limit=100)
    queue = durable_queue(disk)
    fill(queue, 20)
    disk.committer.commit_now()
    store = queue.store
    assert isinstance(store, JournalQueueStore) and store.journal is not None
    paged = [m for m in queue.messages if m.paged]
    assert len(paged) > 5
    victim = paged[3].jid  # type: ignore[attr-defined]
    rot(store.journal, victim)

    sink = Sink()
    queue.add_consumer(sink)
    got = sink.bodies()
    assert len(got) == 19  # every other message, intact and in order
    expected = [f"body-{i:04d}".encode() * 8 for i in range(20)]
    lost = expected[victim - 1]
    assert got == [b for b in expected if b != lost]
    assert queue.stats_corrupt == 1 and store.corrupt == 1 and disk.corrupt == 1
    alarm = disk.alarm()
    assert alarm is not None and alarm["kind"] == "store"
    assert f"journal id {victim}" in alarm["message"]
    assert "queue 'q' in vhost '/'" in alarm["message"]
    kept = list((tmp_path / "quarantine").iterdir())
    assert len(kept) == 1 and kept[0].name.endswith(f"-{victim}.rec")
    assert rec.check_enqueue(kept[0].read_bytes(), victim, len(kept[0].read_bytes())) == (
        "fails its CRC"
    )

    # a restart brings back the unacked messages but not the corrupt one
    disk.committer.commit_now()
    store.journal.close()
    again = DiskStore(tmp_path, page_limit=100)
    again._recovering.add(("/", "q"))  # its journal is read, not wiped
    queue2 = durable_queue(again)
    store2 = queue2.store
    assert isinstance(store2, JournalQueueStore) and store2.journal is not None
    recovered = store2.journal.recover()
    assert [r.body for r in recovered] == [b for b in expected if b != lost]
    assert all(r.redelivered for r in recovered)  # all were delivered, none acked


def test_basic_get_skips_a_corrupt_head(tmp_path: Path) -> None:
    disk = DiskStore(tmp_path, page_limit=0)  # everything pages
    queue = durable_queue(disk)
    fill(queue, 3)
    disk.committer.commit_now()
    store = queue.store
    assert isinstance(store, JournalQueueStore) and store.journal is not None
    assert queue.take(no_ack=True) is not None  # the first stays in memory
    second = queue.messages[0]
    assert second.paged
    rot(store.journal, second.jid)  # type: ignore[attr-defined]
    got = queue.take(no_ack=True)
    assert got is not None and got[0].body == b"body-0002" * 8
    assert got[2] == 0  # nothing left
    assert queue.stats_corrupt == 1


def test_an_unwritten_paged_body_reads_from_memory(tmp_path: Path) -> None:
    """Before the committer has run, a paged body comes from memory, not the
    preallocated zeros its record will replace."""
    disk = DiskStore(tmp_path, page_limit=0)
    queue = durable_queue(disk)
    disk.committer.register = lambda journal, done=None: None  # type: ignore[method-assign]
    fill(queue, 3)
    got = [queue.take(no_ack=True) for _ in range(3)]
    assert [g[0].body for g in got if g] == [f"body-{i:04d}".encode() * 8 for i in range(3)]
    assert queue.stats_corrupt == 0


def test_recovery_skips_a_record_damaged_in_place_and_keeps_the_rest(tmp_path: Path) -> None:
    journal = QueueJournal(tmp_path / "queues" / "q", 1 << 20, tmp_path / "quarantine")
    journal.dir.mkdir(parents=True)
    ids = [journal.enqueue("", "q", b"", b"m%03d" % i * 10, persistent=True) for i in range(10)]
    committer = Committer()
    committer.register(journal)
    committer.close()
    rot(journal, ids[4])
    journal.close()

    again = QueueJournal(journal.dir, 1 << 20, tmp_path / "quarantine")
    recovered = again.recover()
    assert [r.id for r in recovered] == [i for i in ids if i != ids[4]]
    assert [e.jid for e in again.damaged] == [ids[4]]
    assert "CRC" in again.damaged[0].reason
    assert len(list((tmp_path / "quarantine").glob("*-recovery.rec"))) == 1


async def test_a_failed_commit_is_written_again_and_reads_stay_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round whose write fails nacks its publishers, keeps the bodies readable from
    memory, and writes the records again: the segment is never marked durable past
    a hole a later round would otherwise paper over."""
    monkeypatch.setattr(committer_module, "RETRY_AFTER", 0.01)
    journal = QueueJournal(tmp_path / "queues" / "q", 1 << 20, tmp_path / "quarantine")
    journal.dir.mkdir(parents=True)
    committer = Committer()
    real_write = QueueJournal.write
    calls = {"n": 0}

    def flaky(pending: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(5, "Input/output error")
        real_write(pending)

    monkeypatch.setattr(QueueJournal, "write", staticmethod(flaky))
    outcomes: list[bool] = []
    first = journal.enqueue("", "q", b"", b"first" * 20, persistent=True)
    committer.register(journal, lambda ok, _n: outcomes.append(ok))
    await asyncio.sleep(0)  # the failing round is under way
    second = journal.enqueue("", "q", b"", b"second" * 20, persistent=True)
    committer.register(journal, lambda ok, _n: outcomes.append(ok))
    assert journal.read_body(first) == b"first" * 20  # from memory meanwhile
    await committer.drain()
    committer.close()
    assert outcomes == [False, True] and committer.failures == 1
    assert journal.is_durable(first) and journal.is_durable(second)
    assert not journal.unwritten
    assert journal.read_body(first) == b"first" * 20  # now from disk, checked
    journal.close()
    recovered = QueueJournal(journal.dir, 1 << 20).recover()
    assert [r.body for r in recovered] == [b"first" * 20, b"second" * 20]


def test_recovery_keeps_a_deep_queue_on_disk_past_its_memory(tmp_path: Path) -> None:
    """A deep durable queue's recovery reads back only the bodies that fit the
    queue's memory limit; the rest come back as paged stand-ins, read (checked)
    when delivered, so a restart holds what the running queue would."""
    disk = DiskStore(tmp_path, page_limit=1000)
    queue = durable_queue(disk)
    fill(queue, 200)  # 72-byte bodies: 14 KiB in all
    disk.committer.commit_now()
    store = queue.store
    assert isinstance(store, JournalQueueStore) and store.journal is not None
    store.journal.close()

    config = default_config()
    again = DiskStore(tmp_path, page_limit=1000)
    broker = Broker(config.user_database(), config.vhosts, config.limits, again)
    assert again.recover(broker)["messages"] == 200
    recovered = broker.vhosts["/"].queues["q"]
    paged = [m for m in recovered.messages if m.paged]
    assert len(paged) >= 180  # only ~1,000 bytes of bodies were read into memory
    assert recovered.bytes <= 1000 + 72
    sink = Sink()
    recovered.add_consumer(sink)
    assert sink.bodies() == [f"body-{i:04d}".encode() * 8 for i in range(200)]
    assert recovered.stats_corrupt == 0


def recovered_flags(tmp_path: Path, name: str = "q") -> list[tuple[bytes, bool]]:
    """The queue as a restart brings it back: (body, redelivered) in order."""
    config = default_config()
    again = DiskStore(tmp_path)
    broker = Broker(config.user_database(), config.vhosts, config.limits, again)
    again.recover(broker)
    return [(m.body, r) for m, r in broker.vhosts["/"].queues[name].ready()]


def test_a_restored_message_comes_back_flagged_after_a_restart(tmp_path: Path) -> None:
    """``Queue.restore`` (a forward sent again after a failover, a former master's
    message) writes the message flagged: a restart must not offer it as a first
    delivery to a consumer that may have seen it."""
    disk = DiskStore(tmp_path)
    queue = durable_queue(disk)
    queue.push(msg("first", delivery_mode=2))
    queue.restore(msg("again", delivery_mode=2))
    disk.committer.commit_now()
    assert recovered_flags(tmp_path) == [(b"first", False), (b"again", True)]


def test_a_replicas_copy_written_flagged_comes_back_flagged(tmp_path: Path) -> None:
    """A replica writes what its master sends under the master's ids; a copy the
    master had flagged (restored, or requeued before the replica's snapshot) keeps
    the flag on the replica's disk, through a restart and so through a full-cluster
    crash that this replica then leads."""
    disk = DiskStore(tmp_path)
    queue = durable_queue(disk)
    store = queue.store
    assert isinstance(store, JournalQueueStore)
    store.enqueued(msg("plain", delivery_mode=2), None, jid=7)
    store.enqueued(msg("seen", delivery_mode=2), None, jid=9, redelivered=True)
    disk.committer.commit_now()
    assert recovered_flags(tmp_path) == [(b"plain", False), (b"seen", True)]
