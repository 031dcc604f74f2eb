"""The disk store: the model's ``MessageStore`` over SQLite wiring and per-queue journals.

Layout under ``DATA_DIR/store``:

    wiring.sqlite3           durable exchanges, queues, bindings; settings
    queues/<key>/NNN.seg     the journal of each durable queue
    paging/<n>/NNN.seg       journals of non-durable queues that paged out
                             (wiped at every start: transient messages do not
                             survive a restart)
    quarantine/*.rec         records that failed their check when read back,
                             kept as found for recovery tooling

At start, ``recover`` rebuilds the durable wiring and every durable queue's
messages into the model (before the broker listens). A background task
compacts journals (``compact``); ``close`` commits what is pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brokerd.model.exchange import Exchange
from brokerd.model.message import Message
from brokerd.model.queue import PAGE_LIMIT, Queue
from brokerd.model.storage import Paged
from brokerd.store.committer import Committer
from brokerd.store.journal import SEGMENT_SIZE, CorruptRecord, QueueJournal
from brokerd.store.queues import JournalQueueStore
from brokerd.store.wiring import StoredBinding, StoredExchange, StoredQueue, WiringStore

if TYPE_CHECKING:
    from brokerd.model.broker import Broker
    from brokerd.model.muxers import Binding

log = logging.getLogger("brokerd.store")

#: seconds between compaction passes
COMPACT_EVERY = 5.0
#: segments a compaction pass frees at most (it stays a short stall on the loop)
COMPACT_PER_PASS = 8


def queue_key(vhost: str, name: str) -> str:
    """A queue's journal directory name: stable, filesystem-safe, whatever the name."""
    return hashlib.sha256(f"{vhost}\0{name}".encode()).hexdigest()[:32]


