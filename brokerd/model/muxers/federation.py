"""``x-federation-upstream``: the exchange a federation link declares on its upstream.

RabbitMQ's federation plugin, federating an exchange from this broker, declares
here an internal exchange of this type (``federation: X -> NODE``), binds it to
``X`` and consumes from a queue bound to it. It routes like ``fanout``, except
that a message that has already crossed ``x-max-hops`` links, or that came from
the very downstream this exchange feeds (named by ``x-downstream-name`` and
``x-downstream-vhost`` in an ``x-received-from`` entry), goes nowhere: the
loop and hop limits of federation live here, on the upstream side, as in
RabbitMQ (``rabbit_federation_upstream_exchange``).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brokerd.model.errors import precondition_failed
from brokerd.model.message import Message
from brokerd.model.muxers.base import register
from brokerd.model.muxers.fanout import FanoutMuxer

MAX_HOPS = "x-max-hops"
DOWNSTREAM_NAME = "x-downstream-name"
DOWNSTREAM_VHOST = "x-downstream-vhost"
#: the header federation links add: one table per link crossed, newest first
RECEIVED_FROM = "x-received-from"
#: more entries than any sane federation has hops: a longer header is not scanned
SCAN_LIMIT = 1024


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def should_forward(
    headers: dict[str, Any], max_hops: int, name: str | None, vhost: str | None
) -> bool:
    """False if the message crossed ``max_hops`` links already, or passed through the
    downstream ``name``/``vhost`` (it would come back to where it was)."""
    trail = headers.get(RECEIVED_FROM)
    if not isinstance(trail, list):
        return True
    if len(trail) >= max_hops:
        return False
    if name is None:
        return True
    for entry in trail[:SCAN_LIMIT]:
        if (
            isinstance(entry, dict)
            and _text(entry.get("cluster-name")) == name
            and (vhost is None or _text(entry.get("vhost")) == vhost)
        ):
            return False
    return True


@register
class FederationUpstreamMuxer(FanoutMuxer):
    type_name = "x-federation-upstream"

    def __init__(self, arguments: dict[str, Any]) -> None:
        hops = arguments.get(MAX_HOPS)
        if isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
            raise precondition_failed(
                f"exchange type 'x-federation-upstream' needs '{MAX_HOPS}',"
                " an integer of at least 1"
            )
        self.max_hops = hops
        self.downstream = _text(arguments.get(DOWNSTREAM_NAME))
        self.downstream_vhost = _text(arguments.get(DOWNSTREAM_VHOST))
        super().__init__(arguments)

    def route(self, message: Message) -> Collection[Any]:
        routes = self._routes
        if not routes:
            return ()
        if not should_forward(
            message.headers, self.max_hops, self.downstream, self.downstream_vhost
        ):
            return ()
        return routes
