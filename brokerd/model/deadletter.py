"""Dead-lettering, as RabbitMQ 3.10's rabbit_dead_letter does it.

A queue with ``x-dead-letter-exchange`` republishes what it expires
(``expired``), what a consumer rejects without requeue (``rejected``) and
what drop-head overflow pushes out (``maxlen``) to that exchange, through
the vhost's routing like a publish (no confirm, no mandatory return). The
copy carries the ``x-death`` history clients read (and retry logic counts
on), so its layout follows RabbitMQ's to the field types, the key order and
its quirks:

- each entry is a table of ``count`` (long), ``reason``, ``queue``, ``time``
  (timestamp, seconds), ``exchange``, ``routing-keys`` (array), and
  ``original-expiration`` when the message had an ``expiration``;
- the first death also sets ``x-first-death-reason/queue/exchange``;
- a later death in the same queue for the same reason increments that
  entry's count (nothing else in it changes) and moves it to the front,
  its keys sorted; a new one goes in front;
- an existing list of two or more entries is first grouped by queue and
  reason, which in 3.10 also reverses it (the fold never reverses its
  accumulator);
- the header table ends up sorted by key (set_table_value sorts);
- the copy loses ``expiration``, and with ``x-dead-letter-routing-key`` its
  ``CC`` header.

A copy that would reach a queue it already died in, with only automatic
reasons (``expired``, ``maxlen``) since, is not delivered there (cycle
detection); a ``rejected`` anywhere in the cycle lets it through. A missing
dead-letter exchange drops the message silently, as RabbitMQ does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from brokerd.model.message import Message
from brokerd.wire import tables as t

if TYPE_CHECKING:
    from brokerd.model.queue import Queue
    from brokerd.model.vhost import VirtualHost

log = logging.getLogger("brokerd.deadletter")

EXPIRED = "expired"
REJECTED = "rejected"
MAXLEN = "maxlen"

X_DEATH = b"x-death"
#: sender-selected distribution headers: their keys are routing keys too
ROUTING_HEADERS = (b"CC", b"BCC")
#: cycles already logged (each once, as RabbitMQ), bounded
_LOGGED_LIMIT = 1000


def dead_letter_copy(
    message: Message,
    reason: str,
    queue: str,
    exchange: str,
    routing_key: str | None,
    now: int | None = None,
) -> tuple[Message, list[bytes]]:
    """The copy of ``message`` dead-lettered from ``queue`` to ``exchange``, and its
    ``x-death`` list (raw array elements) for cycle detection.

    ``routing_key`` is the queue's ``x-dead-letter-routing-key`` (None: the
    message keeps its own). ``now``: seconds since the epoch (tests fix it)."""
    props, deaths = dead_letter_properties(
        message, reason, queue, routing_key, int(time.time()) if now is None else now
    )
    key = message.routing_key if routing_key is None else routing_key
    return Message(exchange, key, props, message.body), deaths


def dead_letter_properties(
    message: Message, reason: str, queue: str, routing_key: str | None, now: int
) -> tuple[bytes, list[bytes]]:
    """The dead-lettered copy's encoded properties, and its ``x-death`` elements."""
    fields = t.split_properties(message.props_raw)
    raw_headers = fields.get(t.HEADERS)
    headers = t.parse_table(raw_headers) if raw_headers is not None else []
    expiration = fields.pop(t.EXPIRATION, None)
    routing_keys = [message.routing_key.encode(), *_header_routes(headers)]
    info: list[t.Entry] = [
        (b"reason", t.longstr(reason.encode())),
        (b"queue", t.longstr(queue.encode())),
        (b"time", t.timestamp(now)),
        (b"exchange", t.longstr(message.exchange.encode())),
        (b"routing-keys", t.array([t.longstr(key) for key in routing_keys])),
    ]
    if expiration is not None:
        info.append((b"original-expiration", t.longstr(t.shortstr_value(expiration))))
    headers = update_x_death(info, headers)
    if routing_key is not None:
        headers = t.delete_first(headers, b"CC")
    fields[t.HEADERS] = t.encode_table(headers)
    deaths = t.lookup(headers, X_DEATH)
    return t.join_properties(fields), t.parse_array(deaths) if deaths is not None else []


