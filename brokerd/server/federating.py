"""The server's side of federation (``brokerd.bridges.federation_service``): what
its links read of the broker, the name its upstreams know it by, and ``brokerd
ctl federation``.

Links reach this broker as bridges do, over its own listener with the bridge
login (``bridging``). Standalone, every link runs here; in a cluster, on the
root while it acts as root, so each link runs once and moves with the root.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from brokerd.bridges.federation import BindingKey, binding_key
from brokerd.bridges.federation_service import (
    KINDS,
    FederationError,
    FederationService,
    Objects,
)
from brokerd.model.muxers.federation import FederationUpstreamMuxer
from brokerd.server import bridging
from brokerd.server.control import ControlError

if TYPE_CHECKING:
    from brokerd.server.app import Server


def start(server: Server) -> FederationService:
    """The server's federation service, its saved definitions loaded."""
    cache: dict[tuple[str, str], tuple[int, int, set[BindingKey]]] = {}

    def vhost(name: str) -> Any:
        return server.broker.vhosts.get(name)

    def exchanges(name: str) -> list[str]:
        vh = vhost(name)
        if vh is None:
            return []
        return [
            x.name
            for x in vh.exchanges.values()
            if x.name and not x.internal and not isinstance(x.muxer, FederationUpstreamMuxer)
        ]

    def queues(name: str) -> list[str]:
        vh = vhost(name)
        return [] if vh is None else [q.name for q in vh.queues.values() if not q.exclusive]

    def keys(name: str, exchange: str) -> set[BindingKey]:
        """The exchange's binding keys, read again only after its bindings changed."""
        vh = vhost(name)
        x = vh.exchanges.get(exchange) if vh is not None else None
        if x is None:
            return set()
        held = cache.get((name, exchange))
        if held is not None and held[:2] == (id(x), x.bindings_version):
            return held[2]
        found = {binding_key(b.routing_key, b.arguments) for b in x.bindings.values()}
        cache[(name, exchange)] = (id(x), x.bindings_version, found)
        return found

    def demand(name: str, queue: str) -> tuple[int, int]:
        vh = vhost(name)
        q = vh.queues.get(queue) if vh is not None else None
        return (0, 0) if q is None else (q.consumer_count, q.message_count)

    service = FederationService(
        server.options.data_dir / "federation.json",
        node=server.spid,
        downstream=str(server.server_properties()["cluster_name"]),
        local=lambda: bridging.local_broker(server),
        objects=Objects(exchanges, queues, keys, demand),
    )
    server.resources.other_alarms.append(service.alarm)
    cluster = server.cluster
    if cluster is None:
        service.start()
        return service
    # a cluster's definitions come from its configuration document alone, and its
    # links run on the root while it acts as root
    service.refuse_ctl = (
        "in a cluster, federation is part of the configuration document"
        " (the console or the REST API)"
    )
    service.runs_here = lambda: cluster.current_root == cluster.spid and cluster.acting
    return service


def configure(
    server: Server,
    upstreams: list[dict[str, Any]] | None,
    policies: list[dict[str, Any]] | None,
) -> None:
    """The console document's ``federation_upstreams`` and ``policies`` parts."""
    if server.federation is not None:
        server.federation.configure(upstreams, policies)


async def control(server: Server, args: list[Any]) -> dict[str, Any]:
    """``brokerd ctl federation list|status|restart``, ``set KIND NAME JSON [VHOST]``,
    ``delete KIND NAME [VHOST]``; KIND is ``federation-upstream``,
    ``federation-upstream-set`` or ``policy``."""
    service = server.federation
    if service is None:
        raise ControlError("federation is not running on this server")
    if not args or not all(isinstance(a, str) for a in args):
        raise ControlError("federation takes list, status, set, delete or restart")
    verb, rest = args[0], args[1:]
    try:
        if verb == "list" and not rest:
            return {"definitions": service.list()}
        if verb == "status" and not rest:
            return {"links": service.status()}
        if verb == "restart" and not rest:
            return await service.restart()
        if verb == "set" and len(rest) in (3, 4):
            _kind(rest[0])
            try:
                value = json.loads(rest[2])
            except ValueError as exc:
                raise ControlError(f"the definition is not JSON: {exc}") from None
            return await service.set(rest[0], rest[1], value, rest[3] if len(rest) == 4 else "/")
        if verb == "delete" and len(rest) in (2, 3):
            _kind(rest[0])
            return await service.delete(rest[0], rest[1], rest[2] if len(rest) == 3 else "/")
    except FederationError as exc:
        raise ControlError(str(exc)) from None
    raise ControlError(f"bad arguments for 'federation': {verb} and {len(rest)} more")


def _kind(kind: str) -> None:
    if kind not in KINDS:
        raise ControlError(f"unknown kind '{kind}' (known: {', '.join(KINDS)})")
