"""A replica acks an owner's acquisition only once its ACQUIRE record is written
(``Copies._acquire``). The owner delivers a message once its replicas acked the
acquisition: acked before the record reached the journal, a kill -9 of every server
(the owner's disk lost) brought the copy back unflagged, and the client got the
delivered message a second time without the redelivered flag (the ninth session's
1,000-fault soak, kill-all-wipe: 32 such)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from brokerd.cluster.plane import records as rec
from brokerd.cluster.queues.replication.content import QueueCopy, SourceStream
from brokerd.cluster.queues.replication.copies import Copies
from brokerd.cluster.queues.replication.entry import Entry
from brokerd.model.message import Message


class Store:
    """A journal store whose writes complete when the test says (a commit round)."""

    def __init__(self) -> None:
        self.rounds: list[Any] = []

    def delivered(self, message: Message, consumer: Any, no_ack: bool, written: Any = None) -> None:
        if written is not None:
            self.rounds.append(written.defer())


def test_an_acquisition_is_acked_only_once_its_record_is_written() -> None:
    acks: list[int] = []
    transport = SimpleNamespace(
        spid="replica",
        out=lambda spid: spid,
        ack_batch=lambda out: SimpleNamespace(replicated=acks.append),
    )
    copies = Copies(transport, lambda: None, lambda name: None, lambda: "owner")  # type: ignore[arg-type]
    store = Store()
    copies._store = lambda name: store  # type: ignore[method-assign]
    stream = copies.streams["owner"] = SourceStream("owner")
    stream.joined, stream.applied = True, 6
    copy = copies.queues["q"] = QueueCopy("owner")
    copy.entries[1] = Entry(Message("", "q", b"", b"body", "", 0), False, False, True)
    acquire = SimpleNamespace(op=rec.R_ACQUIRE, queue="q", mid=1, seq=7)
    copies.apply(stream, acquire)  # type: ignore[arg-type]
    stream.applied = 7
    copies.ack(stream)
    assert acks == [6], "event 7 is not acked while its ACQUIRE record is unwritten"
    assert len(store.rounds) == 1
    store.rounds[0](True, 1)  # the commit round wrote it
    copies.ack(stream)
    assert acks[-1] == 7
