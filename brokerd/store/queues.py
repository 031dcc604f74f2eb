"""One queue's part of the disk store: ``QueueStore`` over a ``QueueJournal``.

What is written:

- on a durable queue, every persistent message (delivery mode 2) as it is
  enqueued; the publisher's confirm waits for the commit that syncs it;
- its delivery (``ACQUIRE``, or ``DEQUEUE`` for a no-ack one), its ack or
  reject (``DEQUEUE``): recovery brings back what was not settled, flagged
  redelivered if it had been delivered;
- on any queue past its memory limit, each message it pages out (flow to
  disk), persistent or not: the queue keeps a ``Paged`` stand-in and the
  body comes back from disk when the message is delivered. A transient
  message's record only serves paging; recovery drops it.

Messages are known by ``id(message)`` while the queue holds them (the same
message object may sit in several queues, each with its own journal id),
and paged ones by their stand-in's journal id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from brokerd.model.message import Message
from brokerd.model.storage import Paged
from brokerd.store import records as rec
from brokerd.store.committer import Committer
from brokerd.store.journal import QueueJournal
from brokerd.wire.codec import delivery_mode

if TYPE_CHECKING:
    from brokerd.model.queue import ConsumerSink, PublishWaiter


class HeldPaged(Paged):
    """A stand-in whose body stays in memory until its record is on disk."""

    __slots__ = ("held",)

    def __init__(self, source: Message, jid: int) -> None:
        super().__init__(source, jid)
        self.held: bytes | None = source.body

    def release(self, ok: bool, _routed: int) -> None:
        if ok:
            self.held = None


class JournalQueueStore:
    """Implements the model's ``QueueStore`` for one queue."""

    def __init__(
        self,
        journal: QueueJournal | None,
        committer: Committer,
        *,
        durable: bool,
        open_journal: Callable[[], QueueJournal] | None = None,
        on_deleted: Callable[[JournalQueueStore], None] | None = None,
    ) -> None:
        #: None for a queue that has not paged yet (opened on first use)
        self.journal = journal
        self.committer = committer
        self.durable = durable
        #: a transient queue journals nothing on enqueue (``enqueued`` returns at once)
        self.tracks_enqueues = durable
        self._open_journal = open_journal
        self._on_deleted = on_deleted
        #: id(message) -> journal id, for messages this queue holds that are journalled
        self.ids: dict[int, int] = {}
        #: stand-ins handed out and not yet loaded or dropped
        self.paged = 0

    def _journal(self) -> QueueJournal:
        journal = self.journal
        if journal is None:
            assert self._open_journal is not None
            journal = self.journal = self._open_journal()
        return journal

    # -- events -----------------------------------------------------------------------

    def enqueued(
        self, message: Message, waiter: PublishWaiter | None, *, jid: int | None = None
    ) -> None:
        """``jid``: the id to keep it under (a replicated queue numbers its messages
        the same on every server; else the journal numbers them)."""
        if not self.durable or delivery_mode(message.props_raw) != 2:
            return
        journal = self._journal()
        jid = journal.enqueue(
            message.exchange,
            message.routing_key,
            message.props_raw,
            message.body,
            persistent=True,
            id=jid,
        )
        self.ids[id(message)] = jid
        self.committer.register(journal, waiter.defer() if waiter is not None else None)

    def delivered(self, message: Message, consumer: ConsumerSink | None, no_ack: bool) -> None:
        if message.paged:  # a replica marks its paged copies too
            jid = message.jid  # type: ignore[attr-defined]
            if no_ack:
                self.paged -= 1
        elif not self.ids:
            return
        else:
            jid = self.ids.get(id(message))
            if jid is None:
                return
            if no_ack:
                del self.ids[id(message)]
        journal = self._journal()
        if no_ack:
            journal.mark(rec.DEQUEUE, jid)
        else:
            journal.mark(rec.ACQUIRE, jid)
        self.committer.register(journal)

    def dequeued(self, messages: Iterable[Message]) -> None:
        if not self.ids and not self.paged:
            return
        journal = None
        for message in messages:
            jid = self.ids.pop(id(message), None)
            if jid is None and message.paged:
                jid = message.jid  # type: ignore[attr-defined]
                self.paged -= 1
            if jid is not None:
                journal = journal or self._journal()
                journal.mark(rec.DEQUEUE, jid)
        if journal is not None:
            self.committer.register(journal)

    def purged(self, messages: Iterable[Message]) -> None:
        self.dequeued(messages)

    def reset(self) -> None:
        """Forget every message (a replica's copy is replaced by a new snapshot):
        a dequeue record for each live one, so a restart brings none back."""
        journal = self.journal
        self.ids.clear()
        self.paged = 0
        if journal is None or not journal.where:
            return
        for jid in list(journal.where):
            journal.mark(rec.DEQUEUE, jid)
        self.committer.register(journal)

    def requeued(self, messages: Iterable[Message]) -> None:
        """Nothing to write: a requeued message stays live, and having been delivered
        (its ACQUIRE) is what makes it come back flagged redelivered."""

    # -- flow to disk -----------------------------------------------------------------

    def page_out(self, message: Message, *, jid: int | None = None) -> Paged | None:
        journal = self._journal()
        written = self.ids.pop(id(message), None)
        if written is None:  # not written yet (transient, or a queue that is not durable)
            written = journal.enqueue(
                message.exchange,
                message.routing_key,
                message.props_raw,
                message.body,
                persistent=False,
                id=jid,
            )
        jid = written
        stub = HeldPaged(message, jid)
        if journal.is_durable(jid):
            stub.held = None
        else:
            self.committer.register(journal, stub.release)
        self.paged += 1
        return stub

    def load(self, paged: Paged) -> Message:
        held = getattr(paged, "held", None)
        body = held if held is not None else self._journal().read_body(paged.jid)
        message = Message(
            paged.exchange,
            paged.routing_key,
            paged.props_raw,
            body,
            paged.publisher,
            paged.channel,
        )
        self.paged -= 1
        self.ids[id(message)] = paged.jid
        return message

    def deleted(self) -> None:
        journal, self.journal = self.journal, None
        self.ids.clear()
        self.paged = 0
        if journal is not None:
            self.committer.forget(journal)
            journal.destroy()
        if self._on_deleted is not None:
            self._on_deleted(self)

    def describe(self) -> dict[str, Any]:
        journal = self.journal
        return {
            "journalled": len(self.ids),
            "segments": 0 if journal is None else len(journal.segments),
        }