class DiskStore:
    """Durable wiring and queue journals of one broker."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_size: int = SEGMENT_SIZE,
        page_limit: int = PAGE_LIMIT,
        compact_every: float = COMPACT_EVERY,
    ) -> None:
        self.dir = directory
        self.segment_size = segment_size
        self.compact_every = compact_every
        self.page_limit = page_limit
        directory.mkdir(parents=True, exist_ok=True)
        self.wiring = WiringStore(directory / "wiring.sqlite3")
        self.committer = Committer()
        self.journals_dir = directory / "queues"
        self.paging_dir = directory / "paging"
        self.quarantine_dir = directory / "quarantine"
        #: compaction since start: segments deleted, live records copied to the head
        self.segments_freed = 0
        self.records_copied = 0
        #: messages found corrupt on disk since start, and the last one (the alarm)
        self.corrupt = 0
        self.last_corrupt: dict[str, Any] | None = None
        shutil.rmtree(self.paging_dir, ignore_errors=True)
        self._paging_ids = itertools.count(1)
        self.stores: dict[tuple[str, str], JournalQueueStore] = {}
        #: queues being rebuilt by ``recover``: their journals are read, not wiped
        self._recovering: set[tuple[str, str]] = set()
        self._recording = True
        self._task: asyncio.Task[None] | None = None
        self.recovery: dict[str, Any] = {}

    # -- queues ------------------------------------------------------------------------

    def queue_store(self, vhost: str, queue: Queue) -> JournalQueueStore:
        key = (vhost, queue.name)
        if not queue.durable or queue.exclusive:
            # only for flow to disk; its journal is made when it first pages out
            def open_paging() -> QueueJournal:
                path = self.paging_dir / str(next(self._paging_ids))
                path.mkdir(parents=True, exist_ok=True)
                return QueueJournal(path, self.segment_size, self.quarantine_dir)

            return JournalQueueStore(
                None,
                self.committer,
                durable=False,
                open_journal=open_paging,
                label=f"'{queue.name}' in vhost '{vhost}'",
                on_corrupt=self._corrupted,
            )
        path = self.journals_dir / queue_key(vhost, queue.name)
        if key not in self._recovering and path.exists():
            shutil.rmtree(path, ignore_errors=True)  # a queue of that name that went
        journal = QueueJournal(path, self.segment_size, self.quarantine_dir)
        path.mkdir(parents=True, exist_ok=True)
        store = JournalQueueStore(
            journal,
            self.committer,
            durable=True,
            on_deleted=lambda s, key=key: self.stores.pop(key, None),  # type: ignore[misc]
            label=f"'{queue.name}' in vhost '{vhost}'",
            on_corrupt=self._corrupted,
        )
        self.stores[key] = store
        return store

    # -- the model's wiring, as it changes (WiringRecorder) ------------------------------

    def exchange_declared(self, vhost: str, exchange: Exchange) -> None:
        if self._recording:
            self.wiring.put_exchange(
                StoredExchange(
                    vhost,
                    exchange.name,
                    exchange.type_name,
                    exchange.auto_delete,
                    exchange.internal,
                    exchange.arguments,
                )
            )

    def exchange_deleted(self, vhost: str, name: str) -> None:
        if self._recording:
            self.wiring.delete_exchange(vhost, name)

    def queue_declared(self, vhost: str, queue: Queue) -> None:
        if self._recording:
            self.wiring.put_queue(
                StoredQueue(
                    vhost,
                    queue.name,
                    queue.auto_delete,
                    queue.arguments,
                    queue_key(vhost, queue.name),
                )
            )

    def queue_deleted(self, vhost: str, name: str) -> None:
        if self._recording:
            self.wiring.delete_queue(vhost, name)

    def bound(self, vhost: str, binding: Binding) -> None:
        if self._recording:
            self.wiring.put_binding(_stored_binding(vhost, binding))

    def unbound(self, vhost: str, binding: Binding) -> None:
        if self._recording:
            self.wiring.delete_binding(_stored_binding(vhost, binding))

    # -- recovery --------------------------------------------------------------------------

    def recover(self, broker: Broker) -> dict[str, Any]:
        """Rebuild durable wiring and messages into the model (at start, before the
        broker listens). Returns what was recovered, for the log and ``ctl status``."""
        started = time.monotonic()
        exchanges = queues = messages = bindings = 0
        self._recording = False
        try:
            for x in self.wiring.exchanges():
                vhost = broker.vhosts.get(x.vhost)
                if vhost is None:
                    log.warning(
                        "recovery: exchange %s of unknown vhost %r skipped", x.name, x.vhost
                    )
                    continue
                vhost.declare_exchange(
                    x.name,
                    x.type,
                    durable=True,
                    auto_delete=x.auto_delete,
                    internal=x.internal,
                    arguments=x.arguments,
                )
                exchanges += 1
            for q in self.wiring.queues():
                vhost = broker.vhosts.get(q.vhost)
                if vhost is None:
                    log.warning("recovery: queue %s of unknown vhost %r skipped", q.name, q.vhost)
                    continue
                self._recovering.add((q.vhost, q.name))
                try:
                    queue, _ = vhost.declare_queue(
                        q.name,
                        connection_id=0,
                        durable=True,
                        auto_delete=q.auto_delete,
                        arguments=q.arguments,
                        reserved_ok=True,
                    )
                finally:
                    self._recovering.discard((q.vhost, q.name))
                messages += self._recover_messages(queue)
                queues += 1
            for b in self.wiring.bindings():
                if self._recover_binding(broker, b):
                    bindings += 1
        finally:
            self._recording = True
        self._drop_orphans()
        self.recovery = {
            "exchanges": exchanges,
            "queues": queues,
            "bindings": bindings,
            "messages": messages,
            "seconds": round(time.monotonic() - started, 3),
        }
        log.warning(
            "recovered exchanges=%d queues=%d bindings=%d messages=%d in %.2fs",
            exchanges,
            queues,
            bindings,
            messages,
            self.recovery["seconds"],
        )
        return self.recovery

    def _recover_messages(self, queue: Queue) -> int:
        store = queue.store
        if not isinstance(store, JournalQueueStore) or store.journal is None:
            return 0
        recovered = store.journal.recover(self.page_limit)
        for error in store.journal.damaged:
            log.error(
                "recovery: queue %s: a damaged record (%s; it claims message %d) was "
                "skipped and kept in %s",
                store.label,
                error,
                error.jid,
                self.quarantine_dir,
            )
            self._corrupted(store, error)
        loaded: list[tuple[Message, bool]] = []
        for r in recovered:
            if r.body is None:  # past the queue's memory: a stand-in, as if paged out
                stub = Paged(Message(r.exchange, r.routing_key, r.props, b""), r.id)
                stub.length = r.length
                store.paged += 1
                loaded.append((stub, r.redelivered))
                continue
            message = Message(r.exchange, r.routing_key, r.props, r.body)
            store.ids[id(message)] = r.id
            loaded.append((message, r.redelivered))
        return queue.load_recovered(loaded)

    @staticmethod
    def _recover_binding(broker: Broker, b: StoredBinding) -> bool:
        vhost = broker.vhosts.get(b.vhost)
        if vhost is None:
            return False
        source = vhost.exchanges.get(b.source)
        destination = (
            vhost.queues.get(b.destination)
            if b.kind == "queue"
            else vhost.exchanges.get(b.destination)
        )
        if source is None or destination is None:
            return False
        vhost.bind(source, destination, b.routing_key, b.arguments)
        return True

    def _drop_orphans(self) -> None:
        """Journal directories whose queue is not in the wiring store (the broker died
        between deleting the one and the other) are removed."""
        known = {q.journal for q in self.wiring.queues()}
        if not self.journals_dir.exists():
            return
        for path in self.journals_dir.iterdir():
            if path.name not in known:
                log.warning("recovery: journal %s has no queue: removed", path.name)
                shutil.rmtree(path, ignore_errors=True)

    # -- compaction ---------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._compact_loop())

    async def _compact_loop(self) -> None:
        while True:
            await asyncio.sleep(self.compact_every)
            try:
                self.compact()
            except Exception:  # a bad segment must not stop the store
                log.exception("journal compaction failed")

    def compact(self, limit: int = COMPACT_PER_PASS) -> int:
        """Free old segments: delete dead ones, copy the few live records of sparse
        ones to the head (deleted on a later pass, once the copies are on disk)."""
        freed = 0
        for store in list(self.stores.values()):
            journal = store.journal
            if journal is None:
                continue
            while freed < limit:
                segment = journal.oldest()
                if segment is None:
                    break
                if journal.removable(segment):
                    journal.remove(segment)
                    freed += 1
                    continue
                if segment.live > 0 and journal.sparse(segment):
                    moved, corrupt = journal.copy_live(segment)
                    self.records_copied += moved
                    for error in corrupt:
                        store.corrupted(error)
                    self.committer.register(journal)
                break
        self.segments_freed += freed
        return freed

    # -- integrity ---------------------------------------------------------------------

    def _corrupted(self, store: JournalQueueStore, error: CorruptRecord) -> None:
        """A queue found a message corrupt on disk: counted, and the ``store`` alarm
        (``alarm``) stands until the broker restarts."""
        self.corrupt += 1
        self.last_corrupt = {
            "queue": store.label,
            "jid": error.jid,
            "segment": error.segment,
            "offset": error.offset,
            "reason": error.reason,
            "since": time.time(),
        }

    def alarm(self) -> dict[str, Any] | None:
        """The store alarm, as ``view.alarms`` lists alarms (None while all is well):
        it does not block publishers, it tells the operator data was lost."""
        last = self.last_corrupt
        if last is None:
            return None
        return {
            "kind": "store",
            "message": (
                f"store integrity: {self.corrupt} message(s) found corrupt on disk and not "
                f"delivered (last: queue {last['queue']}, journal id {last['jid']}: "
                f"{last['reason']}); records kept in {self.quarantine_dir}"
            ),
            "since": last["since"],
        }

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.committer.drain()
        self.committer.close()
        for store in self.stores.values():
            if store.journal is not None:
                store.journal.close()
        self.wiring.close()

    def describe(self) -> dict[str, Any]:
        segments = sum(
            len(s.journal.segments) for s in self.stores.values() if s.journal is not None
        )
        return {
            "directory": str(self.dir),
            "durable_queues": len(self.stores),
            "segments": segments,
            "commits": self.committer.rounds,
            "last_commit_ms": round(self.committer.last_round_ms, 3),
            "write_failures": self.committer.failures,
            "segments_freed": self.segments_freed,
            "records_copied": self.records_copied,
            "corrupt": self.corrupt,
            "recovery": self.recovery,
        }


def _stored_binding(vhost: str, binding: Binding) -> StoredBinding:
    destination = binding.destination
    kind = "exchange" if isinstance(destination, Exchange) else "queue"
    return StoredBinding(
        vhost,
        binding.source.name,
        destination.name,
        kind,
        binding.routing_key,
        binding.arguments,
    )
