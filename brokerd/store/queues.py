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

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from brokerd.model.message import Message
from brokerd.model.storage import CorruptMessage, Paged
from brokerd.store import records as rec
from brokerd.store.committer import Committer
from brokerd.store.journal import CorruptRecord, QueueJournal
from brokerd.wire.codec import delivery_mode

if TYPE_CHECKING:
    from brokerd.model.interfaces import ConsumerSink, PublishWaiter


log = logging.getLogger("brokerd.store")


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
        label: str = "",
        on_corrupt: Callable[[JournalQueueStore, CorruptRecord], None] | None = None,
    ) -> None:
        #: None for a queue that has not paged yet (opened on first use)
        self.journal = journal
        self.committer = committer
        self.durable = durable
        #: a transient queue journals nothing on enqueue (``enqueued`` returns at once)
        self.tracks_enqueues = durable
        self._open_journal = open_journal
        self._on_deleted = on_deleted
        #: the queue, for log lines ("'name' in vhost '/'")
        self.label = label
        self._on_corrupt = on_corrupt
        #: messages of this queue found corrupt on disk (never delivered)
        self.corrupt = 0
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
        self,
        message: Message,
        waiter: PublishWaiter | None,
        *,
        jid: int | None = None,
        redelivered: bool = False,
    ) -> None:
        """``jid``: the id to keep it under (a replicated queue numbers its messages
        the same on every server; else the journal numbers them). ``redelivered``: it
        was delivered before it came here (a replica's copy of a message its master
        had delivered, or restored flagged), so a restart must bring it back flagged."""
        if not self.durable or delivery_mode(message.props_raw) != 2:
            return
        journal = self._journal()
        jid = journal.enqueue(
            message.exchange,
            message.routing_key,
            message.props_raw,
            message.body,
            persistent=True,
            redelivered=redelivered,
            id=jid,
        )
        self.ids[id(message)] = jid
        self.committer.register(journal, waiter.defer() if waiter is not None else None)

    def delivered(
        self,
        message: Message,
        consumer: ConsumerSink | None,
        no_ack: bool,
        written: PublishWaiter | None = None,
    ) -> None:
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
        # ``written``: a replica acks the acquisition only once its record is on disk
        # (a whole-cluster crash must not bring a delivered message back unflagged)
        self.committer.register(journal, written.defer() if written is not None else None)

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
            self.committer.register(journal)
        self.paged += 1
        return Paged(message, written)

    def read_body(self, jid: int) -> bytes:
        """A journalled message's body, checked; a damaged record is quarantined
        (``corrupted``) and raises the model's ``CorruptMessage``."""
        journal = self._journal()
        try:
            return journal.read_body(jid)
        except CorruptRecord as error:
            self.corrupted(error)
            raise CorruptMessage(str(error)) from error

    def corrupted(self, error: CorruptRecord) -> None:
        """A live message's record failed its check: log it with the queue and
        journal id, set its bytes aside, count it, and tell the store (the alarm)."""
        journal = self.journal
        if journal is None or error.jid in journal.corrupt:
            return
        kept = journal.quarantine(error)
        self.committer.register(journal)  # its DEQUEUE: a restart does not bring it back
        self.corrupt += 1
        log.error(
            "queue %s: message %d is corrupt on disk (%s); not delivered, record kept in %s",
            self.label or journal.dir.name,
            error.jid,
            error,
            kept or "(nothing readable to keep)",
        )
        if self._on_corrupt is not None:
            self._on_corrupt(self, error)

    def load(self, paged: Paged) -> Message:
        try:
            body = self.read_body(paged.jid)
        except CorruptMessage:
            self.paged -= 1
            raise
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
            "corrupt": self.corrupt,
        }