def _header_routes(headers: list[t.Entry]) -> list[bytes]:
    """The CC and BCC keys of a message (rabbit_basic:header_routes)."""
    keys: list[bytes] = []
    for name in ROUTING_HEADERS:
        value = t.lookup(headers, name)
        if value is not None and value[:1] == b"A":
            keys.extend(k for k in map(t.string_of, t.parse_array(value)) if k is not None)
    return keys


def _event_key(entries: list[t.Entry], key: bytes) -> object:
    return t.term_of(t.lookup(entries, key))


def _matcher(queue: object, reason: object) -> Callable[[list[t.Entry]], bool]:
    def matches(entries: list[t.Entry]) -> bool:
        return _event_key(entries, b"queue") == queue and _event_key(entries, b"reason") == reason

    return matches


def _with_count(entries: list[t.Entry], count: int) -> list[t.Entry]:
    """ensure_xdeath_event_count: a count in front if the entry has none."""
    if t.lookup(entries, b"count") is None:
        return [(b"count", t.long(count)), *entries]
    return entries


def _group(tables: list[list[t.Entry] | bytes]) -> list[list[t.Entry] | bytes]:
    """group_by_queue_and_reason: one entry per (queue, reason), the first one seen,
    given the number of its duplicates as count if it had none. For two or more
    entries the result comes out reversed, as 3.10's fold leaves it."""
    if len(tables) < 2:
        return tables
    seen: set[tuple[object, object]] = set()
    grouped: list[list[t.Entry] | bytes] = []
    for item in tables:
        if not isinstance(item, list):
            grouped.insert(0, item)  # not a table (RabbitMQ would fail): kept as it is
            continue
        key = (_event_key(item, b"queue"), _event_key(item, b"reason"))
        if key in seen:
            continue
        seen.add(key)
        match = _matcher(*key)
        duplicates = sum(1 for e in tables if isinstance(e, list) and match(e))
        grouped.insert(0, _with_count(item, duplicates))
    return grouped


def _incremented(entries: list[t.Entry]) -> list[t.Entry]:
    """increment_xdeath_event_count: the first count goes up by one (1 if none)."""
    for i, (key, value) in enumerate(entries):
        if key == b"count":
            count = (t.int_of(value) or 0) + 1
            return [*entries[:i], (b"count", t.long(count)), *entries[i + 1 :]]
    return [(b"count", t.long(1)), *entries]


def update_x_death(info: list[t.Entry], headers: list[t.Entry]) -> list[t.Entry]:
    """The headers with this death recorded (update_x_death_header)."""
    reason = t.lookup(info, b"reason")
    queue = t.lookup(info, b"queue")
    exchange = t.lookup(info, b"exchange")
    assert reason is not None and queue is not None and exchange is not None
    current = t.lookup(headers, X_DEATH)
    if current is None:
        headers = t.set_value(headers, b"x-first-death-reason", reason)
        headers = t.set_value(headers, b"x-first-death-queue", queue)
        headers = t.set_value(headers, b"x-first-death-exchange", exchange)
        first = t.table([(b"count", t.long(1)), *info])
        return t.set_value(headers, X_DEATH, t.array([first]))
    if current[:1] != b"A":
        log.warning("message has an invalid x-death header (type %r): reset", current[:1])
        return t.set_value(headers, X_DEATH, t.array([t.table([(b"count", t.long(1)), *info])]))
    tables: list[list[t.Entry] | bytes] = [
        t.parse_table(item, 1) if item[:1] == b"F" else item for item in t.parse_array(current)
    ]
    match = _matcher(t.term_of(queue), t.term_of(reason))
    found: list[t.Entry] | None = None
    others: list[bytes] = []
    for item in _group(tables):
        if isinstance(item, list):
            if found is None and match(item):
                found = item
                continue
            others.append(t.table(item))
        else:
            others.append(item)
    entry = [(b"count", t.long(1)), *info] if found is None else _incremented(found)
    return t.set_value(headers, X_DEATH, t.array([t.table(t.sort_table(entry)), *others]))


