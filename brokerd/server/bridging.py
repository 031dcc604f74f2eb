"""The server's side of its bridges (``brokerd.bridges``): where ``amqp://`` leads,
the login a local bridge uses, and ``brokerd ctl bridges``.

A bridge reaches this broker as any client does, over its own listener. Its
login is a user of the server's own making: a random 256-bit password that
lives only in this process, permitted on every vhost, so a definition saying
``amqp://`` needs no credentials (RabbitMQ's shovels use a direct connection
for the same purpose).
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING, Any

from brokerd.bridges.runner import LocalBroker
from brokerd.bridges.service import BridgeError, BridgeService, DefinitionFile
from brokerd.model.auth import IMPERSONATOR, Permission, User, hash_password
from brokerd.server.control import ControlError

if TYPE_CHECKING:
    from brokerd.server.app import Server

#: the user local bridges log in as (tags say what it is in connection lists)
BRIDGE_USER = "rookery-bridge"


def install_user(server: Server) -> None:
    """Add the bridge user, permitted on every vhost; again after each config reload
    (a reload swaps the user database whole, and may add vhosts)."""
    if not getattr(server, "_bridge_password", ""):
        server._bridge_password = secrets.token_urlsafe(32)
        server._bridge_password_hash = hash_password(server._bridge_password, iterations=1000)
    users = server.broker.users
    # an impersonator: a shovel or a trusting federation link republishes a user-id
    # that named a user where the message came from (RabbitMQ's direct connection)
    users.add_user(User(BRIDGE_USER, server._bridge_password_hash, ("bridge", IMPERSONATOR)))
    # the clustered vhost too: it is the clients' (its shared queues are what a
    # cluster's bridges move); the links log in with the cluster secret, not as users
    for vhost in server.broker.vhosts:
        users.set_permission(BRIDGE_USER, vhost, Permission())


def local_broker(server: Server) -> LocalBroker | None:
    """Where ``amqp://`` leads: this server's plain listener (None: it has none)."""
    if server.port is None:
        return None
    host = server.listeners.host()
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return LocalBroker(host, server.port, BRIDGE_USER, server._bridge_password)


def start(server: Server) -> BridgeService:
    """The server's bridge service. Standalone, the saved bridges start (until a
    console document with bridges rules); in a cluster, only the document's run,
    each on the server the root placed it on, while that server is linked to the
    root (a server cut off stops its bridges, as it stops confirming)."""
    install_user(server)
    service = BridgeService(
        DefinitionFile(server.options.data_dir / "bridges.json"),
        node=server.spid,
        local=lambda: local_broker(server),
    )
    server.resources.other_alarms.append(service.alarm)
    cluster = server.cluster
    if cluster is None:
        service.start()
        return service
    placements = cluster.bridges
    placements.wanted = service.wanted
    placements.on_change = service.reconcile

    def runs_here(key: tuple[str, str]) -> bool:
        root = cluster.current_root
        linked = root is not None and (root == cluster.spid or cluster.link_to(root) is not None)
        return linked and placements.here(key)

    service.runs_here = runs_here
    service.where = placements.where
    return service


def configure(server: Server, bridges: list[dict[str, Any]] | None) -> None:
    """The console document's ``bridges`` part (None: it has none)."""
    if server.bridges is not None:
        server.bridges.configure(bridges)


async def control(server: Server, args: list[Any]) -> dict[str, Any]:
    """``brokerd ctl bridges list|status|set NAME JSON [VHOST]|delete NAME|restart NAME``."""
    service = server.bridges
    if service is None:
        raise ControlError("bridges are not running on this server")
    if not args or not all(isinstance(a, str) for a in args):
        raise ControlError("bridges takes list, status, set, delete or restart")
    verb, rest = args[0], args[1:]
    try:
        if verb == "list" and not rest:
            return {"bridges": service.list()}
        if verb == "status" and not rest:
            return {"bridges": service.status()}
        if verb == "set" and len(rest) in (2, 3):
            if server.cluster is not None:
                raise ControlError(
                    "in a cluster, bridges are part of the configuration document"
                    " (the console or the REST API)"
                )
            try:
                value = json.loads(rest[1])
            except ValueError as exc:
                raise ControlError(f"the definition is not JSON: {exc}") from None
            return await service.set(rest[0], value, rest[2] if len(rest) == 3 else "/")
        if verb in ("delete", "restart") and len(rest) in (1, 2):
            vhost = rest[1] if len(rest) == 2 else "/"
            if verb == "delete":
                return await service.delete(rest[0], vhost)
            return await service.restart(rest[0], vhost)
    except BridgeError as exc:
        raise ControlError(str(exc)) from None
    raise ControlError(f"bad arguments for 'bridges': {verb} and {len(rest)} more")
