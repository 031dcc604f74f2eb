"""Shovel definitions in the JSON of RabbitMQ's dynamic shovels.

A definition that ``rabbitmqctl set_parameter shovel NAME '...'`` accepts is
accepted here unchanged, with the same defaults: ``ack-mode`` ``on-confirm``,
``src-prefetch-count`` 1000, ``reconnect-delay`` 5 s, ``src-delete-after``
``never``, ``src-exchange-key`` ``#``, the message's own routing key at the
destination unless ``dest-exchange-key`` says otherwise. RabbitMQ's older key
names (``prefetch-count``, ``delete-after``, ``add-forward-headers``,
``publish-properties``) are read as their newer ones. Anything else is refused
with the key named (``DefinitionError.field``), so the API can answer 400 with
the field and a typo never turns into a silently different bridge.

Only AMQP 0-9-1 bridges exist here: ``src-protocol``/``dest-protocol`` may say
``amqp091`` and nothing else (RabbitMQ's ``amqp10`` is refused by name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from brokerd.bridges.uri import AmqpUri, UriError, parse_uris

ON_CONFIRM = "on-confirm"
ON_PUBLISH = "on-publish"
NO_ACK = "no-ack"
ACK_MODES = (ON_CONFIRM, ON_PUBLISH, NO_ACK)
NEVER = "never"
QUEUE_LENGTH = "queue-length"

DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5.0
#: a window beyond this buys nothing on any WAN and pins memory in both brokers
PREFETCH_MAX = 65535
RECONNECT_DELAY_MAX = 3600.0
#: names are RabbitMQ parameter names: printable, bounded (they show in pages and logs)
NAME_MAX = 255
_NAME = re.compile(r"^[^\x00-\x1f\x7f]+$")

#: the old key names RabbitMQ still reads, and the key each stands for
RENAMED = {
    "prefetch-count": "src-prefetch-count",
    "delete-after": "src-delete-after",
    "add-forward-headers": "dest-add-forward-headers",
    "add-timestamp-header": "dest-add-timestamp-header",
    "publish-properties": "dest-publish-properties",
    "publish-fields": "dest-publish-fields",
}
KEYS = (
    "src-protocol",
    "src-uri",
    "src-queue",
    "src-queue-args",
    "src-exchange",
    "src-exchange-key",
    "src-prefetch-count",
    "src-delete-after",
    "src-consumer-args",
    "dest-protocol",
    "dest-uri",
    "dest-queue",
    "dest-queue-args",
    "dest-exchange",
    "dest-exchange-key",
    "dest-add-forward-headers",
    "dest-add-timestamp-header",
    "dest-publish-properties",
    "ack-mode",
    "reconnect-delay",
)
#: message properties ``dest-publish-properties`` may set (pika/pamqp names)
PUBLISH_PROPERTIES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)


class DefinitionError(ValueError):
    """A definition that cannot run; ``field`` is the key at fault."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class Endpoint:
    """One side of a shovel: URIs, and a queue or an exchange with its key."""

    uris: tuple[AmqpUri, ...]
    queue: str | None = None
    exchange: str | None = None
    #: source: the binding key; destination: the routing key (None: the message's own)
    exchange_key: str | None = None
    #: arguments to declare the queue with (None: use the queue as it is, declare nothing)
    queue_args: dict[str, Any] | None = None

    @property
    def redacted(self) -> list[str]:
        return [uri.redacted for uri in self.uris]


@dataclass(frozen=True)
class ShovelDefinition:
    """One dynamic shovel, normalised (``document`` is what is stored and shown)."""

    name: str
    vhost: str
    source: Endpoint
    destination: Endpoint
    ack_mode: str = ON_CONFIRM
    prefetch: int = DEFAULT_PREFETCH
    reconnect_delay: float = DEFAULT_RECONNECT_DELAY
    #: ``never``, ``queue-length``, or a message count
    delete_after: str | int = NEVER
    add_forward_headers: bool = False
    add_timestamp_header: bool = False
    publish_properties: dict[str, Any] = field(default_factory=dict)
    consumer_args: dict[str, Any] = field(default_factory=dict)
    #: the definition's JSON with its old key names renamed, as sent (passwords too:
    #: it is what the configuration stores; ``public`` is what anyone may see)
    document: dict[str, Any] = field(default_factory=dict, repr=False)

    def public(self) -> dict[str, Any]:
        """The definition with every URI's password redacted."""
        out = dict(self.document)
        for key, endpoint in (("src-uri", self.source), ("dest-uri", self.destination)):
            redacted = endpoint.redacted
            out[key] = redacted if isinstance(self.document.get(key), list) else redacted[0]
        return out


def parse_name(raw: object) -> str:
    if not isinstance(raw, str) or not raw or len(raw) > NAME_MAX or not _NAME.match(raw):
        raise DefinitionError(
            "name", f"must be 1-{NAME_MAX} printable characters (no control characters)"
        )
    return raw


