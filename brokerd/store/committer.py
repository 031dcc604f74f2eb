"""Group commit: one write-and-sync round covers everything appended meanwhile.

Journals append records in memory on the event loop and ``register`` with
the committer, optionally with a callback (a publisher's confirm). One round
runs at a time in a worker thread: it takes what every dirty journal has
gathered, writes it and ``fdatasync``s each touched segment, then, back on the
loop, marks it written and calls the callbacks. Everything registered while
a round runs waits for the next one, so one sync covers every message that
arrived while the previous sync ran (seed 002's journals; RabbitMQ's group
commit), however many publishers there are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from brokerd.store.journal import Pending, QueueJournal

log = logging.getLogger("brokerd.store.committer")

#: seconds before records whose write failed are written again
RETRY_AFTER = 1.0

#: called once a commit is on disk (True) or failed (False); a publisher confirm's
#: (accepted, routed) callback fits
Done = Callable[[bool, int], None]


class Committer:
    """Runs the commit rounds for every journal of one store."""

    def __init__(self) -> None:
        self._dirty: dict[QueueJournal, list[Done]] = {}
        self._task: asyncio.Task[None] | None = None
        # one thread: rounds never overlap, and fsyncs of one round go in order
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="brokerd-commit")
        self.rounds = 0
        self.synced_bytes = 0
        self.last_round_ms = 0.0
        self.failures = 0

    def register(self, journal: QueueJournal, done: Done | None = None) -> None:
        """The journal has records to commit; ``done`` waits for them."""
        waiting = self._dirty.get(journal)
        if waiting is None:
            waiting = self._dirty[journal] = []
        if done is not None:
            waiting.append(done)
        if self._task is None:
            try:
                self._task = asyncio.get_running_loop().create_task(self._run())
            except RuntimeError:  # no loop (unit tests): commit right here
                self.commit_now()

    def forget(self, journal: QueueJournal) -> None:
        """The journal is going away: nothing more to commit for it."""
        for done in self._dirty.pop(journal, ()):
            done(False, 0)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._dirty:
                batch = self._take()
                started = time.monotonic()
                try:
                    await loop.run_in_executor(self._executor, _write_all, batch)
                except OSError as exc:
                    self.failures += 1
                    log.error(
                        "journal write failed: %s; %d journals affected; their publishers are "
                        "nacked and the records written again in %.0fs",
                        exc,
                        len(batch),
                        RETRY_AFTER,
                    )
                    _finish(batch, ok=False)
                    for journal, pending, _waiting in batch:
                        # what did not reach the disk stays unwritten (reads come from
                        # memory) and is written again: a later round must not mark
                        # the segment durable past a hole
                        if not journal.closed:
                            journal.put_back(pending)
                            self._dirty.setdefault(journal, [])
                    await asyncio.sleep(RETRY_AFTER)
                else:
                    self._done(batch, started)
        finally:
            self._task = None

    def _take(self) -> list[tuple[QueueJournal, Pending, list[Done]]]:
        dirty, self._dirty = self._dirty, {}
        return [(journal, journal.take(), waiting) for journal, waiting in dirty.items()]

    def _done(self, batch: list[tuple[QueueJournal, Pending, list[Done]]], started: float) -> None:
        self.rounds += 1
        self.last_round_ms = (time.monotonic() - started) * 1000
        for journal, pending, _waiting in batch:
            journal.written(pending)
            self.synced_bytes += sum(len(p) for _s, _o, parts in pending.writes for p in parts)
        _finish(batch, ok=True)

    def commit_now(self) -> None:
        """Commit everything synchronously (tests, shutdown)."""
        while self._dirty:
            batch = self._take()
            started = time.monotonic()
            _write_all(batch)
            self._done(batch, started)

    async def drain(self, attempts: int = 3) -> None:
        """Wait until nothing is left to commit (a clean shutdown); a disk that keeps
        failing is given up on after ``attempts`` failed rounds."""
        failures = self.failures
        while self._task is not None or self._dirty:
            if self.failures - failures >= attempts:
                log.error("journal writes keep failing: shutting down with records unwritten")
                return
            if self._task is None:
                self.register(next(iter(self._dirty)))
            task = self._task
            if task is not None:
                await asyncio.wait({task}, timeout=RETRY_AFTER * 2)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def _write_all(batch: list[tuple[QueueJournal, Pending, list[Done]]]) -> None:
    for journal, pending, _waiting in batch:
        if pending and not journal.closed:
            QueueJournal.write(pending)


def _finish(batch: list[tuple[QueueJournal, Pending, list[Done]]], ok: bool) -> None:
    for _journal, _pending, waiting in batch:
        for done in waiting:
            done(ok, 1 if ok else 0)