def is_cycle(queue: str, deaths: Sequence[bytes]) -> bool:
    """Would delivering to ``queue`` close a cycle of automatic deaths (is_cycle)?

    The deaths down to the last one in ``queue`` must all be automatic (none
    ``rejected``, and all tables: anything else a client must have put there)."""
    name = t.longstr(queue.encode())
    for item in deaths:
        if item[:1] != b"F":
            return False  # not a table: not fully automatic (and not this queue)
        entries = t.parse_table(item, 1)
        if t.lookup(entries, b"reason") == t.longstr(b"rejected"):
            # a rejection before (or at) the queue's own death breaks the cycle;
            # if the queue never died here, there is no cycle either way
            return False
        if t.lookup(entries, b"queue") == name:
            return True
    return False


class DeadLetters:
    """A vhost's dead-letter publisher: the queues call it with what they drop."""

    def __init__(self, vhost: VirtualHost) -> None:
        self.vhost = vhost
        self._logged: set[tuple[str, ...]] = set()
        #: (reason, strategy) -> messages, as RabbitMQ's global counters split them:
        #: "at_most_once" copied to a DLX, "disabled" dropped (no DLX to go to)
        self.counts: dict[tuple[str, str], int] = {}

    def publish(self, queue: Queue, messages: Sequence[Message], reason: str) -> int:
        """Route each message's dead-lettered copy from the queue's DLX; returns how
        many copies were made (0 without a DLX, or if the exchange does not exist)."""
        name = queue.dead_letter_exchange
        exchange = self.vhost.exchanges.get(name) if name is not None else None
        key = (reason, "disabled" if exchange is None else "at_most_once")
        self.counts[key] = self.counts.get(key, 0) + len(messages)
        if exchange is None:
            return 0
        now = int(time.time())
        routing_key = queue.dead_letter_routing_key
        # a batch (what expired together) mostly shares its properties: the copy's
        # are made once per distinct original, and each cycle check once per queue
        last: tuple[bytes, str, str] | None = None
        props, deaths = b"", []
        cycles: dict[str, bool] = {}
        for message in messages:
            same = (message.props_raw, message.exchange, message.routing_key)
            if same != last:
                last = same
                props, deaths = dead_letter_properties(
                    message, reason, queue.name, routing_key, now
                )
                cycles = {}
            copy = Message(
                exchange.name,
                message.routing_key if routing_key is None else routing_key,
                props,
                message.body,
            )
            destinations: Iterable[Any] = self.vhost.route(exchange, copy)
            if reason != REJECTED:
                kept = []
                for destination in destinations:
                    cycle = cycles.get(destination.name)
                    if cycle is None:
                        cycle = cycles[destination.name] = is_cycle(destination.name, deaths)
                        if cycle:
                            self._log_cycle(destination.name, deaths)
                    if not cycle:
                        kept.append(destination)
                destinations = kept
            for destination in destinations:
                destination.push(copy)
        return len(messages)

    def _log_cycle(self, queue: str, deaths: Sequence[bytes]) -> None:
        names = [queue]
        for item in deaths:
            if item[:1] == b"F":
                value = t.string_of(t.lookup(t.parse_table(item, 1), b"queue"))
                if value is not None:
                    names.append(value.decode(errors="replace"))
        key = tuple(names)
        if key in self._logged or len(self._logged) >= _LOGGED_LIMIT:
            return
        self._logged.add(key)
        log.warning(
            "message dropped: dead-letter queues cycle detected: %s; "
            "this cycle will not be reported again",
            names,
        )
