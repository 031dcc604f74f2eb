"""The broker model's root: virtual hosts, users and limits."""

from __future__ import annotations

from brokerd.model.auth import UserDatabase
from brokerd.model.errors import NOT_ALLOWED, ConnectionError_
from brokerd.model.limits import HostCounts, LimitChecks, Limits, VhostLimits
from brokerd.model.storage import MessageStore
from brokerd.model.vhost import VirtualHost

__all__ = ["Broker", "Limits", "VhostLimits"]


class Broker(LimitChecks):
    def __init__(
        self,
        users: UserDatabase,
        vhosts: list[str],
        limits: Limits | None = None,
        store: MessageStore | None = None,
    ) -> None:
        self.users = users
        self.limits = limits or Limits()
        #: durable wiring and queue contents on disk (None: everything in memory)
        self.store = store
        self.vhosts: dict[str, VirtualHost] = {name: VirtualHost(name, store) for name in vhosts}
        #: limits per vhost name (brokerd.model.limits); a vhost not listed has none
        self.vhost_limits: dict[str, VhostLimits] = {}
        #: client connections open (counted at connection.open-ok), in all and per vhost
        self.connection_count = 0
        self.vhost_connections: dict[str, int] = {}
        #: a worker's host: the connections of all its workers (None: this broker alone)
        self.host_counts: HostCounts | None = None
        # monotonic counters (the console's ``totals``); each is one integer
        # increment on its path, nothing more, because publish is benchmarked
        #: messages published by clients
        self.messages_in = 0
        #: copies switched into queues (a message reaching three queues counts three)
        self.messages_routed = 0
        #: deliveries and get-oks to clients
        self.messages_out = 0
        #: deliveries settled by basic.ack
        self.messages_acked = 0
        #: deliveries and get-oks of messages delivered before (redelivered=true)
        self.messages_redelivered = 0
        self.messages_returned = 0

    def vhost(self, name: str) -> VirtualHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise ConnectionError_(NOT_ALLOWED, f"vhost '{name}' not found")
        return vhost

    def add_vhost(self, name: str) -> VirtualHost:
        if name not in self.vhosts:
            self.vhosts[name] = VirtualHost(name, self.store)
        return self.vhosts[name]

    def counters(self) -> dict[str, int]:
        """The monotonic message counters, named as in the console link's ``totals``."""
        return {
            "published": self.messages_in,
            "routed": self.messages_routed,
            "delivered": self.messages_out,
            "acked": self.messages_acked,
            "returned": self.messages_returned,
        }

    def totals(self) -> dict[str, int]:
        """Counts for the one-line dump, heartbeats and the console."""
        queues = [q for v in self.vhosts.values() for q in v.queues.values()]
        return {
            "vhosts": len(self.vhosts),
            "exchanges": sum(len(v.exchanges) for v in self.vhosts.values()),
            "queues": len(queues),
            "bindings": sum(len(v.binding_list()) for v in self.vhosts.values()),
            "consumers": sum(len(q.consumers) for q in queues),
            "messages_ready": sum(q.message_count for q in queues),
        }
