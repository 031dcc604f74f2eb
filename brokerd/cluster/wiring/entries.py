"""Wiring replication: turning AMQP methods into state-log entries and back.

A replicated change travels as a *bucket*: a small JSON header (sequence
number, request id, origin, vhost) followed by the encoded AMQP method
frame payload, exactly as a client sent it (seed 000's "binary bucket").
Every server applies entries to its own broker model in sequence order
with ``apply_entry``, the same code path the root used to validate them.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any, Protocol

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.cluster.knownhosts import KnownHosts, MembershipError
from brokerd.cluster.wiring import statelog as sl
from brokerd.cluster.wiring.statelog import Entry, freeze
from brokerd.model.broker import Broker
from brokerd.model.errors import AMQPError, not_found
from brokerd.model.interfaces import Destination
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


#: ``queue.place`` entries a server sends the root to ask for a move (``props.request``):
#: the root checks them and orders the placement they lead to instead
MOVE = "move"
MOVED = "moved"


class BucketError(ValueError):
    """A replication message that cannot be decoded."""


def method_payload(method: Method) -> bytes:
    """The method frame payload (class id, method id, fields) of a pamqp method."""
    return struct.pack("!HH", method.index >> 16, method.index & 0xFFFF) + method.marshal()


def entry_for(
    method: Method, vhost: str, *, seq: int = 0, origin: str = "", meta_spid: str = ""
) -> Entry:
    """The state-log entry a wiring method makes (``meta_spid``: a private queue's
    binding, or a shared queue's owner on its declare)."""
    op = OPERATIONS[type(method)]
    if meta_spid and op in (sl.QUEUE_BIND, sl.QUEUE_UNBIND):
        op = sl.META_BIND if op == sl.QUEUE_BIND else sl.META_UNBIND
    frame = getattr(method, "raw_payload", None) or method_payload(method)
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
        # ``meta_spid`` is its owner here: set by the root for a queue with one of its own
        return Entry(
            seq, op, vhost, method.queue, props=props, spid=meta_spid, frame=frame, origin=origin
        )
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


class RemoteQueues(Protocol):
    """The stand-ins for other servers' private queues that meta-bindings bind."""

    def get(self, spid: str, queue: str) -> Destination:
        """The stand-in for ``queue`` on ``spid`` (made on first use)."""

    def find(self, spid: str, queue: str) -> Destination | None: ...

    def of(self, spid: str) -> list[Destination]:
        """Every stand-in for a queue of ``spid``."""

    def drop(self, destination: Destination) -> None: ...


#: what applying an entry changed, and the result its requester's -Ok needs:
#: [messages, consumers] for queue.declare, [messages] for queue.delete
Applied = tuple[bool, list[int] | None]


def apply_entry(
    broker: Broker, entry: Entry, *, own_spid: str = "", remote: RemoteQueues | None = None
) -> Applied:
    """Apply a replicated change to the local model; raises AMQPError if it cannot be.

    Entries are applied by the root first (validating them) and then by every
    server from the ordered stream; declaring what exists or deleting what is
    gone changes nothing, so a replayed entry is harmless."""
    vhost = broker.vhosts.get(entry.vhost)
    if vhost is None:
        raise not_found(f"vhost '{entry.vhost}' not found")
    if entry.op in (sl.META_BIND, sl.META_UNBIND, sl.SERVER_GONE):
        return _apply_meta(vhost, entry, own_spid, remote)
    if entry.op == sl.QUEUE_PLACE:
        return apply_placement(vhost, entry), None
    if entry.op == sl.QUEUE_GROUP:
        return apply_group(vhost, entry), None
    m = codec.decode_method(entry.frame)
    if isinstance(m, commands.Exchange.Declare):
        _exchange, created = vhost.declare_exchange(
            m.exchange,
            m.exchange_type or "direct",
            durable=m.durable,
            auto_delete=m.auto_delete,
            internal=m.internal,
            arguments=m.arguments or {},
        )
        return created, None
    if isinstance(m, commands.Exchange.Delete):
        return vhost.delete_exchange(m.exchange, if_unused=m.if_unused) is not None, None
    if isinstance(m, commands.Queue.Declare):
        queue, created = vhost.declare_queue(
            m.queue,
            connection_id=0,
            durable=m.durable,
            exclusive=False,
            auto_delete=m.auto_delete,
            arguments=m.arguments or {},
            reserved_ok=m.queue.startswith("amq.gen-"),
        )
        if placed_by(entry):  # its owner (one recovered from disk is placed now, too)
            apply_placement(vhost, entry)
        return created, [queue.message_count, queue.consumer_count]
    if isinstance(m, commands.Queue.Delete):
        existed = m.queue in vhost.queues
        count = vhost.delete_queue(m.queue, if_unused=m.if_unused, if_empty=m.if_empty)
        return existed, [count]
    if isinstance(m, commands.Queue.Unbind) and (
        m.queue not in vhost.queues or m.exchange not in vhost.exchanges
    ):
        # RabbitMQ: the binding went with its queue or exchange, so unbind-ok. An
        # auto-delete queue whose last consumer was cancelled through another
        # server is gone here before that server's unbind arrives (aio-pika's
        # RPC.close() cancels, then unbinds), as a single broker answers too
        return False, None
    if isinstance(m, commands.Queue.Bind | commands.Queue.Unbind):
        queue = vhost.queue(m.queue)
        source = vhost.exchange(m.exchange)
        before = len(queue.bindings)
        op = vhost.bind if isinstance(m, commands.Queue.Bind) else vhost.unbind
        op(source, queue, m.routing_key, m.arguments or {})
        return len(queue.bindings) != before, None
    if isinstance(m, commands.Exchange.Bind | commands.Exchange.Unbind):
        source = vhost.exchange(m.source)
        before = len(source.bindings)
        op = vhost.bind if isinstance(m, commands.Exchange.Bind) else vhost.unbind
        op(source, vhost.exchange(m.destination), m.routing_key, m.arguments or {})
        return len(source.bindings) != before, None
    raise ValueError(f"not a replicated method: {m.name}")  # pragma: no cover


def placed_by(entry: Entry) -> bool:
    """A queue's declare that places it: it names the owner, or (a queue recovered
    after a whole-cluster restart) the address of the owner it waits for."""
    return bool(entry.spid or dict(entry.props).get("home"))


def apply_placement(vhost: Any, entry: Entry) -> bool:
    """A shared queue's owner, from its declare or a ``queue.place`` entry: the queue
    takes its role (``SharedQueue.place``)."""
    queue = vhost.queues.get(entry.name)
    place = getattr(queue, "place", None)
    if place is None:
        return False
    props = dict(entry.props)
    group = props.get("group")
    if entry.op == sl.QUEUE_DECLARE and group and getattr(queue, "group", None) is None:
        queue.group = tuple(group)  # set once, by the declare that placed it
    place(
        entry.spid or None,
        int(props.get("epoch", 1)),
        props.get("home") or None,
        entry.seq,
        props.get("to") or None,
    )
    return True


def apply_group(vhost: Any, entry: Entry) -> bool:
    """A quorum queue's new group (``queue.group``): the queue takes it (``regroup``)."""
    queue = vhost.queues.get(entry.name)
    regroup = getattr(queue, "regroup", None)
    group = dict(entry.props).get("group")
    if regroup is None or not group or tuple(group) == queue.group:
        return False
    regroup(tuple(group))
    return True


def group_entry(vhost: str, name: str, group: tuple[str, ...]) -> Entry:
    """The state-log entry that gives quorum queue ``name`` the group ``group``."""
    return Entry(0, sl.QUEUE_GROUP, vhost, name, props=freeze({"group": list(group)}))


def group_request(vhost: str, name: str, action: str, address: str, origin: str) -> Entry:
    """What a server asks of the root to take ``address`` into (``action`` "grow") or
    out of ("shrink") quorum queue ``name``'s group."""
    props = freeze({"request": action, "address": address})
    return Entry(0, sl.QUEUE_GROUP, vhost, name, props=props, origin=origin)


def place_entry(
    vhost: str,
    name: str,
    owner: str | None,
    epoch: int,
    home: str | None,
    to: str | None = None,
) -> Entry:
    """The state-log entry that gives queue ``name`` its owner (None: unavailable);
    ``to``: the owner stays and hands the queue to that primary (``handover``)."""
    props: dict[str, Any] = {"epoch": epoch}
    if home:
        props["home"] = home
    if to:
        props["to"] = to
    return Entry(0, sl.QUEUE_PLACE, vhost, name, props=freeze(props), spid=owner or "")


def bridge_place_entry(vhost: str, name: str, spid: str, epoch: int) -> Entry:
    """The state-log entry that runs bridge ``name`` on server ``spid``."""
    return Entry(0, sl.BRIDGE_PLACE, vhost, name, props=freeze({"epoch": epoch}), spid=spid)


def move_request(vhost: str, name: str, to: str, origin: str) -> Entry:
    """What a server asks of the root to move queue ``name`` to primary ``to``."""
    props = freeze({"request": MOVE})
    return Entry(0, sl.QUEUE_PLACE, vhost, name, props=props, spid=to, origin=origin)


def moved_request(vhost: str, name: str, to: str, epoch: int, origin: str) -> Entry:
    """What an owner asks of the root once ``to`` holds all of queue ``name`` (the
    move it was ordered at ``epoch``): the placement there."""
    props = freeze({"request": MOVED, "epoch": epoch})
    return Entry(0, sl.QUEUE_PLACE, vhost, name, props=props, spid=to, origin=origin)


def _apply_meta(vhost: Any, entry: Entry, own_spid: str, remote: RemoteQueues | None) -> Applied:
    """Meta-bindings: on every server but the private queue's own, the exchange is
    bound to a stand-in that forwards matching messages to that server."""
    if remote is None or entry.spid == own_spid:
        return False, None  # the server holding the queue has the real binding
    if entry.op == sl.SERVER_GONE:
        changed = False
        for destination in remote.of(entry.spid):
            for binding in list(destination.bindings.values()):
                vhost.unbind(binding.source, destination, binding.routing_key, binding.arguments)
                changed = True
            if vhost.elsewhere.get(destination.name) is destination:
                del vhost.elsewhere[destination.name]
                changed = True
            remote.drop(destination)
        return changed, None
    if entry.source == "":
        return _apply_default_meta(vhost, entry, remote), None
    source = vhost.exchanges.get(entry.source)
    if source is None:
        return False, None
    arguments = getattr(codec.decode_method(entry.frame), "arguments", None) or {}
    if entry.op == sl.META_BIND:
        destination = remote.get(entry.spid, entry.name)
        before = len(destination.bindings)
        vhost.bind(source, destination, entry.routing_key, arguments)
        return len(destination.bindings) != before, None
    found = remote.find(entry.spid, entry.name)
    if found is None:
        return False, None
    before = len(found.bindings)
    vhost.unbind(source, found, entry.routing_key, arguments)
    if not found.bindings and vhost.elsewhere.get(found.name) is not found:
        remote.drop(found)
    return len(found.bindings) != before, None


def _apply_default_meta(vhost: Any, entry: Entry, remote: RemoteQueues) -> bool:
    """A private queue's implicit binding to the default exchange, by its name: the
    default exchange takes no bindings, so the stand-in is named in ``elsewhere``."""
    if entry.op == sl.META_BIND:
        destination = remote.get(entry.spid, entry.name)
        changed = vhost.elsewhere.get(entry.name) is not destination
        vhost.elsewhere[entry.name] = destination
        return changed
    found = remote.find(entry.spid, entry.name)
    if found is None or vhost.elsewhere.get(entry.name) is not found:
        return False
    del vhost.elsewhere[entry.name]
    if not found.bindings:
        remote.drop(found)
    return True


def try_apply(
    broker: Broker, entry: Entry, *, own_spid: str = "", remote: RemoteQueues | None = None
) -> AMQPError | Applied:
    try:
        return apply_entry(broker, entry, own_spid=own_spid, remote=remote)
    except AMQPError as exc:
        return exc


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
    header = {
        "seq": entry.seq,
        "op": entry.op,
        "vhost": entry.vhost,
        "origin": entry.origin,
        "spid": entry.spid,
    }
    if entry.op in (sl.QUEUE_PLACE, sl.BRIDGE_PLACE, sl.QUEUE_GROUP):  # no method says these
        header["name"] = entry.name
        header["props"] = dict(entry.props)
    elif entry.op in (sl.SERVER_FENCE, sl.MEMBERS, sl.MEMBER_CHANGE):
        header["props"] = dict(entry.props)
    elif entry.op == sl.QUEUE_DECLARE:
        props = dict(entry.props)
        if home := props.get("home"):
            header["home"] = home  # a recovered queue waiting for its last owner
        if group := props.get("group"):
            header["group"] = list(group)  # a quorum queue's group, by address
    return header


def members_entry(vhost: str, known: KnownHosts, origin: str = "") -> Entry:
    """The state-log entry that sets the cluster's members to ``known``."""
    return Entry(0, sl.MEMBERS, vhost, props=freeze(known.to_dict()), origin=origin)


def member_change(vhost: str, action: str, host: str, node: str, origin: str) -> Entry:
    """A request to the root: admit (``join``) or forget (``forget``) ``host``."""
    props = freeze({"action": action, "host": host, "node": node})
    return Entry(0, sl.MEMBER_CHANGE, vhost, name=host, props=props, origin=origin)


def known_hosts_of(entry: Entry) -> KnownHosts:
    """The members a ``MEMBERS`` entry sets."""
    return KnownHosts.from_dict(dict(entry.props))


def _members_entry(header: dict[str, Any]) -> Entry:
    props = header.get("props")
    if not isinstance(props, dict):
        raise BucketError("bad members entry in bucket")
    op = str(header["op"])
    if op == sl.MEMBERS:
        try:
            props = KnownHosts.from_dict(props).to_dict()
        except MembershipError as exc:
            raise BucketError(str(exc)) from None
    elif props.get("action") not in ("join", "forget") or not all(
        isinstance(props.get(k), str) for k in ("host", "node")
    ):
        raise BucketError("bad member change in bucket")
    return Entry(
        int(header.get("seq", 0)),
        op,
        str(header.get("vhost", "/")),
        str(props.get("host", "")) if op == sl.MEMBER_CHANGE else "",
        props=freeze(props),
        origin=str(header.get("origin", "")),
    )


def entry_from_header(header: dict[str, Any], frame: bytes) -> Entry:
    """Rebuild an entry from a bucket header and its method frame."""
    op = header.get("op")
    if op == sl.SERVER_GONE:
        return Entry(int(header["seq"]), op, spid=str(header.get("spid", "")))
    if op == sl.BARRIER:
        return Entry(0, op, str(header.get("vhost", "/")), origin=str(header.get("origin", "")))
    if op == sl.SERVER_FENCE:
        props = header.get("props") or {}
        generation = props.get("generation", 1) if isinstance(props, dict) else None
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 1:
            raise BucketError("bad fence in bucket")
        return Entry(
            int(header["seq"]),
            op,
            str(header.get("vhost", "/")),
            props=freeze({"generation": generation}),
            spid=str(header.get("spid", "")),
        )
    if op in (sl.MEMBERS, sl.MEMBER_CHANGE):
        return _members_entry(header)
    if op in (sl.QUEUE_PLACE, sl.BRIDGE_PLACE, sl.QUEUE_GROUP):
        props = header.get("props") or {}
        if not isinstance(props, dict):
            raise BucketError("bad placement in bucket")
        return Entry(
            int(header["seq"]),
            op,
            str(header.get("vhost", "/")),
            str(header.get("name", "")),
            props=freeze(props),
            spid=str(header.get("spid", "")),
            origin=str(header.get("origin", "")),
        )
    try:
        method = codec.decode_method(frame)
    except Exception as exc:
        raise BucketError(f"bad method frame in bucket: {exc}") from None
    if type(method) not in OPERATIONS:
        raise BucketError(f"{method.name} is not a replicated method")
    method.raw_payload = frame
    entry = entry_for(
        method,
        str(header.get("vhost", "/")),
        seq=int(header.get("seq", 0)),
        origin=str(header.get("origin", "")),
        meta_spid=str(header.get("spid", "")),
    )
    home = header.get("home")
    if home is not None:
        if not isinstance(home, str) or entry.op != sl.QUEUE_DECLARE:
            raise BucketError("bad home in bucket")
        entry = dataclasses.replace(entry, props=freeze(dict(entry.props) | {"home": home}))
    group = header.get("group")
    if group is not None:
        if (
            not isinstance(group, list)
            or not group
            or not all(isinstance(a, str) and a for a in group)
            or entry.op != sl.QUEUE_DECLARE
        ):
            raise BucketError("bad group in bucket")
        entry = dataclasses.replace(entry, props=freeze(dict(entry.props) | {"group": group}))
    return entry
