"""One message of a replicated queue, as its master and every replica hold it."""

from __future__ import annotations

from brokerd.cluster.plane import records as rec
from brokerd.model.message import Message


class Entry:
    """A message (or its paged-out stand-in) and the flags every copy agrees on.

    The master numbers it (its mid, the key it is held under) and replicates
    each change of a flag as an event; a replica applies the events to its own
    entries, so a promoted replica starts from the same entries."""

    __slots__ = ("acquired", "message", "persistent", "redelivered")

    def __init__(
        self,
        message: Message,
        acquired: bool = False,
        redelivered: bool = False,
        persistent: bool = False,
    ) -> None:
        self.message = message
        #: delivered and not yet settled
        self.acquired = acquired
        self.redelivered = redelivered
        #: delivery mode 2: written to the journal of a durable queue
        self.persistent = persistent

    def requeue(self) -> None:
        """Back in the queue after a delivery: flagged redelivered from now on."""
        self.acquired = False
        self.redelivered = True

    @property
    def flags(self) -> int:
        """The flags as a record carries them (``records.F_*``)."""
        return (
            (rec.F_ACQUIRED if self.acquired else 0)
            | (rec.F_REDELIVERED if self.redelivered else 0)
            | (rec.F_PERSISTENT if self.persistent else 0)
        )

    def __repr__(self) -> str:
        return f"Entry({self.message!r}, flags={self.flags})"
