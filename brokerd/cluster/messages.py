"""Cluster control messages: versioned JSON bodies on the cluster exchange.

Each message is published on a link to the ``amq.rookery.cluster``
exchange of the peer's cluster vhost, with the message type as routing key.
docs/protocol.md documents every field.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

VERSION = 1
CLUSTER_EXCHANGE = "amq.rookery.cluster"
STATUS = "cluster.status"
ROOT = "cluster.root"
#: messages that take a link's control lane: they never wait behind data
CONTROL_KINDS = frozenset({STATUS, ROOT})
#: client property carrying a link's identity (a table)
LINK_PROPERTY = "rookery_link"


class MessageError(ValueError):
    """A cluster message that cannot be understood."""


@dataclass
class Status:
    """Cluster.Status, sent to every linked peer each heartbeat interval (the root:
    twice an interval), at once when the sender's vote, role or root changes, and
    in answer to a status that asks for one."""

    spid: str
    type: str
    start_time: float
    checksum: str
    root_enabled: bool
    vote: str | None
    is_root: bool
    listed: bool
    address: str
    #: spids this server currently sees as active
    peers: list[str] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)
    #: sequence number of the last wiring entry it applied (the root's: the latest)
    state_seq: int = 0
    #: the root whose state log that is (itself, if root; None: not synced yet): the
    #: election prefers the server furthest along the last root's log
    state_source: str | None = None
    #: the term of that root (``terms.py``): logs rank by (state_term, state_seq)
    state_term: int = 0
    #: the sender's term, and whom it backs in it (the root: itself; a root acts only
    #: while a majority back it in its term)
    term: int = 0
    term_for: str | None = None
    sent_at: float = 0.0
    #: per peer spid: (that peer's latest ``sent_at``, seconds we held it) for round trips
    #: and for the root's lease (a follower's echo proves it heard the root then)
    echo: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: the root the sender recognises (None: none)
    root: str | None = None
    #: the sender's copy of the shared queues is not known whole (a snapshot under
    #: way, an event missed, none taken yet): the election prefers one whose copy is
    syncing: bool = True
    #: the root whose replication stream the sender's copy follows (itself, if root)
    copy_source: str | None = None
    #: the last event of that stream it applied: the election prefers the furthest
    copy_seq: int = 0
    #: per fenced owner that still owns queues: the sender's copies of them,
    #: ``[synced, applied]`` by queue name; the key says it applied the fence
    #: (the root fails the owner's queues over once enough have)
    fenced: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    #: the sender recovered shared wiring from its disk when it started: after a
    #: whole-cluster restart the root must be one that did, or the others, syncing
    #: from an empty log, drop every queue (``election.choose``)
    holds_state: bool = False
    #: per queue that waits for its last owner after a whole-cluster restart (no
    #: owner, a home): the highest message id in the sender's recovered copy (0: an
    #: empty one; -1: none). Ids grow along the queue's history, so the highest copy
    #: holds every message a lower one holds, or saw it settled (``placing.Placer``)
    recovered: dict[str, int] = field(default_factory=dict)
    #: answer with a status at once (a root renewing its lease, a server checking
    #: whether others still hear the root); an answer never asks back
    reply: bool = False
    #: the sender is on its way out (a planned stop): no queue is moved to it
    stopping: bool = False
    #: a worker of a host in a cluster of hosts: the host's id for this start, and
    #: its client address (what clients are told to reconnect to); "" otherwise
    host: str = ""
    host_address: str = ""
    #: and its index among its host's workers
    worker: int = 0
    #: the node its data directory keeps (``knownhosts.node_id``): a forgotten
    #: server is known by it when it returns
    node: str = ""
    #: the cluster's members as the sender holds them (``KnownHosts.to_dict``; empty:
    #: the cluster file's set): every server takes the latest it hears
    members: dict[str, Any] = field(default_factory=dict)


@dataclass
class Root:
    """Cluster.Root: the sender has become root (or, with ``is_root`` false, stepped down)."""

    spid: str
    is_root: bool
    reason: str = ""


KINDS: dict[str, type] = {STATUS: Status, ROOT: Root}


def encode(message: Status | Root) -> tuple[str, bytes]:
    kind = STATUS if isinstance(message, Status) else ROOT
    return kind, json.dumps({"v": VERSION, **asdict(message)}).encode()


def decode(kind: str, body: bytes) -> Status | Root:
    cls = KINDS.get(kind)
    if cls is None:
        raise MessageError(f"unknown cluster message {kind!r}")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise MessageError(f"{kind}: body is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.pop("v", None) != VERSION:
        raise MessageError(f"{kind}: unsupported version (this server speaks v{VERSION})")
    known = cls.__dataclass_fields__
    try:
        message = cls(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise MessageError(f"{kind}: {exc}") from None
    if isinstance(message, Status):
        message.echo = _echo(kind, message.echo)
        if message.root is not None and not isinstance(message.root, str):
            raise MessageError(f"{kind}: root must be a spid or null")
        if not isinstance(message.reply, bool):
            raise MessageError(f"{kind}: reply must be a boolean")
        if not isinstance(message.syncing, bool):
            raise MessageError(f"{kind}: syncing must be a boolean")
        if not isinstance(message.stopping, bool):
            raise MessageError(f"{kind}: stopping must be a boolean")
        if not isinstance(message.holds_state, bool):
            raise MessageError(f"{kind}: holds_state must be a boolean")
        if not isinstance(message.host, str) or not isinstance(message.host_address, str):
            raise MessageError(f"{kind}: host and host_address must be strings")
        if not isinstance(message.node, str) or not isinstance(message.members, dict):
            raise MessageError(f"{kind}: node must be a string and members an object")
        if not isinstance(message.worker, int) or isinstance(message.worker, bool):
            raise MessageError(f"{kind}: worker must be an integer")
        for name in ("term", "state_term"):
            value = getattr(message, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise MessageError(f"{kind}: {name} must be a count")
        if message.term_for is not None and not isinstance(message.term_for, str):
            raise MessageError(f"{kind}: term_for must be a spid or null")
        # a place in a root's stream: the state log's, the shared queues' copy's
        _place(kind, "state", message.state_source, message.state_seq)
        _place(kind, "copy", message.copy_source, message.copy_seq)
        message.fenced = _fenced(kind, message.fenced)
        message.recovered = _recovered(kind, message.recovered)
    return message


def _place(kind: str, name: str, source: Any, seq: Any) -> None:
    """``<name>_source`` (a spid or null) and ``<name>_seq`` (a count) of a status."""
    if source is not None and not isinstance(source, str):
        raise MessageError(f"{kind}: {name}_source must be a spid or null")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise MessageError(f"{kind}: {name}_seq must be a non-negative integer")


def _recovered(kind: str, value: Any) -> dict[str, int]:
    """Recovered copies: {queue: highest message id}; anything else is an error."""
    if not isinstance(value, dict):
        raise MessageError(f"{kind}: recovered must be an object")
    for name, top in value.items():
        if not isinstance(top, int) or isinstance(top, bool) or top < -1:
            raise MessageError(f"{kind}: recovered copy of {name!r} must be a message id")
    return {str(name): top for name, top in value.items()}


def _fenced(kind: str, value: Any) -> dict[str, dict[str, list[Any]]]:
    """Fenced copies: {spid: {queue: [synced, applied]}}; anything else is an error."""
    if not isinstance(value, dict):
        raise MessageError(f"{kind}: fenced must be an object")
    out: dict[str, dict[str, list[Any]]] = {}
    for spid, copies in value.items():
        if not isinstance(copies, dict):
            raise MessageError(f"{kind}: fenced copies must be an object")
        for name, pair in copies.items():
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not isinstance(pair[0], bool)
                or not isinstance(pair[1], int)
                or isinstance(pair[1], bool)
                or pair[1] < 0
            ):
                raise MessageError(f"{kind}: fenced copy of {name!r} must be [synced, applied]")
        out[str(spid)] = {str(name): list(pair) for name, pair in copies.items()}
    return out


def _echo(kind: str, value: Any) -> dict[str, tuple[float, float]]:
    """Round-trip echoes are optional; a malformed one is an error like any field."""
    if not isinstance(value, dict):
        raise MessageError(f"{kind}: echo must be an object")
    try:
        return {str(spid): (float(pair[0]), float(pair[1])) for spid, pair in value.items()}
    except (TypeError, ValueError, IndexError) as exc:
        raise MessageError(f"{kind}: bad echo: {exc}") from None
