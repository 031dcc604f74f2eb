"""A stateful model of one queue's journal, interleaving everything that touches it.

Issue 20 (zero-filled bodies from a deep durable queue) lived in a window between
two steps: compaction re-appended a message and pointed it at the copy, and a read
came before the committer had written that copy. Example tests pin the windows we
thought of; this machine lets hypothesis look for the others. It drives one
``QueueJournal`` with the committer's round split into its three steps (``take``
on the loop, ``write`` in the worker thread, ``written`` back on the loop; one
round in flight at a time, as the real ``Committer`` runs them; a write may also
fail part way and be put back, as ``Committer._run`` does), the real
``DiskStore.compact``, reads, and crashes (optionally tearing the round being
written) followed by ``recover`` on the same directory.

What recovery must give back is decided per commit "generation" (the index of
the round a record was taken in):

- a message is *confirmed* once the round holding its enqueue record finished
  ``written`` (a publisher confirm would have gone out): it must come back unless
  a DEQUEUE of it may have reached disk (compaction deletes a segment only once the
  records that settled its last messages are on disk, so a message dequeued to be
  dead-lettered elsewhere is never lost from both places);
- a message whose enqueue reached disk (``write`` done) but was not confirmed, or
  whose DEQUEUE did not reach disk, may come back; one whose DEQUEUE reached disk
  or whose enqueue never did must not;
- whatever comes back is exactly what was enqueued (body, exchange, routing key,
  properties), persistent, once per id, flagged redelivered if an ACQUIRE of it
  reached disk (or it had come back redelivered before), and not flagged if it was
  never delivered.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from brokerd.store import records as rec
from brokerd.store.committer import Committer
from brokerd.store.disk import DiskStore
from brokerd.store.journal import Pending, QueueJournal, Recovered
from brokerd.store.queues import JournalQueueStore
from tests.support.examples import examples

#: tiny segments: they roll every few messages, so compaction has work on most runs
SEGMENT_SIZE = 1024
#: the generation of a record read back by recovery: on disk before anything since
RECOVERED = -1


def pattern(jid: int, size: int) -> bytes:
    """A body that is never zeros (what a read ahead of the committer returns)."""
    return bytes((jid * 7 + i) % 255 + 1 for i in range(size))


def _sized(low: int, high: int) -> st.SearchStrategy[bytes]:
    return st.integers(low, high).flatmap(lambda n: st.binary(min_size=n, max_size=n))


#: mostly small (a segment holds many, so some get sparse), some up to 600 bytes, now
#: and then one larger than a segment (it gets a segment of its own), rarely one over
#: 64 KiB (read back from disk as a view, not a copy)
BODIES = st.integers(0, 19).flatmap(
    lambda k: (
        st.binary(max_size=64)
        if k < 12
        else _sized(65, 600)
        if k < 19
        else st.one_of(
            _sized(SEGMENT_SIZE, SEGMENT_SIZE + 400),
            st.just(70 * 1024).map(lambda n: pattern(n, n)),
        )
    )
)
EXCHANGES = st.sampled_from(["", "amq.direct", "ex"])
ROUTING_KEYS = st.text(max_size=8)
PROPS = st.binary(max_size=12)
#: picks one of the candidates (modulo their number), so steps shrink well
PICK = st.integers(min_value=0, max_value=1 << 16)


@dataclass
class Message:
    """What the model knows of one journal id (kept after it is settled, until a
    crash decides whether it comes back)."""

    jid: int
    exchange: str
    routing_key: str
    props: bytes
    body: bytes
    persistent: bool
    #: generation of its enqueue record
    enqueued: int
    #: it came back from a recovery flagged redelivered
    redelivered: bool = False
    #: a consumer holds it (acquired, not settled or requeued)
    delivered: bool = False
    #: generation of its first ACQUIRE since it was (re)loaded
    acquired: int | None = None
    #: generation of its DEQUEUE
    dequeued: int | None = None
    #: generation of the latest copy compaction made of it
    moved: int | None = None

    @property
    def live(self) -> bool:
        return self.dequeued is None


class Rounds:
    """Stands in for the ``Committer`` that ``DiskStore.compact`` and the queue store
    register with: the machine runs the rounds itself, one step at a time."""

    def register(self, journal: QueueJournal, done: object = None) -> None:
        """Nothing to do: ``take`` picks up whatever was appended."""

    def forget(self, journal: QueueJournal) -> None:
        """Nothing registered is kept."""


class JournalMachine(RuleBasedStateMachine):
    """One queue's journal against a model of what each step guarantees."""

    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="journal-machine-"))
        self.dir = self.root / "queues" / "q"
        self.dir.mkdir(parents=True)
        self.msgs: dict[int, Message] = {}
        #: ids that were known and did not come back from a crash (until reused)
        self.gone: set[int] = set()
        self.crashes = 0
        self._start(QueueJournal(self.dir, SEGMENT_SIZE, self.root / "quarantine"))

    def _start(self, journal: QueueJournal) -> None:
        """A (new or recovered) journal, its queue store and the compacting store."""
        self.journal = journal
        self.queue = JournalQueueStore(journal, cast(Committer, Rounds()), durable=True, label="/q")
        # the real compaction, over a store holding just this queue
        self.disk = DiskStore.__new__(DiskStore)
        self.disk.stores = {("/", "q"): self.queue}
        self.disk.committer = cast(Committer, Rounds())
        self.disk.segments_freed = self.disk.records_copied = 0
        #: rounds taken so far: appends go into round ``taken``
        self.taken = 0
        #: rounds whose ``write`` finished (their bytes are on disk)
        self.on_disk = 0
        #: rounds whose ``written`` finished (confirmed)
        self.confirmed = 0
        #: compaction deleted segments since the start (a crash may matter then)
        self.removed = False
        #: rounds some of whose bytes may be on disk (a failed write, put back)
        self.partial: set[int] = set()
        self.inflight: Pending | None = None

    def teardown(self) -> None:
        self.journal.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- picking messages ----------------------------------------------------------------

    def _live(self) -> list[Message]:
        return [m for m in self.msgs.values() if m.live]

    def _ready(self) -> list[Message]:
        return [m for m in self.msgs.values() if m.live and not m.delivered]

    def _delivered(self) -> list[Message]:
        return [m for m in self.msgs.values() if m.live and m.delivered]

    def _moved_unconfirmed(self) -> list[Message]:
        """Messages compaction copied whose copy's round has not finished: issue 20's
        window (the journal already points reads at the copy)."""
        return [
            m
            for m in self.msgs.values()
            if m.live and m.moved is not None and m.moved >= self.confirmed
        ]

    @staticmethod
    def _pick(candidates: list[Message], index: int) -> Message:
        return candidates[index % len(candidates)]

    # -- appends (event loop) ------------------------------------------------------------

    @initialize(count=st.integers(0, 40), size=st.integers(1, 64), persistent=st.booleans())
    def backlog(self, count: int, size: int, persistent: bool) -> None:
        """A queue with a backlog of small confirmed messages over several segments:
        the steps start where compaction has something to do."""
        self.enqueue_many(count, size, persistent)
        if self.journal.dirty:
            self.commit()

    def _enqueue(
        self, exchange: str, routing_key: str, props: bytes, body: bytes, persistent: bool
    ) -> Message:
        jid = self.journal.enqueue(exchange, routing_key, props, body, persistent=persistent)
        assert jid not in self.msgs, f"journal id {jid} handed out twice"
        self.gone.discard(jid)  # nothing of the lost one is on disk (its id was free)
        m = Message(jid, exchange, routing_key, props, body, persistent, self.taken)
        self.msgs[jid] = m
        return m

    @rule(
        persistent=st.booleans(),
        body=BODIES,
        exchange=EXCHANGES,
        routing_key=ROUTING_KEYS,
        props=PROPS,
    )
    def enqueue(
        self, persistent: bool, body: bytes, exchange: str, routing_key: str, props: bytes
    ) -> None:
        """A persistent publish, or (transient) a page-out: its record only serves paging."""
        self._enqueue(exchange, routing_key, props, body, persistent)

    @rule(count=st.integers(1, 16), size=st.integers(1, 64), persistent=st.booleans())
    def enqueue_many(self, count: int, size: int, persistent: bool) -> None:
        """A burst of small messages: fills segments fast, so some get sparse."""
        for _ in range(count):
            self._enqueue("ex", "rk", b"", pattern(self.journal.next_id, size), persistent)

    @precondition(lambda self: self._ready())
    @rule(pick=PICK)
    def acquire(self, pick: int) -> None:
        """Delivered to a consumer that will ack (ACQUIRE)."""
        m = self._pick(self._ready(), pick)
        self.journal.mark(rec.ACQUIRE, m.jid)
        m.delivered = True
        if m.acquired is None:
            m.acquired = self.taken

    @precondition(lambda self: self._delivered())
    @rule(pick=PICK)
    def requeue(self, pick: int) -> None:
        """Rejected or its channel closed: back in the queue, still live."""
        m = self._pick(self._delivered(), pick)
        self.journal.mark(rec.REQUEUE, m.jid)
        m.delivered = False

    def _settle(self, m: Message) -> None:
        self.journal.mark(rec.DEQUEUE, m.jid)
        m.dequeued = self.taken
        m.delivered = False

    @precondition(lambda self: self._live())
    @rule(pick=PICK)
    def ack(self, pick: int) -> None:
        """Acked, rejected, purged or delivered no-ack (DEQUEUE): gone for good."""
        self._settle(self._pick(self._live(), pick))

    @precondition(lambda self: self._live())
    @rule(count=st.integers(1, 16), stragglers=st.sets(st.integers(0, 15), max_size=2))
    def consume(self, count: int, stragglers: set[int]) -> None:
        """A consumer takes the oldest messages in order and acks them (ACQUIRE, then
        DEQUEUE), but for a few it holds unacked: old segments end up mostly dead, as
        in a deep queue drained while compaction runs (issue 20)."""
        for index, m in enumerate(sorted(self._live(), key=lambda m: m.jid)[:count]):
            if not m.delivered:
                self.journal.mark(rec.ACQUIRE, m.jid)
                m.delivered = True
                if m.acquired is None:
                    m.acquired = self.taken
            if index not in stragglers:
                self._settle(m)

    @precondition(lambda self: len(self._live()) > 1)
    @rule(keep=st.sets(PICK, min_size=1, max_size=2))
    def ack_most(self, keep: set[int]) -> None:
        """Settle all but a few: leaves mostly dead segments for compaction."""
        live = self._live()
        kept = {live[k % len(live)].jid for k in keep}
        for m in live:
            if m.jid not in kept:
                self._settle(m)

    # -- compaction ------------------------------------------------------------------------

    @rule(passes=st.integers(1, 2))
    def compact(self, passes: int) -> None:
        """Passes of the store's compaction (``DiskStore.compact``); two in a row are
        what a slow disk gives (the committer still busy when the next one comes)."""
        before = {jid: (w.segment, w.record_offset) for jid, w in self.journal.where.items()}
        for _ in range(passes):
            self.removed |= self.disk.compact() > 0
        for jid, w in self.journal.where.items():
            if before.get(jid) != (w.segment, w.record_offset):
                self.msgs[jid].moved = self.taken

    # -- the committer's round, step by step -------------------------------------------------

    @precondition(lambda self: self.inflight is None and self.journal.dirty)
    @rule()
    def take(self) -> None:
        """The round starts (event loop): what was appended so far is its to write."""
        self.inflight = self.journal.take()
        self.taken += 1

    @precondition(lambda self: self.inflight is not None and self.on_disk < self.taken)
    @rule()
    def write(self) -> None:
        """The worker thread writes and syncs the round."""
        assert self.inflight is not None
        QueueJournal.write(self.inflight)
        self.on_disk = self.taken

    @precondition(lambda self: self.inflight is not None and self.on_disk < self.taken)
    @rule(data=st.data())
    def write_fails(self, data: st.DataObject) -> None:
        """The write raises part way (a full or failing disk): the committer puts the
        round back ahead of what was appended since, for the next round to write
        again (``Committer._run``); its confirms are nacks."""
        assert self.inflight is not None
        whole = [
            (segment, offset, b"".join(parts)) for segment, offset, parts in self.inflight.writes
        ]
        done = data.draw(st.integers(0, sum(len(b) for _s, _o, b in whole) - 1), label="failed at")
        part = Pending()
        for segment, offset, blob in whole:
            if done > 0:
                part.writes.append((segment, offset, [blob[:done]]))
            done -= len(blob)
        if part.writes:
            QueueJournal.write(part)
        self.journal.put_back(self.inflight)
        self.inflight = None
        # its records now go with the round being appended to (some may be on disk)
        failed = self.taken - 1
        for m in self.msgs.values():
            for name in ("enqueued", "acquired", "dequeued", "moved"):
                if getattr(m, name) == failed:
                    setattr(m, name, self.taken)
        self.partial.add(self.taken)

    @precondition(lambda self: self.inflight is not None and self.on_disk == self.taken)
    @rule()
    def written(self) -> None:
        """Back on the loop: the round is durable (confirms go out)."""
        assert self.inflight is not None
        self.journal.written(self.inflight)
        self.inflight = None
        self.confirmed = self.taken

    @precondition(lambda self: self.inflight is None and self.journal.dirty)
    @rule()
    def commit(self) -> None:
        """A whole round with nothing in between (gets the machine to deep states sooner)."""
        self.take()
        self.write()
        self.written()

    # -- reads -----------------------------------------------------------------------------

    def _read(self, m: Message) -> None:
        # through the queue store, as ``Queue`` loads a paged message (a failed check
        # raises ``CorruptMessage`` there, after quarantining the record)
        body = bytes(self.queue.read_body(m.jid))  # a large one is a view
        if body != m.body:
            what = "zeros" if body and not body.strip(b"\0") else "other bytes"
            raise AssertionError(
                f"message {m.jid} read back as {what} {body[:24]!r}, enqueued as {m.body[:24]!r}"
            )

    # -- issue 20's window: compaction's copies not yet confirmed ---------------------------
    #
    # Reached by chance only now and then, so these rules (enabled only in the window)
    # weigh it: a read, the round's next step, a crash, while compaction's copies wait.

    @precondition(lambda self: self._moved_unconfirmed())
    @rule(pick=PICK)
    def read_moved(self, pick: int) -> None:
        """A message compaction copied, read before the copy's round finished."""
        self._read(self._pick(self._moved_unconfirmed(), pick))

    @precondition(lambda self: self._moved_unconfirmed())
    @rule()
    def step_moved(self) -> None:
        """The round holding the copies goes one step further (take, write or written)."""
        if self.inflight is None:
            if self.journal.dirty:
                self.take()
        elif self.on_disk < self.taken:
            self.write()
        else:
            self.written()

    @precondition(lambda self: self._moved_unconfirmed())
    @rule(torn=st.booleans(), data=st.data())
    def crash_moved(self, torn: bool, data: st.DataObject) -> None:
        """A crash while the copies are not confirmed (the old segment must still hold
        them, or the copies be whole on disk)."""
        self.crash(torn, data)

    @rule()
    def read_all(self) -> None:
        """Every live body loaded (paged-out messages delivered): exactly what was
        enqueued, never zeros, never an error."""
        for m in self._live():
            self._read(m)

    # -- crashes ---------------------------------------------------------------------------

    @precondition(lambda self: self.taken > 0 or self.removed)
    @rule(torn=st.booleans(), data=st.data())
    def crash(self, torn: bool, data: st.DataObject) -> None:
        """The process dies: appends not taken and a round not written are lost (with
        ``torn``, a round being written lands in part: a prefix of each segment's
        write, independently, maybe with a lost page in it); a new journal recovers
        the directory and the machine goes on with it."""
        torn_round: int | None = None
        if torn and self.inflight is not None and self.on_disk < self.taken:
            part = Pending()
            for segment, offset, parts in self.inflight.writes:
                blob = bytearray(b"".join(parts))
                cut = data.draw(st.integers(0, len(blob)), label=f"{segment.number:08d}.seg")
                if data.draw(st.booleans(), label="hole"):
                    # a power cut can lose a page while a later one of the round landed
                    start = data.draw(st.integers(0, cut), label="hole at")
                    size = data.draw(st.integers(1, 600), label="hole size")
                    blob[start : start + size] = bytes(len(blob[start : start + size]))
                if cut:
                    part.writes.append((segment, offset, [bytes(blob[:cut])]))
            if part.writes:
                QueueJournal.write(part)
            torn_round = self.taken - 1
        self.journal.close()
        journal = QueueJournal(self.dir, SEGMENT_SIZE, self.root / "quarantine")
        recovered = journal.recover()
        self._check_recovery(recovered, torn_round)
        self.crashes += 1
        back = {r.id: r for r in recovered}
        self.gone |= set(self.msgs) - set(back)
        self.msgs = {
            r.id: Message(
                r.id,
                r.exchange,
                r.routing_key,
                r.props,
                r.body,
                True,
                RECOVERED,
                redelivered=r.redelivered,
            )
            for r in recovered
        }
        self._start(journal)

    def _check_recovery(self, recovered: list[Recovered], torn: int | None) -> None:
        ids = [r.id for r in recovered]
        assert ids == sorted(set(ids)), f"recovery repeats or misorders ids: {ids}"

        def on_disk(generation: int) -> bool:
            return generation < self.on_disk

        def maybe_on_disk(generation: int) -> bool:
            return on_disk(generation) or generation == torn or generation in self.partial

        back = {r.id: r for r in recovered}
        for jid, r in back.items():
            m = self.msgs.get(jid)
            assert m is not None, f"message {jid} came back: " + (
                "it did not come back before" if jid in self.gone else "never enqueued"
            )
            assert m.persistent, f"transient message {jid} came back"
            assert maybe_on_disk(m.enqueued), f"message {jid} came back, never written"
            assert m.dequeued is None or not on_disk(m.dequeued), (
                f"message {jid} came back, its DEQUEUE on disk"
            )
            assert (r.exchange, r.routing_key, r.props, r.body) == (
                m.exchange,
                m.routing_key,
                m.props,
                m.body,
            ), f"message {jid} came back different"
            if m.redelivered or (m.acquired is not None and on_disk(m.acquired)):
                assert r.redelivered, f"message {jid} was delivered, not flagged redelivered"
            if r.redelivered:
                assert m.redelivered or m.acquired is not None, (
                    f"message {jid} flagged redelivered, never delivered"
                )
        for m in self.msgs.values():
            settled = m.dequeued is not None and maybe_on_disk(m.dequeued)
            if m.persistent and not settled and m.enqueued < self.confirmed:
                assert m.jid in back, f"confirmed message {m.jid} lost (crash {self.crashes})"

    # -- bookkeeping -------------------------------------------------------------------------

    @invariant()
    def bookkeeping(self) -> None:
        """The journal's counts agree with its messages: a live count that drifts low
        frees a segment that still holds live records; ``unwritten`` holds only
        bodies not yet on disk (else it grows without bound)."""
        journal = self.journal
        assert set(journal.where) == {m.jid for m in self._live()}
        counts = Counter(w.segment for w in journal.where.values())
        assert set(counts) <= set(journal.segments)
        for number, segment in journal.segments.items():
            assert segment.live == counts[number], f"segment {number} live count"
        for jid in journal.unwritten:
            assert jid in journal.where and not journal.is_durable(jid)
        assert not journal.corrupt and self.queue.corrupt == 0


JournalMachine.TestCase.settings = settings(
    max_examples=examples(200, fast=20),
    stateful_step_count=80,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestJournalMachine = JournalMachine.TestCase
