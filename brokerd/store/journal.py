"""One queue's journal: append-only segment files of fixed size (seed 002).

Records (``records.py``) are appended in memory by the event loop, which
also decides where each will land (segment and offset), and written and
made durable by the committer (``committer.py``) in a worker thread: it
takes everything appended so far (``take``), writes it with ``pwrite`` and
``fdatasync``s each touched segment, then the loop marks it written
(``written``). Reads of paged-out bodies (``read_body``) only touch records
already written.

Segments are preallocated to the segment size (zeros after the last
record, so a reader knows where the records end) and named
``NNNNNNNN.seg``. A record never spans two segments; a message larger than
a segment gets a segment of its own. A segment without live messages is
deleted; a mostly dead one has its live records written again at the head
of the journal and is then deleted (``compact``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from brokerd.store import records as rec

log = logging.getLogger("brokerd.store.journal")

SEGMENT_SIZE = 16 * 1024 * 1024
#: a segment with less than this share of live records is rewritten by compaction
COMPACT_BELOW = 0.25


@dataclass
class Segment:
    number: int
    path: Path
    capacity: int
    #: bytes assigned so far (written or pending)
    tail: int = 0
    #: bytes known to be on disk
    durable: int = 0
    #: enqueue records in it whose message is still live
    live: int = 0
    #: enqueue records ever put in it
    total: int = 0
    fd: int = -1
    allocated: bool = False

    def open(self) -> int:
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(slots=True)
class Where:
    """Where a live message's enqueue record is: for paging, live counts, compaction."""

    segment: int
    body_offset: int
    body_length: int
    persistent: bool
    #: the whole record (its framing included): compaction copies it as it is
    record_offset: int = 0
    record_length: int = 0


@dataclass(slots=True)
class Recovered:
    """A message rebuilt from the journal."""

    id: int
    exchange: str
    routing_key: str
    props: bytes
    body: bytes
    redelivered: bool


@dataclass
class Pending:
    """Writes taken for one commit: (segment, offset, parts) in order."""

    writes: list[tuple[Segment, int, list[bytes]]] = field(default_factory=list)
    #: each segment's tail once these writes are done
    tails: dict[int, int] = field(default_factory=dict)
    #: the segment and end offset of the last write (appends to it extend it)
    last: Segment | None = None
    end: int = -1

    def __bool__(self) -> bool:
        return bool(self.writes)


