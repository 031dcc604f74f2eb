"""A shovel's transfer, sans I/O: deliveries in, publishes and acknowledgements out.

The asyncio shell (``bridges.runner``) owns the two connections; this class
decides, for each delivery from the source and each confirm from the
destination, what to publish and what to acknowledge. It is plain code so
that the one property that matters can be checked over any interleaving
(tests/unit/test_bridge_transfer.py, with hypothesis):

- ``on-confirm``: a source message is acknowledged only once the destination
  has confirmed its copy; a nack requeues it at the source. A lost connection
  abandons what is in flight, and the source broker requeues it (flagged
  redelivered): nothing is lost, a duplicate is always flagged.
- ``on-publish``: acknowledged as soon as it is handed to the destination
  connection (a crash in between may lose it, as in RabbitMQ).
- ``no-ack``: the source delivers without acknowledgements at all.

Deliveries and publishes both advance one by one on their channels, so a run
of confirms that leaves no earlier publish outstanding is acknowledged at the
source with one ``multiple`` ack, as RabbitMQ's shovel does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from brokerd.bridges.definitions import NO_ACK, ON_CONFIRM, ON_PUBLISH, ShovelDefinition
from brokerd.wire import codec

#: the header RabbitMQ's shovels add (with ``dest-add-forward-headers``)
SHOVELLED = "x-shovelled"
SHOVELLED_TIMESTAMP = "x-shovelled-timestamp"
#: on a message the source delivered flagged redelivered: the AMQP flag cannot cross a
#: republish, so the destination's consumers see this header instead
REDELIVERED = "x-redelivered"
#: no properties at all (flags 0)
EMPTY_PROPERTIES = b"\x00\x00"


@dataclass(frozen=True)
class Delivery:
    """One message from the source (``tag``: its delivery tag there)."""

    tag: int
    exchange: str
    routing_key: str
    body: bytes
    #: the content header's property bytes, as they came (``wire.codec``)
    properties: bytes = EMPTY_PROPERTIES
    redelivered: bool = False


@dataclass(frozen=True)
class Publish:
    """Publish this at the destination; ``seq`` is its confirm sequence number."""

    seq: int
    exchange: str
    routing_key: str
    body: bytes
    #: the source's property bytes, changed only where the definition says so
    properties: bytes


@dataclass(frozen=True)
class Ack:
    tag: int
    multiple: bool = False


@dataclass(frozen=True)
class Nack:
    tag: int
    requeue: bool = True


@dataclass(frozen=True)
class Cancel:
    """Stop consuming at the source: ``src-delete-after`` has been reached."""


Action = Publish | Ack | Nack | Cancel


class Transfer:
    """One connected session of a shovel (``reset`` when either connection ends)."""

    def __init__(
        self, definition: ShovelDefinition, node: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.definition = definition
        self.node = node
        self.clock = clock
        #: messages still to take before the shovel is done (None: no limit)
        self.remaining: int | None = (
            definition.delete_after if isinstance(definition.delete_after, int) else None
        )
        #: destination publishes awaiting their confirm: seq -> source tag, in order
        self.outstanding: dict[int, int] = {}
        self.next_seq = 1
        #: totals over the shovel's life (not reset with a session)
        self.forwarded = 0
        self.acknowledged = 0
        self.requeued = 0
        self._forward_header = _forward_header(definition, node)

    # -- the session ------------------------------------------------------------------

    def reset(self) -> None:
        """A connection ended: what was in flight is the source broker's again (it
        requeues unacknowledged deliveries); publish sequence numbers start over."""
        if self.remaining is not None:
            self.remaining += len(self.outstanding)
        self.outstanding.clear()
        self.next_seq = 1

    def start(self, queue_length: int | None = None) -> list[Action]:
        """The session is up. ``queue_length``: the source queue's depth, read when a
        ``queue-length`` shovel first starts (it transfers that many and stops)."""
        if self.definition.delete_after == "queue-length" and self.remaining is None:
            self.remaining = queue_length or 0
        return [Cancel()] if self.finished_taking else []

    @property
    def prefetch(self) -> int:
        """The window to ask the source for: never more than is left to take."""
        window = self.definition.prefetch
        return window if self.remaining is None else max(1, min(window, self.remaining))

    @property
    def finished_taking(self) -> bool:
        return self.remaining is not None and self.remaining <= 0

    @property
    def done(self) -> bool:
        """A ``src-delete-after`` shovel took its count and every copy is settled:
        the shovel deletes itself."""
        return self.finished_taking and not self.outstanding

    @property
    def in_flight(self) -> int:
        return len(self.outstanding)

    # -- events -----------------------------------------------------------------------

    def delivered(self, delivery: Delivery) -> list[Action]:
        """A delivery from the source: its publish, and what to acknowledge now."""
        mode = self.definition.ack_mode
        if self.finished_taking:
            # past the count, still in flight when the consumer was cancelled
            return [] if mode == NO_ACK else [Nack(delivery.tag, requeue=True)]
        publish = self._publish(delivery)
        actions: list[Action] = [publish]
        self.forwarded += 1
        if self.remaining is not None:
            self.remaining -= 1
        if mode == ON_CONFIRM:
            self.outstanding[publish.seq] = delivery.tag
        elif mode == ON_PUBLISH:
            actions.append(Ack(delivery.tag))
            self.acknowledged += 1
        else:
            self.acknowledged += 1
        if self.finished_taking:
            actions.append(Cancel())
        return actions

    def confirmed(self, seq: int, multiple: bool, ok: bool) -> list[Action]:
        """The destination confirmed (``ok``) or nacked publish ``seq`` (and all before
        it with ``multiple``): acknowledge or requeue their source messages."""
        if self.definition.ack_mode != ON_CONFIRM:
            return []
        if multiple:
            settled = [s for s in self.outstanding if s <= seq]
        else:
            settled = [seq] if seq in self.outstanding else []
        if not settled:
            return []
        tags = [self.outstanding.pop(s) for s in settled]
        if not ok:
            self.requeued += len(tags)
            if self.remaining is not None:
                self.remaining += len(tags)
            return [Nack(tag, requeue=True) for tag in tags]
        self.acknowledged += len(tags)
        lowest_left = min(self.outstanding, default=None)
        if len(tags) > 1 and (lowest_left is None or lowest_left > max(settled)):
            # no earlier publish is outstanding: one ack covers them all
            return [Ack(max(tags), multiple=True)]
        return [Ack(tag) for tag in tags]

    # -- what goes to the destination -----------------------------------------------------

    def _publish(self, delivery: Delivery) -> Publish:
        definition = self.definition
        destination = definition.destination
        if destination.queue is not None:
            exchange, key = "", destination.queue
        else:
            exchange = (
                destination.exchange if destination.exchange is not None else delivery.exchange
            )
            key = (
                destination.exchange_key
                if destination.exchange_key is not None
                else delivery.routing_key
            )
        properties = delivery.properties
        if (
            definition.publish_properties
            or definition.add_forward_headers
            or definition.add_timestamp_header
            or delivery.redelivered
        ):
            properties = self._rewrite(properties, delivery.redelivered)
        seq = self.next_seq
        self.next_seq += 1
        return Publish(seq, exchange, key, delivery.body, properties)

    def _rewrite(self, raw: bytes, redelivered: bool) -> bytes:
        """The property bytes with ``dest-publish-properties`` applied and the
        forward headers added (the only case where a message is changed), and
        ``x-redelivered`` on a message the source delivered flagged: a destination
        consumer knows it may have had it already (this shovel, or one before a
        move, may have forwarded it before its acknowledgement was lost)."""
        definition = self.definition
        props = codec.decode_properties(raw)
        for name, value in definition.publish_properties.items():
            if name == "timestamp" and isinstance(value, int | float):
                value = datetime.fromtimestamp(value, tz=UTC)
            setattr(props, name, value)
        headers = dict(props.headers or {})
        if definition.add_forward_headers:
            earlier = headers.get(SHOVELLED)
            trail = list(earlier) if isinstance(earlier, list) else []
            headers[SHOVELLED] = [self._forward_header, *trail]
        if definition.add_timestamp_header:
            headers[SHOVELLED_TIMESTAMP] = int(self.clock())
        if redelivered:
            headers[REDELIVERED] = True
        props.headers = headers or None
        return codec.encode_properties(props)


def _forward_header(definition: ShovelDefinition, node: str) -> dict[str, Any]:
    """RabbitMQ's ``x-shovelled`` entry: who moved the message, and from where to
    where (URIs without passwords)."""
    entry: dict[str, Any] = {
        "shovelled-by": node,
        "shovel-type": "dynamic",
        "shovel-name": definition.name,
        "shovel-vhost": definition.vhost,
    }
    source, destination = definition.source, definition.destination
    entry["src-uri"] = source.uris[0].redacted
    if source.queue is not None:
        entry["src-queue"] = source.queue
    else:
        entry["src-exchange"] = source.exchange
        entry["src-exchange-key"] = source.exchange_key
    entry["dest-uri"] = destination.uris[0].redacted
    if destination.queue is not None:
        entry["dest-queue"] = destination.queue
    if destination.exchange is not None:
        entry["dest-exchange"] = destination.exchange
    if destination.exchange_key is not None:
        entry["dest-exchange-key"] = destination.exchange_key
    return entry
