"""One queue's journal: append-only segment files of fixed size (seed 002).

Records (``records.py``) are appended in memory by the event loop, which
also decides where each will land (segment and offset), and written and
made durable by the committer (``committer.py``) in a worker thread: it
takes everything appended so far (``take``), writes it with ``pwrite`` and
``fdatasync``s each touched segment, then the loop marks it written
(``written``). A body is read back (``read_body``) from memory while its
record is not yet on disk (``unwritten``), and from disk only once it is,
checked against the record's CRC: a preallocated segment reads as zeros
where the committer has not written yet, so a read that ran ahead of the
committer would hand out zeros of the right length (issue 20).

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

_RECORD_START = rec.RECORD_START
_crc32 = rec.crc32
HEADER_SIZE = rec.HEADER.size
#: bodies read back from records longer than this are returned as views, not copies
LARGE = 64 * 1024

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
    #: where the journal's appends stood (segment, tail) when its last live message
    #: went (a DEQUEUE, or compaction's copy): it may be deleted once that is on
    #: disk; None: settled by records already on disk (recovery)
    settled_at: tuple[int, int] | None = None

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
    #: None: left on disk (past the memory budget; the queue holds a paged stand-in)
    body: bytes | None
    redelivered: bool
    length: int = 0


class CorruptRecord(rec.JournalError):
    """A live message's record on disk is not what was written (its CRC, framing or id
    does not match): its body must not be delivered."""

    def __init__(self, jid: int, segment: int, offset: int, reason: str, raw: bytes) -> None:
        super().__init__(f"message {jid}: record at {segment:08d}.seg+{offset} {reason}")
        self.jid = jid
        self.segment = segment
        self.offset = offset
        self.reason = reason
        #: the bytes found there, kept for recovery tooling (``quarantine``)
        self.raw = raw


@dataclass
class Pending:
    """Writes taken for one commit: (segment, offset, parts) in order."""

    writes: list[tuple[Segment, int, list[bytes]]] = field(default_factory=list)
    #: journal ids of the enqueue records among them (their bodies are ``unwritten``)
    jids: list[int] = field(default_factory=list)
    #: each segment's tail once these writes are done
    tails: dict[int, int] = field(default_factory=dict)
    #: the segment and end offset of the last write (appends to it extend it)
    last: Segment | None = None
    end: int = -1

    def __bool__(self) -> bool:
        return bool(self.writes)


class QueueJournal:
    """The journal of one queue (one directory of segments)."""

    def __init__(
        self,
        directory: Path,
        segment_size: int = SEGMENT_SIZE,
        quarantine_dir: Path | None = None,
    ) -> None:
        self.dir = directory
        self.segment_size = segment_size
        #: where records that fail their check are copied for recovery tooling
        self.quarantine_dir = quarantine_dir or directory.parent.parent / "quarantine"
        self.segments: dict[int, Segment] = {}
        self.current: Segment | None = None
        self.next_id = 1
        self.where: dict[int, Where] = {}
        #: live messages delivered and not settled (recovery flags them redelivered)
        self.acquired: set[int] = set()
        #: jid -> body of live enqueue records whose bytes are not yet known to be on
        #: disk at ``where[jid]`` (appended, or in a commit that has not finished or
        #: failed): reads are served from here
        self.unwritten: dict[int, bytes] = {}
        #: jid -> why, for live messages whose record was found corrupt (quarantined)
        self.corrupt: dict[int, str] = {}
        #: records recovery found damaged in place and skipped (set aside)
        self.damaged: list[CorruptRecord] = []
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
        self._pending.jids.append(jid)
        self.unwritten[jid] = body
        previous = self.where.get(jid)
        if previous is not None:  # written again by compaction: the old copy is dead
            self._unlive(previous.segment)
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
            self.unwritten.pop(jid, None)
            where = self.where.pop(jid, None)
            if where is not None:
                self._unlive(where.segment)
        elif kind == rec.ACQUIRE:
            self.acquired.add(jid)

    def _unlive(self, number: int) -> None:
        """One live message fewer in segment ``number``; at none, note where the
        records that settled it end (``settled_at``)."""
        segment = self.segments[number]
        segment.live -= 1
        if segment.live <= 0 and self.current is not None:
            segment.settled_at = (self.current.number, self.current.tail)

    @property
    def dirty(self) -> bool:
        return bool(self._pending)

    # -- committing (the committer) ------------------------------------------------------

    def take(self) -> Pending:
        """Everything appended since the last take, for one commit (event loop)."""
        pending, self._pending = self._pending, Pending()
        return pending

    def put_back(self, pending: Pending) -> None:
        """A commit failed: its writes go ahead of what was appended since, for the
        next round (pwrite at fixed offsets: writing again is harmless)."""
        later = self._pending
        pending.writes += later.writes
        pending.jids += later.jids
        pending.tails.update(later.tails)
        if later.writes:
            pending.last, pending.end = later.last, later.end
        self._pending = pending

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
        unwritten = self.unwritten
        if unwritten:
            for jid in pending.jids:
                # only if the record on disk is the latest one: compaction may have
                # appended the message again since this commit was taken
                if jid in unwritten and self.is_durable(jid):
                    del unwritten[jid]

    def is_durable(self, jid: int) -> bool:
        where = self.where.get(jid)
        if where is None:
            return False
        segment = self.segments[where.segment]
        return where.body_offset + where.body_length <= segment.durable

    # -- reading ----------------------------------------------------------------------------

    def read_body(self, jid: int) -> bytes:
        """A live message's body: from memory while its record is not on disk, else
        from disk, its whole record checked (length, CRC, type and id) first.

        Raises ``CorruptRecord`` when the check fails (or the message was found
        corrupt before), never returning bytes that are not the message's."""
        body = self.unwritten.get(jid)
        if body is not None:
            return body
        reason = self.corrupt.get(jid)
        where = self.where.get(jid)
        if reason is not None or where is None:
            raise CorruptRecord(jid, 0, 0, reason or "is not in the journal", b"")
        segment = self.segments[where.segment]
        if where.record_offset + where.record_length > segment.durable:
            # cannot happen while ``unwritten`` holds every such body; a read past
            # the committer would be zeros, so it is refused rather than trusted
            raise CorruptRecord(jid, where.segment, where.record_offset, "is not on disk yet", b"")
        length = where.record_length
        data = os.pread(segment.open(), length, where.record_offset)
        if len(data) == length and length >= _RECORD_START.size:  # the fast path: intact
            size, crc, kind, found = _RECORD_START.unpack_from(data)
            if (
                size == length - HEADER_SIZE
                and kind == rec.ENQUEUE
                and found == jid
                and _crc32(memoryview(data)[HEADER_SIZE:]) == crc
            ):
                skip = where.body_offset - where.record_offset
                # a large body is not copied again (deliveries send it as views)
                return memoryview(data)[skip:] if length > LARGE else data[skip:]
        problem = rec.check_enqueue(data, jid, length) or "fails its check"
        raise CorruptRecord(jid, where.segment, where.record_offset, problem, data)

    def quarantine(self, error: CorruptRecord) -> Path | None:
        """Set a corrupt message aside: its bytes go to the quarantine directory for
        recovery tooling, and it stops being live (a DEQUEUE record, so neither a
        restart nor compaction trips over it again). Returns the copy's path."""
        jid = error.jid
        if jid in self.corrupt:
            return None
        self.corrupt[jid] = error.reason
        path = self._keep(error, str(jid)) if error.raw else None
        if jid in self.where:
            self.mark(rec.DEQUEUE, jid)
        return path

    def _keep(self, error: CorruptRecord, tag: str) -> Path | None:
        """Copy a damaged record's bytes to the quarantine directory, for recovery
        tooling (``<journal>-<segment>-<offset>-<tag>.rec``)."""
        path = self.quarantine_dir / f"{self.dir.name}-{error.segment:08d}-{error.offset}-{tag}.rec"
        try:
            self.quarantine_dir.mkdir(parents=True, exist_ok=True)
            path.write_bytes(error.raw)
        except OSError as exc:
            log.error("cannot keep damaged record %s: %s", path, exc)
            return None
        return path

    # -- recovery -------------------------------------------------------------------------

    def recover(self, body_budget: int | None = None) -> list[Recovered]:
        """Rebuild the queue from its segments: live persistent messages in journal-id
        order (transient ones were only paged out: dropped), redelivered if they had
        been delivered. Bodies are read back (checked) in order until they add up to
        ``body_budget`` bytes (None: all); the others stay on disk (``body`` None), so
        a deep queue's recovery holds what the queue would, not everything.
        A torn record (the last one written, cut by a crash) ends its
        segment's reading, with a log line; a record damaged in place (an intact one
        follows it) is set aside (``quarantine_dir``, listed in ``damaged``) and
        reading goes on past it. Appends continue in a new segment."""
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
            while problem is not None and (following := rec.damaged_end(data, end)) is not None:
                self._set_aside(number, end, data[end:following], problem)
                more, end, problem = rec.scan_fast(data, following)
                records += more
            del data  # the records keep only their strings
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
            _k, _id, offset, length, flags, exchange, routing_key, props, body_offset = r
            if not flags & rec.PERSISTENT:
                continue
            size = offset + length - body_offset
            where[jid] = Where(number, body_offset, size, True, offset, length)
            segments[number].live += 1
            redelivered = bool(flags & rec.REDELIVERED) or jid in acquired
            if jid in acquired:
                self.acquired.add(jid)
            out.append(Recovered(jid, exchange, routing_key, props, None, redelivered, size))
        self.next_id = max(self.next_id, highest + 1)
        self.current = None  # appends start a segment of their own
        return self._read_bodies(out, body_budget)

    def _read_bodies(self, out: list[Recovered], budget: int | None) -> list[Recovered]:
        """Read the first bodies back, checked, until ``budget`` bytes; a record that
        fails its check now is quarantined and its message dropped."""
        kept = 0
        lost: set[int] = set()
        for r in out:
            if budget is not None and kept + r.length > budget:
                break
            try:
                r.body = self.read_body(r.id)
            except CorruptRecord as error:
                self.quarantine(error)
                self.damaged.append(error)
                lost.add(r.id)
                continue
            kept += r.length
        return [r for r in out if r.id not in lost] if lost else out

    def _set_aside(self, number: int, offset: int, raw: bytes, problem: str) -> None:
        """A record damaged in place, met by recovery: kept for recovery tooling."""
        error = CorruptRecord(rec.record_id(raw) or 0, number, offset, problem, raw)
        self._keep(error, "recovery")
        self.damaged.append(error)

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

    def removable(self, segment: Segment) -> bool:
        """No live message left in it, and the records that settled its last ones
        (DEQUEUEs, or compaction's copies) are on disk: deleting it before would let
        a crash lose them (a copy), or a message that was about to be dead-lettered
        elsewhere (a DEQUEUE whose journal had not yet synced its new home)."""
        if segment.live > 0:
            return False
        if segment.settled_at is None:
            return True
        number, tail = segment.settled_at
        holder = self.segments.get(number)
        return holder is None or holder.durable >= tail

    def sparse(self, segment: Segment) -> bool:
        """Mostly dead: worth copying its live records to the head to free it."""
        return segment.total > 0 and segment.live / segment.total < COMPACT_BELOW

    def copy_live(self, segment: Segment) -> tuple[int, list[CorruptRecord]]:
        """Append the segment's live enqueue records again (same ids; those delivered
        and unsettled flagged redelivered, their ACQUIRE being in the old segment).
        The old place stays readable, and the segment is deleted only once the
        copies are on disk (``removable``); reads go to the new place, served from
        ``unwritten`` until the copy is written. A record that fails its check is
        not copied: it is returned, for the store to quarantine. Returns how many
        were copied, and the corrupt ones."""
        moved = 0
        corrupt: list[CorruptRecord] = []
        fd = segment.open()
        for jid, where in list(self.where.items()):
            if where.segment != segment.number:
                continue
            raw = os.pread(fd, where.record_length, where.record_offset)
            problem = rec.check_enqueue(raw, jid, where.record_length)
            records = [] if problem else rec.scan(raw)[0]
            record = records[0] if len(records) == 1 else None
            if not isinstance(record, rec.Enqueue):
                reason = problem or "is unreadable"
                corrupt.append(CorruptRecord(jid, segment.number, where.record_offset, reason, raw))
                continue
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
        return moved, corrupt

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