class QueueJournal:
    """The journal of one queue (one directory of segments)."""

    def __init__(self, directory: Path, segment_size: int = SEGMENT_SIZE) -> None:
        self.dir = directory
        self.segment_size = segment_size
        self.segments: dict[int, Segment] = {}
        self.current: Segment | None = None
        self.next_id = 1
        self.where: dict[int, Where] = {}
        #: live messages delivered and not settled (recovery flags them redelivered)
        self.acquired: set[int] = set()
        self._pending = Pending()
        self.closed = False

    # -- appending (event loop) -----------------------------------------------------

    def _segment_for(self, size: int) -> tuple[Segment, int]:
        current = self.current
        if current is None or (current.tail and current.tail + size > current.capacity):
            number = max(self.segments, default=0) + 1
            current = Segment(
                number,
                self.dir / f"{number:08d}.seg",
                max(self.segment_size, size),
            )
            self.segments[number] = current
            self.current = current
            current.open()  # here, on the loop: the committer's thread only uses the fd
        offset = current.tail
        current.tail += size
        return current, offset

    def _queue_write(self, segment: Segment, offset: int, parts: list[bytes]) -> None:
        pending = self._pending
        if pending.last is segment and pending.end == offset:
            pending.writes[-1][2].extend(parts)  # contiguous: one pwrite for the run
        else:
            pending.writes.append((segment, offset, parts))
            pending.last = segment
        pending.end = segment.tail
        pending.tails[segment.number] = segment.tail

    def enqueue(
        self,
        exchange: str,
        routing_key: str,
        props: bytes,
        body: bytes,
        *,
        persistent: bool,
        redelivered: bool = False,
        id: int | None = None,
    ) -> int:
        """Append an ENQUEUE record; returns the message's journal id."""
        jid = id if id is not None else self.next_id
        self.next_id = max(self.next_id, jid + 1)
        flags = (rec.PERSISTENT if persistent else 0) | (rec.REDELIVERED if redelivered else 0)
        head, body = rec.enqueue_parts(jid, flags, exchange, routing_key, props, body)
        segment, offset = self._segment_for(len(head) + len(body))
        self._queue_write(segment, offset, [head, body])
        previous = self.where.get(jid)
        if previous is not None:  # written again by compaction: the old copy is dead
            self.segments[previous.segment].live -= 1
        self.where[jid] = Where(
            segment.number,
            offset + len(head),
            len(body),
            persistent,
            offset,
            len(head) + len(body),
        )
        segment.live += 1
        segment.total += 1
        return jid

    def mark(self, kind: int, jid: int) -> None:
        """Append an ACQUIRE, DEQUEUE or REQUEUE record for a live message."""
        data = rec.ref(kind, jid)
        segment, offset = self._segment_for(len(data))
        self._queue_write(segment, offset, [data])
        if kind == rec.DEQUEUE:
            self.acquired.discard(jid)
            where = self.where.pop(jid, None)
            if where is not None:
                self.segments[where.segment].live -= 1
        elif kind == rec.ACQUIRE:
            self.acquired.add(jid)

    @property
    def dirty(self) -> bool:
        return bool(self._pending)

    # -- committing (the committer) ------------------------------------------------------

    def take(self) -> Pending:
        """Everything appended since the last take, for one commit (event loop)."""
        pending, self._pending = self._pending, Pending()
        return pending

    @staticmethod
    def write(pending: Pending) -> None:
        """Write and sync one commit's records (worker thread)."""
        touched: dict[int, Segment] = {}
        for segment, offset, parts in pending.writes:
            fd = segment.open()
            if not segment.allocated:
                # preallocated: fdatasync need not update the size (and a filesystem
                # without fallocate just lets the file grow)
                with contextlib.suppress(OSError):
                    os.posix_fallocate(fd, 0, segment.capacity)
                segment.allocated = True
            data = b"".join(parts) if len(parts) > 1 else parts[0]
            view = memoryview(data)
            while view:
                written = os.pwrite(fd, view, offset)
                view = view[written:]
                offset += written
            touched[segment.number] = segment
        for segment in touched.values():
            os.fdatasync(segment.fd)

    def written(self, pending: Pending) -> None:
        """A commit is durable (event loop): its bytes may be read back."""
        for number, tail in pending.tails.items():
            segment = self.segments.get(number)
            if segment is not None:
                segment.durable = max(segment.durable, tail)

    def is_durable(self, jid: int) -> bool:
        where = self.where.get(jid)
        if where is None:
            return False
        segment = self.segments[where.segment]
        return where.body_offset + where.body_length <= segment.durable

    # -- reading ----------------------------------------------------------------------------

    def read_body(self, jid: int) -> bytes:
        """A live message's body, from disk (it must be durable)."""
        where = self.where[jid]
        fd = self.segments[where.segment].open()
        data = os.pread(fd, where.body_length, where.body_offset)
        if len(data) != where.body_length:
            raise rec.JournalError(f"short read of message {jid} in {self.dir}")
        return data

    # -- recovery -------------------------------------------------------------------------

    def recover(self) -> list[Recovered]:
        """Rebuild the queue from its segments: live persistent messages in journal-id
        order (transient ones were only paged out: dropped), redelivered if they had
        been delivered. A torn or corrupt record ends its segment's reading, with a
        log line; appends continue in a new segment."""
        self.dir.mkdir(parents=True, exist_ok=True)
        found: dict[int, tuple[rec.Raw, int]] = {}
        acquired: set[int] = set()
        highest = 0
        numbers = sorted(
            int(p.stem) for p in self.dir.glob("*.seg") if p.stem.isascii() and p.stem.isdigit()
        )
        for number in numbers:
            path = self.dir / f"{number:08d}.seg"
            data = path.read_bytes()
            records, end, problem = rec.scan_fast(data)
            del data  # the records keep only their strings and blobs
            if problem is not None:
                log.warning(
                    "journal %s segment %d: %s; %d records before it kept",
                    self.dir.name,
                    number,
                    problem,
                    len(records),
                )
            segment = Segment(number, path, max(end, self.segment_size), end, end)
            segment.allocated = True
            self.segments[number] = segment
            enqueued = 0
            for r in records:
                kind, jid = r[0], r[1]
                if jid > highest:
                    highest = jid
                if kind == rec.ENQUEUE:
                    found[jid] = (r, number)
                    enqueued += 1
                elif kind == rec.DEQUEUE:
                    found.pop(jid, None)
                    acquired.discard(jid)
                elif kind == rec.ACQUIRE:
                    acquired.add(jid)
            segment.total = enqueued
        out = []
        where = self.where
        segments = self.segments
        for jid in sorted(found):
            r, number = found[jid]
            _k, _id, offset, length, flags, exchange, routing_key, props, body, body_offset = r
            if not flags & rec.PERSISTENT:
                continue
            where[jid] = Where(number, body_offset, len(body), True, offset, length)
            segments[number].live += 1
            redelivered = bool(flags & rec.REDELIVERED) or jid in acquired
            if jid in acquired:
                self.acquired.add(jid)
            out.append(Recovered(jid, exchange, routing_key, props, body, redelivered))
        self.next_id = max(self.next_id, highest + 1)
        self.current = None  # appends start a segment of their own
        return out

    # -- compaction and removal -------------------------------------------------------------------

    def oldest(self) -> Segment | None:
        """The oldest segment, unless it is the one being written or not yet on disk.

        Segments go oldest first only: a segment's DEQUEUE records may settle
        messages enqueued in older ones, so deleting it while those remain would
        bring settled messages back on recovery."""
        if not self.segments:
            return None
        segment = self.segments[min(self.segments)]
        if segment is self.current or segment.durable < segment.tail:
            return None
        return segment

    def sparse(self, segment: Segment) -> bool:
        """Mostly dead: worth copying its live records to the head to free it."""
        return segment.total > 0 and segment.live / segment.total < COMPACT_BELOW

    def copy_live(self, segment: Segment) -> int:
        """Append the segment's live enqueue records again (same ids; those delivered
        and unsettled flagged redelivered, their ACQUIRE being in the old segment);
        the segment is dead once they are on disk. Returns how many."""
        moved = 0
        fd = segment.open()
        for jid, where in list(self.where.items()):
            if where.segment != segment.number:
                continue
            raw = os.pread(fd, where.record_length, where.record_offset)
            records, _end, problem = rec.scan(raw)
            if problem is not None or len(records) != 1:
                raise rec.JournalError(f"message {jid} unreadable in {segment.path}: {problem}")
            record = records[0]
            assert isinstance(record, rec.Enqueue)
            self.enqueue(
                record.exchange,
                record.routing_key,
                record.props,
                record.body,
                persistent=record.persistent,
                redelivered=bool(record.flags & rec.REDELIVERED) or jid in self.acquired,
                id=jid,
            )
            moved += 1
        return moved

    def remove(self, segment: Segment) -> None:
        segment.close()
        self.segments.pop(segment.number, None)
        with contextlib.suppress(FileNotFoundError):
            segment.path.unlink()

    def close(self) -> None:
        self.closed = True
        for segment in self.segments.values():
            segment.close()

    def destroy(self) -> None:
        """The queue is gone: delete every segment and the directory."""
        self.close()
        for segment in list(self.segments.values()):
            self.remove(segment)
        for path in self.dir.glob("*"):
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.dir.rmdir()
