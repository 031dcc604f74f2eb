"""What the workers of one host count together: client connections and failed logins.

A host of ``brokerd --workers N`` is one broker to its operators, so its limits
are the host's: ``max_connections`` (the node's, and each vhost's) counts every
worker's connections, and a password guesser meets one login throttle however
the kernel spreads its attempts over the workers. Each worker maps one file,
``DATA_DIR/host/shared``, and takes its ``flock`` around each check-and-count,
so two workers cannot both take the last connection a limit allows.

The file holds, after a small header:

- one *connection slot* per worker: its connection count, and its counts for
  the vhosts that limit their connections (``VHOST_SLOTS`` of them, keyed by a
  64-bit hash of the name). A worker writes only its own slot and reads all of them.
  A worker clears its slot when it starts, and the parent clears the slot of a
  worker that died (``clear_worker``), so a dead worker's connections are not
  counted while it restarts. A worker with connections to more limited vhosts
  than its slot holds counts the rest for itself alone (the log says so once).
- the *login throttle*: ``THROTTLE_SLOTS`` entries of (key hash, failures, not
  before, last failure) in an open-addressed table; ``SharedLoginThrottle`` is
  ``LoginThrottle``'s arithmetic over it. When a probe window is full, the
  entry that failed longest ago gives way, as the in-memory throttle drops its
  oldest entry: memory stays fixed whatever a guesser sends.

Monotonic clocks are one clock across the processes of a Linux host, so the
times in the table mean the same thing to every worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from brokerd.model.throttle import LoginThrottle

log = logging.getLogger("brokerd.server.hostshare")

MAGIC = b"RKHOST01"
_HEADER = struct.Struct("<8sII")  # magic, workers, reserved
#: vhosts a worker's slot counts connections of
VHOST_SLOTS = 64
_VHOST = struct.Struct("<Qq")  # name hash (0: free), connections
_TOTAL = struct.Struct("<q")
WORKER_SLOT = _TOTAL.size + VHOST_SLOTS * _VHOST.size
#: entries of the shared login throttle, and how far a key's probe runs
THROTTLE_SLOTS = 4096
PROBE = 16
_ENTRY = struct.Struct("<QIIdd")  # key hash (0: free), failures, reserved, not before, last


def file_size(workers: int) -> int:
    return _HEADER.size + workers * WORKER_SLOT + THROTTLE_SLOTS * _ENTRY.size


def key_hash(*parts: str) -> int:
    """A 64-bit hash of a name or key; never 0 (0 marks a free entry)."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


