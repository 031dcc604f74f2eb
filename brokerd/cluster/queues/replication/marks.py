"""Confirm marks: a log line when an owner confirms publishes to a replicated queue.

A queue must never have two owners that both confirm what the later one may
not hold. The fault harness checks this from the servers' own logs
(``tests/faults/owners.py``): per queue, the marks must come in the order of
the owners' (term, epoch), unless a late one confirms only events of its
stream that its replicas had applied before they fenced it (``seq`` against
the replicas' "owner X fenced: its stream stops at event N" lines): those are
what the next owner took the queue from, so confirming them late is safe (a
resumed SIGSTOPped owner reading acks sent before the fence does exactly this).

A mark is written at most every ``MARK_EVERY`` seconds per queue, and the last
confirm of a burst is marked once that time has passed, so a mark's ``seq``
(the highest event confirmed so far) always catches up. Marks go to the
``brokerd.cluster.confirms`` logger, which only servers started with
``--enable-fault-injection`` log at INFO (others: nothing, and the publish
path pays one attribute test).
"""

from __future__ import annotations

import asyncio
import logging
import time

from brokerd.model.completion import Done

log = logging.getLogger("brokerd.cluster.confirms")

#: at most one mark per queue this often (seconds): fine enough to see an old owner
#: confirming after its successor began, coarse enough for a soak's logs
MARK_EVERY = 0.02


class ConfirmMarks:
    """The marks of one queue on its owner ``owner`` (its spid), which took it at
    placement ``epoch`` of the state log of term ``term`` (``terms.py``). Epochs grow
    along one log, and a log seeded anew (a whole-cluster restart) has a later term,
    so a later owner's marks carry a later (term, epoch)."""

    __slots__ = (
        "_last",
        "_marked",
        "_pending",
        "_seq",
        "epoch",
        "owner",
        "queue",
        "retired",
        "term",
    )

    def __init__(self, queue: str, epoch: int, term: int, owner: str = "-") -> None:
        self.queue = queue
        self.epoch = epoch
        self.term = term
        self.owner = owner
        #: the owner let the queue go: confirms still to come are the next owner's
        self.retired = False
        self._last = float("-inf")
        self._seq = 0  # the highest stream event confirmed so far
        self._marked = 0  # the seq of the last mark written
        self._pending = False  # a flush of the burst's last confirm is scheduled

    @staticmethod
    def enabled() -> bool:
        return log.isEnabledFor(logging.INFO)

    def wrap(self, done: Done, seq: int = 0) -> Done:
        """``done``, marking the confirm of stream event ``seq`` when it is one."""

        def marked(accepted: bool, routed: int) -> None:
            if accepted:
                self.confirmed(seq)
            done(accepted, routed)

        return marked

    def retire(self) -> None:
        """Before the queue goes: what was confirmed until now is marked first."""
        if not self.retired:
            self._flush()
        self.retired = True

    def confirmed(self, seq: int = 0) -> None:
        if self.retired:
            return
        self._seq = max(self._seq, seq)
        now = time.monotonic()
        if now - self._last >= MARK_EVERY:
            self._write(now)
        elif not self._pending:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a unit test): the next mark catches up
                return
            self._pending = True
            loop.call_later(MARK_EVERY, self._flush)

    def _flush(self) -> None:
        self._pending = False
        if not self.retired and self._seq > self._marked:
            self._write(time.monotonic())

    def _write(self, now: float) -> None:
        self._last = now
        self._marked = self._seq
        log.info(
            "confirms queue=%s term=%d epoch=%d owner=%s seq=%d",
            self.queue,
            self.term,
            self.epoch,
            self.owner,
            self._seq,
        )
