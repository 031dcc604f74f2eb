"""A published message as the broker holds it.

The content header's property bytes are kept encoded: the broker forwards
them untouched on delivery and decodes them only when something (a headers
muxer, a TTL, a dump) needs a property.

The body is any bytes-like object (:data:`Body`): ``bytes`` for the usual
one-frame message, a read-only ``memoryview`` for a large one that was
assembled in place (:func:`body_buffer`). Code that needs ``bytes`` (a JSON
parser, a dict key) converts; code that writes it (a socket, a file, a
record) takes it as it is, so a large body is never copied.
"""

from __future__ import annotations

import mmap
from typing import Any, TypeAlias

from pamqp import commands

from brokerd.wire import codec

#: what ``Message.body`` may be
Body: TypeAlias = bytes | bytearray | memoryview

#: declared body sizes from which the channel assembles into one buffer in place
#: (smaller multi-frame bodies are joined from their frames: at most 2x of 1 MiB)
LARGE_BODY = 1024 * 1024


def body_buffer(size: int) -> memoryview | None:
    """A writable buffer of ``size`` bytes for a large body, or None if none can be had.

    An anonymous private mapping rather than ``bytearray(size)``: its pages
    are committed only as the body frames are written into them, so a
    publisher that declares 128 MiB and sends 4 KiB costs 4 KiB, not 128 MiB
    (many channels each declaring a huge body must not be a memory
    amplifier), and nothing is zeroed or copied twice. Mappings are few (one
    per large message), far below ``vm.max_map_count``; if the kernel refuses
    one, the caller falls back to joining frames.
    """
    try:
        return memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE))
    except (OSError, ValueError, OverflowError):
        return None


class Message:
    """One message; shared (not copied) by every queue it is routed to."""

    #: a stand-in whose body is on disk (``storage.Paged``)
    paged = False

    __slots__ = (
        "_content",
        "_properties",
        "_tail",
        "body",
        "channel",
        "exchange",
        "expiring",
        "props_raw",
        "publisher",
        "ref",
        "routing_key",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        props_raw: bytes,
        body: Body,
        publisher: int | str = 0,
        channel: int = 0,
    ) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.props_raw = props_raw
        #: the expiration property's flag (bit 8 of the first flag word), read once
        #: here: every queue the message reaches asks it (a per-message TTL)
        self.expiring: int = props_raw[0] & 0x01 if props_raw else 0
        self.body = body
        #: who published it, for no-local: a local connection id (0 = the broker),
        #: or "spid/connection" when it came from another server of the cluster
        self.publisher = publisher
        #: the publisher's channel number: with ``publisher`` the message's Cluster-Id
        self.channel = channel
        #: for a copy delivered by another server (a proxied consumer or get): that
        #: server's reference to the delivery, which acks and rejects travel back with
        self.ref: object = None
        self._properties: commands.Basic.Properties | None = None
        self._tail: bytes | None = None
        self._content: tuple[int, int, bytes] | None = None

    @classmethod
    def build(
        cls,
        exchange: str,
        routing_key: str,
        body: Body,
        properties: commands.Basic.Properties | None = None,
        publisher: int | str = 0,
    ) -> Message:
        """A message made by the broker itself (tests, dead letters, cluster relays)."""
        msg = cls(exchange, routing_key, codec.encode_properties(properties), body, publisher)
        msg._properties = properties
        return msg

    @property
    def properties(self) -> commands.Basic.Properties:
        if self._properties is None:
            self._properties = codec.decode_properties(self.props_raw)
        return self._properties

    @property
    def headers(self) -> dict[str, Any]:
        return self.properties.headers or {}

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def tail(self) -> bytes:
        """Exchange and routing key encoded once for every delivery of this message."""
        tail = self._tail
        if tail is None:
            tail = self._tail = codec.routing_tail(self.exchange, self.routing_key)
        return tail

    def content(self, channel: int, frame_max: int) -> bytes:
        """Header and body frames, cached for the last (channel, frame_max) asked.

        Only for bodies of at most ``codec.INLINE_BODY`` bytes (the cache would
        hold a second copy of a bigger one); larger ones go out as
        :meth:`content_parts`."""
        cached = self._content
        if cached is not None and cached[0] == channel and cached[1] == frame_max:
            return cached[2]
        frames = codec.content_frames(channel, self.props_raw, self.body, frame_max)
        self._content = (channel, frame_max, frames)
        return frames

    def content_parts(self, channel: int, frame_max: int) -> list[bytes | memoryview]:
        """Header and body frames as buffers that share the body (no copy, no cache)."""
        return codec.content_parts(channel, self.props_raw, self.body, frame_max)

    def __repr__(self) -> str:
        return f"<Message {self.exchange!r}/{self.routing_key!r} {len(self.body)}B>"