def parse_shovel(name: object, raw: object, vhost: str = "/") -> ShovelDefinition:
    """Check and normalise one definition (RabbitMQ's ``value`` of a ``shovel``
    parameter). ``DefinitionError`` names the first key at fault."""
    checked_name = parse_name(name)
    if not isinstance(raw, dict):
        raise DefinitionError("value", "a shovel definition must be a JSON object")
    doc: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise DefinitionError(str(key), "keys must be strings")
        new = RENAMED.get(key, key)
        if new not in KEYS:
            raise DefinitionError(key, f"unknown key (known: {', '.join(KEYS)})")
        if new in doc:
            raise DefinitionError(key, f"given twice (as {key!r} and its other name)")
        doc[new] = value
    for key in ("src-protocol", "dest-protocol"):
        if doc.get(key, "amqp091") != "amqp091":
            raise DefinitionError(key, "only amqp091 is supported (AMQP 0-9-1)")
    source = _endpoint(doc, "src")
    destination = _endpoint(doc, "dest")
    if source.queue is None and source.exchange is None:
        raise DefinitionError("src-queue", "a source needs src-queue or src-exchange")
    if source.queue is not None and source.exchange is not None:
        raise DefinitionError("src-exchange", "give src-queue or src-exchange, not both")
    if destination.queue is not None and destination.exchange is not None:
        raise DefinitionError("dest-exchange", "give dest-queue or dest-exchange, not both")
    if source.exchange is None and "src-exchange-key" in doc:
        raise DefinitionError("src-exchange-key", "needs src-exchange")
    if destination.queue is not None and "dest-exchange-key" in doc:
        raise DefinitionError("dest-exchange-key", "needs dest-exchange, not dest-queue")
    ack_mode = doc.get("ack-mode", ON_CONFIRM)
    if ack_mode not in ACK_MODES:
        raise DefinitionError("ack-mode", f"must be one of {', '.join(ACK_MODES)}")
    prefetch = integer_field(doc, "src-prefetch-count", DEFAULT_PREFETCH, 1, PREFETCH_MAX)
    delay = doc.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise DefinitionError("reconnect-delay", "must be a number of seconds")
    if not 0 <= delay <= RECONNECT_DELAY_MAX:
        raise DefinitionError("reconnect-delay", f"must be 0-{RECONNECT_DELAY_MAX:g} seconds")
    delete_after = doc.get("src-delete-after", NEVER)
    if delete_after not in (NEVER, QUEUE_LENGTH):
        if isinstance(delete_after, bool) or not isinstance(delete_after, int):
            raise DefinitionError(
                "src-delete-after", "must be 'never', 'queue-length' or a message count"
            )
        if delete_after < 0:
            raise DefinitionError("src-delete-after", "a message count cannot be negative")
    if delete_after == QUEUE_LENGTH and source.queue is None:
        raise DefinitionError("src-delete-after", "queue-length needs src-queue")
    properties = _object(doc, "dest-publish-properties")
    unknown = sorted(set(properties) - set(PUBLISH_PROPERTIES))
    if unknown:
        raise DefinitionError(
            "dest-publish-properties", f"unknown properties {', '.join(map(repr, unknown))}"
        )
    for prop, value in properties.items():
        if prop in ("delivery_mode", "priority"):
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255
        elif prop == "timestamp":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        else:
            ok = isinstance(value, str) and len(value.encode()) <= 255
        if not ok:
            raise DefinitionError(
                "dest-publish-properties", f"{prop}: not a valid value for that property"
            )
    return ShovelDefinition(
        name=checked_name,
        vhost=vhost,
        source=source,
        destination=destination,
        ack_mode=ack_mode,
        prefetch=prefetch,
        reconnect_delay=float(delay),
        delete_after=delete_after,
        add_forward_headers=_boolean(doc, "dest-add-forward-headers"),
        add_timestamp_header=_boolean(doc, "dest-add-timestamp-header"),
        publish_properties=properties,
        consumer_args=_object(doc, "src-consumer-args"),
        document=doc,
    )


def _endpoint(doc: dict[str, Any], side: str) -> Endpoint:
    key = f"{side}-uri"
    if key not in doc:
        raise DefinitionError(key, "is required")
    try:
        uris = parse_uris(doc[key], key)
    except UriError as exc:
        raise DefinitionError(key, str(exc).split(": ", 1)[-1]) from None
    queue = name_field(doc, f"{side}-queue")
    exchange = name_field(doc, f"{side}-exchange")
    exchange_key = name_field(doc, f"{side}-exchange-key")
    if side == "src" and exchange is not None and exchange_key is None:
        exchange_key = "#"
    args = doc.get(f"{side}-queue-args")
    if args is not None and not isinstance(args, dict):
        raise DefinitionError(f"{side}-queue-args", "must be a JSON object")
    if args is not None and queue is None:
        raise DefinitionError(f"{side}-queue-args", f"needs {side}-queue")
    return Endpoint(uris, queue, exchange, exchange_key, args)


def name_field(doc: dict[str, Any], key: str) -> str | None:
    """``doc[key]``, if given: a name of at most 255 bytes (an AMQP short string)."""
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value.encode()) > 255:
        raise DefinitionError(key, "must be a string of at most 255 bytes")
    return value


def integer_field(doc: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    """``doc[key]`` (default ``default``): an integer from ``low`` to ``high``."""
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise DefinitionError(key, f"must be an integer from {low} to {high}")
    return value


def _boolean(doc: dict[str, Any], key: str) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise DefinitionError(key, "must be true or false")
    return value


def _object(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise DefinitionError(key, "must be a JSON object")
    return dict(value)
