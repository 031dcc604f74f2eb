"""The kinds of shared queue and how a declare picks one (RabbitMQ's
``rabbit_queue_type`` registry): its ``x-queue-type``, else the cluster's default,
else replicated when durable and classic when transient. Each kind is a module
(``classic``, ``replicated``, ``quorum``) and a ``SharedQueue`` subclass."""

from __future__ import annotations

from collections.abc import Mapping

from brokerd.cluster.queues.classic import ClassicQueue
from brokerd.cluster.queues.quorum import QuorumQueue
from brokerd.cluster.queues.replicated import ReplicatedQueue
from brokerd.cluster.queues.shared import SharedQueue

CLASSIC = ClassicQueue.kind
QUORUM = QuorumQueue.kind
#: a durable shared queue declared without a type: replicated to every primary
REPLICATED = ReplicatedQueue.kind

#: every kind, by the name ``x-queue-type`` (or the cluster's default) gives it
KINDS: dict[str, type[SharedQueue]] = {
    kind.kind: kind for kind in (ClassicQueue, ReplicatedQueue, QuorumQueue)
}


def kind_of(durable: bool, arguments: Mapping[str, object], default: str | None = None) -> str:
    """How the cluster keeps a shared queue: the type its declare names; else the
    vhost's ``default`` (a transient queue cannot be quorum: classic then); else
    replicated if durable (no confirmed message lost with any one server) and
    classic if transient (RPC replies, results: on their owner alone)."""
    named = arguments.get("x-queue-type")
    if isinstance(named, bytes):
        named = named.decode("utf-8", "replace")
    if named == CLASSIC:
        return CLASSIC
    if named == QUORUM:
        return QUORUM
    if default == QUORUM:
        return QUORUM if durable else CLASSIC
    if default in (CLASSIC, REPLICATED):
        return default
    return REPLICATED if durable else CLASSIC


def kind(durable: bool, arguments: Mapping[str, object], default: str | None) -> type[SharedQueue]:
    """The kind (class) a declare makes."""
    return KINDS[kind_of(durable, arguments, default)]
