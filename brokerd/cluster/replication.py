"""Wiring replication: turning AMQP methods into state-log entries and back.

A replicated change travels as a *bucket*: a small JSON header (sequence
number, request id, origin, vhost) followed by the encoded AMQP method
frame payload, exactly as a client sent it (seed 000's "binary bucket").
Every server applies entries to its own broker model in sequence order
with ``apply_entry``, the same code path the root used to validate them.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.cluster import statelog as sl
from brokerd.cluster.statelog import Entry, freeze
from brokerd.model.broker import Broker
from brokerd.model.errors import AMQPError, not_found
from brokerd.wire import codec

BUCKET_MAGIC = b"RKB1"
_u32 = struct.Struct("!I")

#: methods that change the cluster state, and the state-log operation of each
OPERATIONS: dict[type, str] = {
    commands.Exchange.Declare: sl.EXCHANGE_DECLARE,
    commands.Exchange.Delete: sl.EXCHANGE_DELETE,
    commands.Exchange.Bind: sl.EXCHANGE_BIND,
    commands.Exchange.Unbind: sl.EXCHANGE_UNBIND,
    commands.Queue.Declare: sl.QUEUE_DECLARE,
    commands.Queue.Delete: sl.QUEUE_DELETE,
    commands.Queue.Bind: sl.QUEUE_BIND,
    commands.Queue.Unbind: sl.QUEUE_UNBIND,
}


class BucketError(ValueError):
    """A replication message that cannot be decoded."""


def method_payload(method: Method) -> bytes:
    """The method frame payload (class id, method id, fields) of a pamqp method."""
    return struct.pack("!HH", method.index >> 16, method.index & 0xFFFF) + method.marshal()


def entry_for(
    method: Method, vhost: str, *, seq: int = 0, origin: str = "", meta_spid: str = ""
) -> Entry:
    """The state-log entry a wiring method makes (``meta_spid``: a private queue's binding)."""
    op = OPERATIONS[type(method)]
    if meta_spid:
        op = sl.META_BIND if op == sl.QUEUE_BIND else sl.META_UNBIND
    frame = method_payload(method)
    args = freeze(getattr(method, "arguments", None) or {})
    if isinstance(method, commands.Exchange.Declare):
        props = freeze(
            {
                "type": method.exchange_type,
                "durable": method.durable,
                "auto_delete": method.auto_delete,
                "internal": method.internal,
                "arguments": method.arguments or {},
            }
        )
        return Entry(seq, op, vhost, method.exchange, props=props, frame=frame, origin=origin)
    if isinstance(method, commands.Exchange.Delete):
        return Entry(seq, op, vhost, method.exchange, frame=frame, origin=origin)
    if isinstance(method, commands.Queue.Declare):
        props = freeze(
            {
                "durable": method.durable,
                "auto_delete": method.auto_delete,
                "arguments": method.arguments or {},
            }
        )
        return Entry(seq, op, vhost, method.queue, props=props, frame=frame, origin=origin)
    if isinstance(method, commands.Queue.Delete):
        return Entry(seq, op, vhost, method.queue, frame=frame, origin=origin)
    if isinstance(method, commands.Queue.Bind | commands.Queue.Unbind):
        return Entry(
            seq,
            op,
            vhost,
            method.queue,
            method.exchange,
            method.routing_key,
            args,
            spid=meta_spid,
            frame=frame,
            origin=origin,
        )
    # exchange-to-exchange: the destination is the bound exchange
    return Entry(
        seq,
        op,
        vhost,
        method.destination,
        method.source,
        method.routing_key,
        args,
        frame=frame,
        origin=origin,
    )


def apply_entry(broker: Broker, entry: Entry) -> None:
    """Apply a replicated change to the local model; raises AMQPError if it cannot be."""
    if entry.op in (sl.META_BIND, sl.META_UNBIND, sl.SERVER_GONE):
        return  # meta-bindings live in the controller's table, not in the model
    vhost = broker.vhosts.get(entry.vhost)
    if vhost is None:
        raise not_found(f"vhost '{entry.vhost}' not found")
    m = codec.decode_method(entry.frame)
    if isinstance(m, commands.Exchange.Declare):
        vhost.declare_exchange(
            m.exchange,
            m.exchange_type or "direct",
            durable=m.durable,
            auto_delete=m.auto_delete,
            internal=m.internal,
            arguments=m.arguments or {},
        )
    elif isinstance(m, commands.Exchange.Delete):
        vhost.delete_exchange(m.exchange, if_unused=m.if_unused)
    elif isinstance(m, commands.Queue.Declare):
        vhost.declare_queue(
            m.queue,
            connection_id=0,
            durable=m.durable,
            exclusive=False,
            auto_delete=m.auto_delete,
            arguments=m.arguments or {},
        )
    elif isinstance(m, commands.Queue.Delete):
        vhost.delete_queue(m.queue, if_unused=m.if_unused, if_empty=m.if_empty)
    elif isinstance(m, commands.Queue.Bind):
        vhost.bind(
            vhost.exchange(m.exchange), vhost.queue(m.queue), m.routing_key, m.arguments or {}
        )
    elif isinstance(m, commands.Queue.Unbind):
        vhost.unbind(
            vhost.exchange(m.exchange), vhost.queue(m.queue), m.routing_key, m.arguments or {}
        )
    elif isinstance(m, commands.Exchange.Bind):
        vhost.bind(
            vhost.exchange(m.source),
            vhost.exchange(m.destination),
            m.routing_key,
            m.arguments or {},
        )
    elif isinstance(m, commands.Exchange.Unbind):
        vhost.unbind(
            vhost.exchange(m.source),
            vhost.exchange(m.destination),
            m.routing_key,
            m.arguments or {},
        )
    else:  # pragma: no cover - OPERATIONS lists every type above
        raise ValueError(f"not a replicated method: {m.name}")


def try_apply(broker: Broker, entry: Entry) -> AMQPError | None:
    try:
        apply_entry(broker, entry)
    except AMQPError as exc:
        return exc
    return None


# -- buckets ----------------------------------------------------------------------


def encode_bucket(header: dict[str, Any], frames: list[bytes]) -> bytes:
    """``RKB1`` | u32 header length | JSON header | frames, each u32-length prefixed."""
    raw = json.dumps({"v": 1, **header}).encode()
    parts = [BUCKET_MAGIC, _u32.pack(len(raw)), raw]
    for frame in frames:
        parts += (_u32.pack(len(frame)), frame)
    return b"".join(parts)


def decode_bucket(body: bytes) -> tuple[dict[str, Any], list[bytes]]:
    if body[:4] != BUCKET_MAGIC or len(body) < 8:
        raise BucketError("not a replication bucket")
    (size,) = _u32.unpack_from(body, 4)
    try:
        header = json.loads(body[8 : 8 + size])
    except ValueError as exc:
        raise BucketError(f"bad bucket header: {exc}") from None
    if not isinstance(header, dict) or header.get("v") != 1:
        raise BucketError("unsupported bucket version")
    frames = []
    pos = 8 + size
    while pos < len(body):
        if pos + 4 > len(body):
            raise BucketError("truncated bucket")
        (n,) = _u32.unpack_from(body, pos)
        frames.append(body[pos + 4 : pos + 4 + n])
        pos += 4 + n
        if pos > len(body):
            raise BucketError("truncated bucket frame")
    return header, frames


def entry_header(entry: Entry) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "op": entry.op,
        "vhost": entry.vhost,
        "origin": entry.origin,
        "spid": entry.spid,
    }


def entry_from_header(header: dict[str, Any], frame: bytes) -> Entry:
    """Rebuild an entry from a bucket header and its method frame."""
    op = header.get("op")
    if op == sl.SERVER_GONE:
        return Entry(int(header["seq"]), op, spid=str(header.get("spid", "")))
    try:
        method = codec.decode_method(frame)
    except Exception as exc:
        raise BucketError(f"bad method frame in bucket: {exc}") from None
    if type(method) not in OPERATIONS:
        raise BucketError(f"{method.name} is not a replicated method")
    return entry_for(
        method,
        str(header.get("vhost", "/")),
        seq=int(header.get("seq", 0)),
        origin=str(header.get("origin", "")),
        meta_spid=str(header.get("spid", "")),
    )