class HostShare:
    """One worker's view of the host's shared file (``index`` is its slot)."""

    def __init__(self, path: Path, workers: int, index: int) -> None:
        if not 0 <= index < workers:
            raise ValueError(f"worker {index} is not one of {workers}")
        self.path = path
        self.workers = workers
        self.index = index
        size = file_size(workers)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            with _locked(fd):
                if os.fstat(fd).st_size != size or os.pread(fd, 8, 0) != MAGIC:
                    os.ftruncate(fd, 0)  # another layout (another worker count): start afresh
                    os.ftruncate(fd, size)
                    os.pwrite(fd, _HEADER.pack(MAGIC, workers, 0), 0)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._warned = False
        with self.locked():
            self._clear(index)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The whole file, for one check-and-count (held for microseconds)."""
        with _locked(self._fd):
            yield

    # -- connections ------------------------------------------------------------------

    def _slot(self, worker: int) -> int:
        return _HEADER.size + worker * WORKER_SLOT

    def _clear(self, worker: int) -> None:
        start = self._slot(worker)
        self._map[start : start + WORKER_SLOT] = bytes(WORKER_SLOT)

    def connections(self, vhost: str | None = None) -> int:
        """Every worker's connections (to ``vhost``, if named). Call under ``locked``."""
        wanted = None if vhost is None else key_hash(vhost)
        total = 0
        for worker in range(self.workers):
            start = self._slot(worker)
            if wanted is None:
                total += _TOTAL.unpack_from(self._map, start)[0]
                continue
            for i in range(VHOST_SLOTS):
                name, count = _VHOST.unpack_from(self._map, start + _TOTAL.size + i * _VHOST.size)
                if name == wanted:
                    total += count
                    break
        return total

    def publish(self, total: int, vhosts: dict[str, int]) -> None:
        """This worker's counts, as its broker holds them now. Call under ``locked``."""
        start = self._slot(self.index)
        slot = bytearray(WORKER_SLOT)
        _TOTAL.pack_into(slot, 0, total)
        for i, (vhost, count) in enumerate(vhosts.items()):
            if i == VHOST_SLOTS:
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "connections to more than %d vhosts on this worker: the rest count "
                        "against their vhost limits on this worker alone",
                        VHOST_SLOTS,
                    )
                break
            _VHOST.pack_into(slot, _TOTAL.size + i * _VHOST.size, key_hash(vhost), count)
        self._map[start : start + WORKER_SLOT] = slot

    # -- the login throttle's table -----------------------------------------------------

    def _entry(self, i: int) -> int:
        return _HEADER.size + self.workers * WORKER_SLOT + i * _ENTRY.size

    def find(self, key: int) -> tuple[int, tuple[int, int, float, float] | None]:
        """The entry of ``key`` (its index and (failures, _, not before, last)), or the
        index where it would go and None. Call under ``locked``."""
        home = key % THROTTLE_SLOTS
        free = oldest = -1
        oldest_at = float("inf")
        for step in range(PROBE):
            i = (home + step) % THROTTLE_SLOTS
            found, failures, _, not_before, last = _ENTRY.unpack_from(self._map, self._entry(i))
            if found == key:
                return i, (failures, 0, not_before, last)
            if found == 0:
                if free < 0:
                    free = i
            elif last < oldest_at:
                oldest, oldest_at = i, last
        return (free if free >= 0 else oldest), None

    def store(self, i: int, key: int, failures: int, not_before: float, last: float) -> None:
        _ENTRY.pack_into(self._map, self._entry(i), key, failures, 0, not_before, last)

    def drop(self, i: int) -> None:
        _ENTRY.pack_into(self._map, self._entry(i), 0, 0, 0, 0.0, 0.0)

    def throttled(self) -> int:
        """Keys the table holds. Call under ``locked``."""
        return sum(
            1 for i in range(THROTTLE_SLOTS) if _ENTRY.unpack_from(self._map, self._entry(i))[0]
        )


def clear_worker(path: Path, workers: int, index: int) -> None:
    """Forget a dead worker's connections (the parent, when it reaped it)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return
    try:
        with _locked(fd):
            if os.fstat(fd).st_size == file_size(workers) and os.pread(fd, 8, 0) == MAGIC:
                os.pwrite(fd, bytes(WORKER_SLOT), _HEADER.size + index * WORKER_SLOT)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


class SharedLoginThrottle(LoginThrottle):
    """``LoginThrottle`` over the host's table: the same delays, one set of failures
    for every worker of the host."""

    def __init__(self, share: HostShare, **kwargs: float) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.share = share

    def __len__(self) -> int:
        with self.share.locked():
            return self.share.throttled()

    def _live_entry(self, key: tuple[str, str], now: float) -> tuple[int, int, float, float, bool]:
        """(index, failures, not before, last failure, found) of a key, forgetting a
        key quiet past ``forget_after``."""
        hashed = key_hash(*key)
        i, entry = self.share.find(hashed)
        if entry is None:
            return i, 0, now, now, False
        failures, _, not_before, last = entry
        if now - last > self.forget_after:
            self.share.drop(i)
            return i, 0, now, now, False
        return i, failures, not_before, last, True

    def reserve(self, key: tuple[str, str], now: float) -> float:
        with self.share.locked():
            i, failures, not_before, last, found = self._live_entry(key, now)
            if not found:
                return 0.0
            start = max(not_before, now)
            self.share.store(i, key_hash(*key), failures, start + self.delay(failures), last)
            return start - now

    def failed(self, key: tuple[str, str], now: float) -> float:
        with self.share.locked():
            i, failures, not_before, _last, _found = self._live_entry(key, now)
            failures += 1
            delay = self.delay(failures)
            self.share.store(i, key_hash(*key), failures, max(not_before, now + delay), now)
            return delay

    def succeeded(self, key: tuple[str, str]) -> None:
        with self.share.locked():
            i, entry = self.share.find(key_hash(*key))
            if entry is not None:
                self.share.drop(i)
