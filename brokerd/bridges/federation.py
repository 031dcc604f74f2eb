"""Federation links, sans I/O: what one link declares upstream, how it changes what it
carries, and which bindings it must add or remove there.

A federation link is a shovel with a fixed shape (``bridges.federated`` runs
it):

- *exchange* ``X`` federated from an upstream: on the upstream, an internal
  exchange ``federation: X -> DOWNSTREAM`` of type ``x-federation-upstream``
  (its ``x-max-hops`` and ``x-downstream-name`` stop loops there, before a
  message crosses the WAN: ``model.muxers.federation``), bound to the
  upstream's exchange with each binding key ``X`` has here, and a queue of the
  same name bound to it (``expires`` and ``message-ttl`` bound its life and
  its messages' while the link is down). What arrives is published to ``X``
  here, with its routing key;
- *queue* ``Q`` federated from an upstream: the upstream's queue is consumed
  only while ``Q`` has consumers here and nothing ready for them, and what
  arrives is published to ``Q``.

Either way the message gains an ``x-received-from`` entry (newest first):
``uri`` (no password), ``exchange`` or ``queue``, ``redelivered``, and the
upstream's ``cluster-name`` and ``vhost``, as RabbitMQ's links add it. Acknowledgement
follows the upstream's ``ack-mode`` through the shovel's ``Transfer``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from brokerd.bridges.client import Long
from brokerd.bridges.definitions import Endpoint, ShovelDefinition
from brokerd.bridges.transfer import REDELIVERED, Delivery, Publish, Transfer
from brokerd.bridges.upstreams import Upstream
from brokerd.bridges.uri import AmqpUri
from brokerd.wire import codec

#: RabbitMQ's names, which the upstream's ``x-federation-upstream`` exchange reads
#: (``model.muxers.federation``, on the far side of the wire from here)
MAX_HOPS = "x-max-hops"
DOWNSTREAM_NAME = "x-downstream-name"
DOWNSTREAM_VHOST = "x-downstream-vhost"
RECEIVED_FROM = "x-received-from"
EXCHANGE = "exchange"
QUEUE = "queue"
#: the internal exchange's type on the upstream
UPSTREAM_TYPE = "x-federation-upstream"
#: a trail longer than this is cut on the way through (max-hops bounds it anyway)
TRAIL_MAX = 256


@dataclass(frozen=True)
class LinkSpec:
    """One link: ``kind`` object ``name`` of ``vhost`` here, from ``upstream``'s
    ``source`` (its exchange or queue), for the downstream named ``downstream``."""

    kind: str
    vhost: str
    name: str
    upstream: Upstream
    source: str
    downstream: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.vhost, self.kind, self.name, self.upstream.name)

    @property
    def internal(self) -> str:
        """The internal exchange's and queue's name on the upstream (an exchange
        link's; a queue link consumes the upstream's queue itself)."""
        where = "" if self.vhost == "/" else f" {self.vhost}"
        return f"federation: {self.name} -> {self.downstream}{where}"

    def upstream_exchange_args(self) -> dict[str, Any]:
        return {
            MAX_HOPS: Long(self.upstream.max_hops),  # RabbitMQ wants it `long` exactly
            DOWNSTREAM_NAME: self.downstream,
            DOWNSTREAM_VHOST: self.vhost,
        }

    def upstream_queue_args(self) -> dict[str, Any]:
        """The internal queue's: ``expires`` and ``message-ttl`` (ms), as given."""
        args: dict[str, Any] = {}
        if self.upstream.expires is not None:
            args["x-expires"] = self.upstream.expires
        if self.upstream.message_ttl is not None:
            args["x-message-ttl"] = self.upstream.message_ttl
        return args

    def shovel(self) -> ShovelDefinition:
        """The shovel this link is: from the upstream's queue to the object here."""
        upstream = self.upstream
        local = (AmqpUri("amqp", vhost=self.vhost),)
        destination = (
            Endpoint(local, exchange=self.name)
            if self.kind == EXCHANGE
            else Endpoint(local, queue=self.name)
        )
        source_queue = self.internal if self.kind == EXCHANGE else self.source
        return ShovelDefinition(
            name=f"federation {self.kind} {self.name} from {upstream.name}",
            vhost=self.vhost,
            source=Endpoint(upstream.uris, queue=source_queue),
            destination=destination,
            ack_mode=upstream.ack_mode,
            prefetch=upstream.prefetch,
            reconnect_delay=upstream.reconnect_delay,
        )


#: a binding as the link mirrors it upstream: (routing key, its arguments as JSON)
BindingKey = tuple[str, str]


def binding_key(routing_key: str, arguments: dict[str, Any] | None) -> BindingKey:
    return (routing_key, json.dumps(arguments or {}, sort_keys=True, default=str))


def binding_arguments(key: BindingKey) -> dict[str, Any] | None:
    args = json.loads(key[1])
    return args or None


def binding_changes(
    bound: set[BindingKey], wanted: set[BindingKey]
) -> tuple[list[BindingKey], list[BindingKey]]:
    """What to bind and what to unbind upstream so that it holds ``wanted``."""
    return sorted(wanted - bound), sorted(bound - wanted)


class FederationTransfer(Transfer):
    """A shovel's transfer that publishes to the federated object with the
    message's own routing key and adds an ``x-received-from`` entry."""

    def __init__(self, spec: LinkSpec, node: str, clock: Callable[[], float] = time.time) -> None:
        super().__init__(spec.shovel(), node, clock)
        self.spec = spec
        #: the upstream's ``cluster_name`` (its connection.start), once connected
        self.upstream_name = ""
        #: the URI the session connected to (the entry names it, without password)
        self.upstream_uri = spec.upstream.uris[0]

    def _publish(self, delivery: Delivery) -> Publish:
        spec = self.spec
        if spec.kind == EXCHANGE:
            exchange, key = spec.name, delivery.routing_key
        else:
            exchange, key = "", spec.name
        props = codec.decode_properties(delivery.properties)
        headers = dict(props.headers or {})
        entry = {
            "uri": self.upstream_uri.redacted,
            spec.kind: spec.source,
            "redelivered": delivery.redelivered,
            "cluster-name": self.upstream_name,
            "vhost": self.upstream_uri.vhost,
        }
        earlier = headers.get(RECEIVED_FROM)
        trail = list(earlier)[: TRAIL_MAX - 1] if isinstance(earlier, list) else []
        headers[RECEIVED_FROM] = [entry, *trail]
        if delivery.redelivered:
            headers[REDELIVERED] = True
        props.headers = headers
        if not spec.upstream.trust_user_id:
            # RabbitMQ's default: a user-id set upstream names a user of that broker,
            # which the republish here cannot vouch for
            props.user_id = None
        seq = self.next_seq
        self.next_seq += 1
        return Publish(seq, exchange, key, delivery.body, codec.encode_properties(props))
