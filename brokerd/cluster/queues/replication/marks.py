"""Confirm marks: a log line when an owner confirms publishes to a replicated queue.

A queue must never have two owners that both confirm: a confirm from an owner
that another server has already replaced is one the new owner may not hold.
The fault harness checks this from the servers' own logs
(``tests/faults/owners.py``): per queue, the marks must come in the order of
the owners' epochs. A mark is written at most every ``MARK_EVERY`` seconds per
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
    """The marks of one queue on its owner, which owns it by placement ``epoch`` (the
    one it took the queue at: marks of a later owner carry a later one)."""

    __slots__ = ("_last", "epoch", "queue")

    def __init__(self, queue: str, epoch: int) -> None:
        self.queue = queue
        self.epoch = epoch
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

    def confirmed(self) -> None:
        now = time.monotonic()
        if now - self._last >= MARK_EVERY:
            self._last = now
            log.info("confirms queue=%s epoch=%d", self.queue, self.epoch)
