"""Length limits and overflow (x-max-length, x-max-length-bytes, x-overflow): the
``push`` of a queue with a TTL or a limit, as RabbitMQ applies them.

``drop-head`` (the default) enqueues and drops heads while over the limit (the
same messages go as in RabbitMQ, dead-lettered with reason ``maxlen``);
``reject-publish`` refuses the newcomer (the channel nacks it, a transient
publish without confirms is dropped); ``reject-publish-dlx`` dead-letters it as
well. Off the plain path: a queue without limits or a TTL pays a flag test.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from brokerd.model.deadletter import MAXLEN
from brokerd.model.interfaces import PublishWaiter
from brokerd.model.message import Message
from brokerd.model.storage import QueueStore


class QueueOverflow:
    """The length-limit half of ``Queue``'s ``push`` (a mixin)."""

    __slots__ = ()

    messages: deque[Message]
    store: QueueStore | None
    bytes: int
    page_limit: int
    _paged_bytes: int
    _head_pos: int
    _deadlines: dict[int, float]
    max_length: int | None
    max_length_bytes: int | None
    reject_publish: bool
    _dead_letter_refused: bool
    stats_in: int
    stats_dropped: int

    if TYPE_CHECKING:
        from brokerd.model.expiry import Timers

        timers: Timers

        @property
        def message_count(self) -> int: ...
        def _pop(self, past_corrupt: bool = True) -> tuple[Message, bool, int] | None: ...
        def _dead_letter(self, messages: list[Message], reason: str) -> None: ...
        def _deadline(self, message: Message) -> float | None: ...
        def _expired(self, messages: list[Message], stored: bool = True) -> None: ...
        def _arm_expiry(self) -> None: ...

    def _push_checked(self, message: Message, waiter: PublishWaiter | None) -> bool:
        """``push`` past the consumers when a TTL or a length limit (x-max-length,
        x-max-length-bytes) applies: off the plain path, so a queue without them
        pays one flag test per message."""
        deadline = self._deadline(message)
        if deadline is not None and not self.message_count and deadline <= self.timers.now():
            # it would be the head and is due already (a TTL of 0): it goes at
            # once, never stored, as RabbitMQ discards (or dead-letters) it
            self._expired([message], stored=False)
            return True
        max_length = self.max_length
        max_bytes = self.max_length_bytes
        size = len(message.body)
        dropped = None
        if self._over(max_length, max_bytes, size):
            if self.reject_publish:
                self.stats_in -= 1
                self.stats_dropped += 1
                if self._dead_letter_refused:
                    self._dead_letter([message], MAXLEN)
                return False
            dropped = self._drop_head(max_length, max_bytes, size)
            if max_length == 0 or (max_bytes is not None and size > max_bytes):
                # no room even alone: enqueued and dropped at once, as the head
                self.stats_dropped += 1
                dropped.append(message)
                self._dead_letter(dropped, MAXLEN)
                return True
        if deadline is not None:
            self._deadlines[self._head_pos + len(self.messages)] = deadline
        store = self.store
        if store is not None:
            if store.tracks_enqueues:
                store.enqueued(message, waiter)
            if self.bytes > self.page_limit and (stub := store.page_out(message)) is not None:
                message = stub  # flow to disk: the body leaves memory
                self._paged_bytes += stub.length
            else:
                self.bytes += len(message.body)
        else:
            self.bytes += len(message.body)
        self.messages.append(message)
        if dropped:
            self._dead_letter(dropped, MAXLEN)
        if self._deadlines:
            self._arm_expiry()
        return True

    def _over(self, max_length: int | None, max_bytes: int | None, size: int) -> bool:
        """Would one more message of ``size`` bytes put the queue over its limits?"""
        return (max_length is not None and self.message_count >= max_length) or (
            max_bytes is not None and self.bytes + self._paged_bytes + size > max_bytes
        )

    def _drop_head(self, max_length: int | None, max_bytes: int | None, size: int) -> list[Message]:
        """Drop-head overflow: take heads until there is room for one more (RabbitMQ
        enqueues, then drops heads while over: the same messages go)."""
        dropped = []
        while self.message_count and self._over(max_length, max_bytes, size):
            popped = self._pop(past_corrupt=False)
            if popped is None:
                continue  # the head was corrupt (dropped, so not counted as dropped)
            head, _, position = popped
            if self._deadlines:
                self._deadlines.pop(position, None)
            dropped.append(head)
        self.stats_dropped += len(dropped)
        if self.store is not None and dropped:
            self.store.dequeued(dropped)
        return dropped
