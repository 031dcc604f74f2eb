"""Completing a push that some queues finish later.

A publish, a forward from another server or a replicated write is pushed into
queues; a queue that cannot answer at once (its replicas must have the message,
its journal must write it, it lives on another server) *defers*: it takes a
callback from the pusher's ``PublishWaiter.defer()`` and calls it once with
``(accepted, routed)``. A ``Completion`` counts those answers and gathers their
outcome; once the push's routing is over (``arm``) and every deferring queue
has answered, it completes, once. The channel's publish, the cluster's settled
forward and a replica's journal write each subclass it for what completing
means to them.
"""

from __future__ import annotations

from collections.abc import Callable

#: a deferring queue's answer: (accepted, how many queues took the message)
Done = Callable[[bool, int], None]


class Completion:
    """One push, complete when routing is over and every deferring queue answered.

    ``routed`` ends as the number of queues that took the message: the routing's
    own count, in which each deferring queue counted as one, corrected by what
    each of them answered (a forward to another server may reach several queues
    there, or none)."""

    __slots__ = ("armed", "deferred", "ok", "routed", "waiting")

    def __init__(self) -> None:
        #: queues that deferred, and those of them still to answer
        self.deferred = 0
        self.waiting = 0
        self.ok = True
        self.routed = 0
        #: set once routing is over: no queue can defer any more
        self.armed = False

    def defer(self) -> Done:
        """``PublishWaiter``: a queue will answer later, through the callback."""
        self.deferred += 1
        self.waiting += 1
        return self.done

    def done(self, accepted: bool, routed: int) -> None:
        """One deferring queue answered."""
        self.waiting -= 1
        self.ok = self.ok and accepted
        self.routed += routed
        if self.waiting == 0 and self.armed:
            self.complete()

    def arm(self, accepted: bool, routed: int) -> None:
        """Routing is over: ``accepted`` if every queue took it, ``routed`` queues
        reached (the deferring ones included)."""
        self.ok = self.ok and accepted
        self.routed += routed - self.deferred
        self.armed = True
        if self.waiting == 0:
            self.complete()

    @property
    def finished(self) -> bool:
        return self.armed and self.waiting == 0

    def complete(self) -> None:
        """Every answer is in: what the subclass does with the outcome."""
        raise NotImplementedError
