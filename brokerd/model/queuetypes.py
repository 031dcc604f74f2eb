"""Queue types as a client names them (``x-queue-type``), RabbitMQ's way.

A queue is ``classic`` (RabbitMQ's default) or ``quorum``. On one broker both
are this broker's local queue; in a cluster the type says how a shared queue is
kept (docs/protocol.md, "Queue types"). What a declare may ask of each type
follows RabbitMQ 3.10.8, measured against it: each type understands a set of
x-arguments, and an argument RabbitMQ knows that the type does not is refused
(406) with RabbitMQ's text, as are a quorum queue that is transient, exclusive
or auto-delete, and a type this broker does not have. Arguments RabbitMQ does
not know pass, as they do there.
"""

from __future__ import annotations

from typing import Any

from brokerd.model.arguments import amqp_type_name
from brokerd.model.errors import precondition_failed

CLASSIC = "classic"
QUORUM = "quorum"
#: the types this broker has (RabbitMQ 3.10 also has ``stream``, which it has not)
QUEUE_TYPES = (CLASSIC, QUORUM)

#: the x-arguments each type understands (RabbitMQ 3.10.8)
TYPE_ARGUMENTS: dict[str, frozenset[str]] = {
    CLASSIC: frozenset(
        {
            "x-expires",
            "x-message-ttl",
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
            "x-max-length",
            "x-max-length-bytes",
            "x-max-priority",
            "x-overflow",
            "x-queue-mode",
            "x-single-active-consumer",
            "x-queue-type",
            "x-queue-master-locator",
            "x-queue-version",
        }
    ),
    QUORUM: frozenset(
        {
            "x-expires",
            "x-message-ttl",
            "x-dead-letter-exchange",
            "x-dead-letter-routing-key",
            "x-dead-letter-strategy",
            "x-max-length",
            "x-max-length-bytes",
            "x-max-in-memory-length",
            "x-max-in-memory-bytes",
            "x-overflow",
            "x-single-active-consumer",
            "x-queue-type",
            "x-quorum-initial-group-size",
            "x-delivery-limit",
            "x-queue-leader-locator",
        }
    ),
}
#: every x-argument RabbitMQ knows, the stream type's included: what a type does
#: not understand of these is refused
KNOWN_ARGUMENTS = frozenset().union(*TYPE_ARGUMENTS.values()) | {
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
}
#: the properties a quorum queue cannot have, in RabbitMQ's order and words
_QUORUM_PROPERTIES = ("non-durable", "exclusive-owner", "auto-delete")
DLX_STRATEGIES = ("at-most-once", "at-least-once")
#: RabbitMQ's module names, which its texts print
_MODULES = {CLASSIC: "rabbit_classic_queue", QUORUM: "rabbit_quorum_queue"}


def queue_type(arguments: dict[str, Any], default: str = CLASSIC) -> str:
    """The type a declare asks for: its ``x-queue-type``, else ``default``."""
    value = arguments.get("x-queue-type")
    return value if isinstance(value, str) and value else default


def reported_type(queue: Any) -> str:
    """A queue's type as brokers report it (dumps, ``ctl queues``, the console): how a
    cluster keeps a shared queue (its ``kind``), else the type its declare named."""
    return getattr(queue, "kind", None) or queue_type(queue.arguments)


def check_queue_type(
    name: str,
    vhost: str,
    *,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: dict[str, Any],
) -> str:
    """The declared queue's type, or a 406 with RabbitMQ's text."""
    where = f"for queue '{name}' in vhost '{vhost}'"
    raw = arguments.get("x-queue-type")
    if raw is not None:
        if isinstance(raw, bytes):
            raw = raw.decode("utf-8", "replace")
        if not isinstance(raw, str):
            raise precondition_failed(
                f"invalid arg 'x-queue-type' {where}: {{unacceptable_type,{amqp_type_name(raw)}}}"
            )
        if raw not in QUEUE_TYPES:
            raise precondition_failed(
                f"invalid arg 'x-queue-type' {where}: \"unsupported queue type '{raw}'\""
            )
    _check_values(where, arguments)
    kind = raw or CLASSIC
    if kind == QUORUM:
        for prop, has in zip(
            _QUORUM_PROPERTIES, (not durable, exclusive, auto_delete), strict=True
        ):
            if has:
                raise precondition_failed(f"invalid property '{prop}' {where}")
    understood = TYPE_ARGUMENTS[kind]
    for key in arguments:
        if key in KNOWN_ARGUMENTS and key not in understood:
            raise precondition_failed(f"invalid arg '{key}' {where} of queue type {_MODULES[kind]}")
    return kind


def _check_values(where: str, arguments: dict[str, Any]) -> None:
    size = arguments.get("x-quorum-initial-group-size")
    if size is not None:
        invalid = f"invalid arg 'x-quorum-initial-group-size' {where}"
        if isinstance(size, bool) or not isinstance(size, int):
            raise precondition_failed(f'{invalid}: "expected integer, got {amqp_type_name(size)}"')
        if size == 0:
            raise precondition_failed(f"{invalid}: {{value_zero,0}}")
        if size < 0:
            raise precondition_failed(f"{invalid}: {{value_negative,{size}}}")
    locator = arguments.get("x-queue-leader-locator")
    if locator is not None and not isinstance(locator, str | bytes):
        raise precondition_failed(
            f"invalid arg 'x-queue-leader-locator' {where}: "
            f"{{unacceptable_type,{amqp_type_name(locator)}}}"
        )
    strategy = arguments.get("x-dead-letter-strategy")
    if strategy is not None and strategy not in DLX_STRATEGIES:
        raise precondition_failed(
            f"invalid arg 'x-dead-letter-strategy' {where}: invalid_dlx_strategy"
        )
