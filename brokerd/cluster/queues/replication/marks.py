"""Confirm marks: a log line when an owner confirms publishes to a replicated queue.

A queue must never have two owners that both confirm: a confirm from an owner
that another server has already replaced is one the new owner may not hold.
The fault harness checks this from the servers' own logs
(``tests/faults/owners.py``): per queue, the marks must come in the order of
the owners' (term, epoch). A mark is written at most every ``MARK_EVERY`` seconds per
queue, on the ``brokerd.cluster.confirms`` logger, which only servers started
with ``--enable-fault-injection`` log at INFO (others: nothing, and the
publish path pays one attribute test).
"""

from __future__ import annotations

import logging
import time

from brokerd.model.completion import Done

log = logging.getLogger("brokerd.cluster.confirms")

#: at most one mark per queue this often (seconds): fine enough to see an old owner
#: confirming after its successor began, coarse enough for a soak's logs
MARK_EVERY = 0.02


class ConfirmMarks:
    """The marks of one queue on its owner, which took it at placement ``epoch`` of the
    state log of term ``term`` (``terms.py``). Epochs grow along one log, and a log
    seeded anew (a whole-cluster restart) has a later term, so a later owner's
    marks carry a later (term, epoch)."""

    __slots__ = ("_last", "epoch", "queue", "retired", "term")

    def __init__(self, queue: str, epoch: int, term: int) -> None:
        self.queue = queue
        self.epoch = epoch
        self.term = term
        #: the owner let the queue go: confirms still to come are the next owner's
        self.retired = False
        self._last = float("-inf")

    @staticmethod
    def enabled() -> bool:
        return log.isEnabledFor(logging.INFO)

    def wrap(self, done: Done) -> Done:
        """``done``, marking the confirm when it is one."""

        def marked(accepted: bool, routed: int) -> None:
            if accepted:
                self.confirmed()
            done(accepted, routed)

        return marked

    def retire(self) -> None:
        self.retired = True

    def confirmed(self) -> None:
        if self.retired:
            return
        now = time.monotonic()
        if now - self._last >= MARK_EVERY:
            self._last = now
            log.info("confirms queue=%s term=%d epoch=%d", self.queue, self.term, self.epoch)
