"""Message TTL and queue expiry: the clock, the timers, and RabbitMQ's rules for values.

A queue keeps a deadline only for messages that have one (``x-message-ttl``
on the queue, or the message's own ``expiration``, the smaller of the two),
and one event-loop timer, for the deadline of its head: like RabbitMQ's
classic queues it expires from the head only, so a short-lived message
behind a longer-lived one waits until it reaches the head (it is never
delivered once past its deadline: the head is checked before each
delivery). Nothing of this costs a queue without TTL more than a flag test
per message.

Deadlines are on the monotonic clock: a wall-clock step must not expire a
queue's contents (nor keep them).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.model.deadletter import EXPIRED
from brokerd.model.errors import precondition_failed
from brokerd.model.message import Message
from brokerd.wire import tables

if TYPE_CHECKING:
    from brokerd.model.storage import QueueStore

#: RabbitMQ's largest TTL or expiry (ms): its timers' limit
MAX_EXPIRY = 4294967295

_INTEGER = re.compile(rb"([+-]?[0-9]+)(.*)", re.DOTALL)


class Handle(Protocol):
    def cancel(self) -> None: ...


class Timers:
    """Where queues read the time and set their timers: the running event loop.

    Without a running loop (model unit tests) no timer is set; expiry still
    happens when the head is next looked at."""

    def now(self) -> float:
        return time.monotonic()

    def later(self, delay: float, callback: Callable[[], None]) -> Handle | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        return loop.call_later(max(delay, 0.0), callback)


#: the timers every queue uses unless a test gives it others
TIMERS = Timers()


def parse_expiration(value: bytes) -> int:
    """The TTL in an ``expiration`` property (ms), or ValueError with RabbitMQ's
    reason as it prints it (rabbit_basic:parse_expiration)."""
    found = _INTEGER.match(value)
    if found is None:
        raise ValueError("no_integer")
    number, rest = int(found.group(1)), found.group(2)
    if rest:
        raise ValueError(f'{{leftover_string,"{rest.decode(errors="replace")}"}}')
    if number > MAX_EXPIRY:
        raise ValueError(f"{{value_too_large,{number}}}")
    if number < 0:
        raise ValueError(f"{{value_negative,{number}}}")
    return number


def check_expiration(props_raw: bytes) -> None:
    """Refuse a publish whose ``expiration`` is not a TTL (406, RabbitMQ's text)."""
    value = tables.expiration(props_raw)
    if value is None:
        return
    try:
        parse_expiration(value)
    except ValueError as exc:
        raise precondition_failed(
            f"invalid expiration '{value.decode(errors='replace')}': {exc}"
        ) from None


def message_ttl(props_raw: bytes, queue_ttl: int | None) -> int | None:
    """The TTL (ms) a message gets in a queue: the smaller of the queue's and its own."""
    value = tables.expiration(props_raw)
    if value is None:
        return queue_ttl
    try:
        own = parse_expiration(value)
    except ValueError:  # refused at publish; a relayed one is let through without
        return queue_ttl
    return own if queue_ttl is None or own < queue_ttl else queue_ttl


#: how early a deadline counts as reached: the loop may run a timer up to its clock
#: resolution early, and RabbitMQ's TTLs are whole milliseconds anyway
SLACK = 0.0005


class QueueExpiry:
    """The TTL and x-expires half of ``Queue`` (a mixin): deadlines by position, the
    head's timer, and the unused-queue timer.

    Timers run while the queue is ``timed`` (a queue type holding this one turns
    them off while its messages are elsewhere); removals go through the store
    (``dequeued``), so a replicated store carries them to the replicas as
    settlements."""

    __slots__ = (
        "_deadlines",
        "_expiry_due",
        "_expiry_timer",
        "_last_used",
        "_unused_timer",
        "expires",
        "message_ttl",
    )

    timers: Timers = TIMERS
    timed: bool
    deleted: bool
    arguments: dict[str, Any]
    messages: deque[Message]
    consumers: list[Any]
    store: QueueStore | None
    on_unused: Callable[[Any], None] | None
    stats_expired: int

    if TYPE_CHECKING:

        @property
        def message_count(self) -> int: ...
        def _pop(self, past_corrupt: bool = True) -> tuple[Message, bool, int] | None: ...
        def _head_position(self) -> int: ...
        def _dead_letter(self, messages: list[Message], reason: str) -> None: ...
        def dispatch(self) -> None: ...

    def _init_expiry(self) -> None:
        #: x-message-ttl (ms), None: messages live until taken (or their own expiration)
        self.message_ttl: int | None = self.arguments.get("x-message-ttl")
        #: x-expires (ms): the queue goes after this long without consumers or use
        self.expires: int | None = self.arguments.get("x-expires")
        #: position -> monotonic deadline, for the messages (ready or unacked) that have one
        self._deadlines: dict[int, float] = {}
        self._expiry_timer: Handle | None = None
        self._expiry_due = 0.0
        self._unused_timer: Handle | None = None
        self._last_used = self.timers.now()
        if self.expires is not None and self.timed:
            self._arm_unused()

    def _deadline(self, message: Message) -> float | None:
        ttl = message_ttl(message.props_raw, self.message_ttl)
        return None if ttl is None else self.timers.now() + ttl / 1000

    # -- message TTL ---------------------------------------------------------------

    def _expire_head(self) -> None:
        """Drop the messages at the head whose deadline has passed (never further in:
        RabbitMQ expires from the head)."""
        deadlines = self._deadlines
        now = self.timers.now() + SLACK
        expired = []
        while self.message_count:
            position = self._head_position()
            deadline = deadlines.get(position)
            if deadline is None or deadline > now:
                break
            del deadlines[position]
            popped = self._pop(past_corrupt=False)
            if popped is not None:  # None: it was found corrupt (dropped, counted)
                expired.append(popped[0])
        if expired:
            self._expired(expired)

    def _expired(self, messages: list[Message], stored: bool = True) -> None:
        self.stats_expired += len(messages)
        if stored and self.store is not None:
            self.store.dequeued(messages)
        self._dead_letter(messages, EXPIRED)

    def _arm_expiry(self) -> None:
        """Have the timer fire by the head's deadline (one timer per queue: an earlier
        one already set is kept, and moves on when it fires)."""
        if not self.timed or not self.message_count:
            return
        deadline = self._deadlines.get(self._head_position())
        if deadline is None:
            return
        timer = self._expiry_timer
        if timer is not None:
            if self._expiry_due <= deadline:
                return
            timer.cancel()
        self._expiry_due = deadline
        self._expiry_timer = self.timers.later(deadline - self.timers.now(), self._expiry_fired)

    def _expiry_fired(self) -> None:
        self._expiry_timer = None
        if self.deleted or not self.timed:
            return
        self._expire_head()
        if self.consumers and self.message_count:
            self.dispatch()
        self._arm_expiry()

    # -- x-expires -----------------------------------------------------------------

    def touch(self) -> None:
        """The queue was used (declared again, got from, left by its last consumer):
        x-expires counts from now."""
        if self.expires is not None:
            self._last_used = self.timers.now()

    def _arm_unused(self) -> None:
        if self._unused_timer is not None or self.expires is None or not self.timed:
            return
        due = self._last_used + self.expires / 1000
        self._unused_timer = self.timers.later(due - self.timers.now(), self._unused_fired)

    def _unused_fired(self) -> None:
        """Delete the queue if nothing used it for x-expires; consumers keep it (the
        last one leaving starts the count again)."""
        self._unused_timer = None
        if self.deleted or not self.timed or self.expires is None or self.consumers:
            return
        if self.timers.now() + SLACK < self._last_used + self.expires / 1000:
            self._arm_unused()  # used meanwhile
            return
        if self.on_unused is not None:
            self.on_unused(self)

    # -- the role ----------------------------------------------------------------------

    def start_timers(self) -> None:
        """The queue's messages are here again (a promoted master): its timers start
        from now."""
        self._last_used = self.timers.now()
        self._arm_unused()
        if self._deadlines:
            self._expire_head()
            self._arm_expiry()

    def stop_timers(self) -> None:
        """The queue is gone, or its messages are elsewhere: its timers must not act."""
        for timer in (self._expiry_timer, self._unused_timer):
            if timer is not None:
                timer.cancel()
        self._expiry_timer = self._unused_timer = None
