"""Protective limits: per broker (``[limits]``) and per virtual host, and their checks.

Counted where a client asks, never where the cluster replicates: a queue
declared on another server and applied here by wiring replication is not
refused (the server the client declared on already checked its own view of
the shared wiring, which holds the same queues), and cluster links are
neither counted nor refused as connections, since they carry the traffic
that drains queues. Over a limit the client gets RabbitMQ's error where
RabbitMQ has one (530 for connections and channels, 406 for queues), in
its words.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from brokerd.model.errors import (
    NOT_ALLOWED,
    ConnectionError_,
    access_refused,
    precondition_failed,
)

if TYPE_CHECKING:
    from brokerd.model.broker import Broker
    from brokerd.model.vhost import VirtualHost


class HostCounts(Protocol):
    """The connections of every worker of a host (``brokerd.server.hostshare``): a
    host's limits are the host's, whichever worker a connection reached."""

    def locked(self) -> AbstractContextManager[None]:
        """Held around one check-and-count."""

    def connections(self, vhost: str | None = None) -> int:
        """Every worker's connections (to ``vhost``), this one's as last published."""

    def publish(self, total: int, vhosts: dict[str, int]) -> None:
        """This worker's counts now."""


#: names of the broker's own exchanges and queues (the cluster exchange): no client may
#: declare, bind (either way), publish to, consume from, purge or delete them
INTERNAL_PREFIX = "amq.rookery."


def check_not_internal(resource_type: str, name: str) -> None:
    """403 for a client naming one of the broker's internal exchanges or queues."""
    if name.startswith(INTERNAL_PREFIX):
        raise access_refused(
            f"{resource_type} '{name}' is internal to the broker ('{INTERNAL_PREFIX}*'): "
            "clients may not use it"
        )


#: exchanges the broker makes itself (not counted against max_exchanges); the last one
#: is the cluster's exchange (brokerd.cluster.messages.CLUSTER_EXCHANGE)
SYSTEM_EXCHANGES = (
    "",
    "amq.direct",
    "amq.fanout",
    "amq.topic",
    "amq.headers",
    "amq.match",
    "amq.rookery.cluster",
)


@dataclass
class Limits:
    """Negotiation ceilings and protective limits of the whole broker; applied live on
    reload (connections keep what they negotiated). ``None``: no limit."""

    frame_max: int = 131_072
    channel_max: int = 2047
    heartbeat: int = 60
    max_message_size: int = 128 * 1024 * 1024
    #: seed 000: returned messages a connection may receive per second; more are dropped
    max_returns_per_second: int = 1000
    #: client connections open at once (cluster links are not counted)
    max_connections: int | None = None
    #: queues in all vhosts together
    max_queues: int | None = None
    #: exchanges clients declared, in all vhosts together (predeclared ones not counted)
    max_exchanges: int | None = None
    #: bytes a connection may send before its login is decided: RabbitMQ's frame_min_size,
    #: the only frame size a server must accept before tune
    max_unauthenticated_bytes: int = 4096
    #: memory high watermark as a fraction of the machine's (or cgroup's) memory ...
    vm_memory_high_watermark: float = 0.4
    #: ... or, when set, as bytes (``vm_memory_high_watermark = "512MiB"``)
    vm_memory_high_watermark_bytes: int | None = None
    #: publishers are blocked while the data directory's filesystem has less free
    disk_free_limit: int = 50_000_000

    def memory_limit(self, total: int) -> int:
        """The watermark in bytes, for a machine with ``total`` bytes of memory."""
        if self.vm_memory_high_watermark_bytes is not None:
            return self.vm_memory_high_watermark_bytes
        return int(total * self.vm_memory_high_watermark)


@dataclass
class VhostLimits:
    """Limits of one virtual host (``None``: only the broker's apply)."""

    max_connections: int | None = None
    max_queues: int | None = None
    max_exchanges: int | None = None
    #: channels per connection on this vhost (below the negotiated channel_max)
    channel_max: int | None = None


def user_exchanges(vhost: VirtualHost) -> int:
    """Exchanges of ``vhost`` that clients declared."""
    exchanges = vhost.exchanges
    return len(exchanges) - sum(1 for name in SYSTEM_EXCHANGES if name in exchanges)


class LimitChecks:
    """The checks, as a part of :class:`~brokerd.model.broker.Broker`."""

    def vhost_limit(self: Broker, vhost: str, name: str) -> int | None:
        """One limit of one vhost (``max_queues``, ...); None when it has none."""
        limits = self.vhost_limits.get(vhost)
        return None if limits is None else getattr(limits, name)

    @contextmanager
    def _counting(self: Broker) -> Iterator[None]:
        """One check-and-count: under the host's lock, and this worker's counts
        published after it (a refusal changed nothing: nothing to publish)."""
        host = self.host_counts
        if host is None:
            yield
            return
        with host.locked():
            yield
            host.publish(self.connection_count, self._limited_connections())

    def _limited_connections(self: Broker) -> dict[str, int]:
        """Connections per vhost, of the vhosts that limit theirs (the others need no
        host-wide count)."""
        return {
            vhost: count
            for vhost, count in self.vhost_connections.items()
            if self.vhost_limit(vhost, "max_connections") is not None
        }

    def open_connection(self: Broker, vhost: str, user: str) -> None:
        """Count a client connection opening ``vhost``, or refuse it (530). A worker of
        a host counts the host's connections (``host_counts``)."""
        host = self.host_counts
        with self._counting():
            limit = self.limits.max_connections
            count = self.connection_count if host is None else host.connections()
            if limit is not None and count >= limit:
                raise ConnectionError_(
                    NOT_ALLOWED, f"connection refused: node connection limit ({limit}) is reached"
                )
            local = self.vhost_connections.get(vhost, 0)
            limit = self.vhost_limit(vhost, "max_connections")
            if limit is not None:
                count = local if host is None else host.connections(vhost)
                if count >= limit:
                    raise ConnectionError_(
                        NOT_ALLOWED,
                        f"access to vhost '{vhost}' refused for user '{user}': "
                        f"connection limit ({limit}) is reached",
                    )
            self.connection_count += 1
            self.vhost_connections[vhost] = local + 1

    def adopt_connection(self: Broker, vhost: str) -> None:
        """Count a connection a sibling worker handed over: it was admitted there, and
        the host counted it all along (its count leaves the sibling just after)."""
        with self._counting():
            self.connection_count += 1
            self.vhost_connections[vhost] = self.vhost_connections.get(vhost, 0) + 1

    def close_connection(self: Broker, vhost: str) -> None:
        """A connection counted by ``open_connection`` is gone."""
        with self._counting():
            self.connection_count -= 1
            count = self.vhost_connections.get(vhost, 0) - 1
            if count > 0:
                self.vhost_connections[vhost] = count
            else:
                self.vhost_connections.pop(vhost, None)

    def check_channel(self: Broker, vhost: str, open_channels: int, negotiated: int) -> None:
        """One more channel on a connection that has ``open_channels`` (530)."""
        if open_channels >= negotiated:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"number of channels opened ({open_channels}) has reached the "
                f"negotiated channel_max ({negotiated})",
            )
        limit = self.vhost_limit(vhost, "channel_max")
        if limit is not None and open_channels >= limit:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"number of channels opened ({open_channels}) has reached the "
                f"channel limit of virtual host '{vhost}' ({limit})",
            )

    def check_new_queue(self: Broker, vhost: VirtualHost, name: str) -> None:
        """A client declares queue ``name``, which does not exist yet (406)."""
        limit = self.vhost_limit(vhost.name, "max_queues")
        if limit is not None and len(vhost.queues) >= limit:
            raise precondition_failed(
                f"cannot declare queue '{name}': queue limit in virtual host "
                f"'{vhost.name}' ({limit}) is reached"
            )
        limit = self.limits.max_queues
        if limit is not None and sum(len(v.queues) for v in self.vhosts.values()) >= limit:
            raise precondition_failed(
                f"cannot declare queue '{name}': queue limit of this broker ({limit}) is reached"
            )

    def check_new_exchange(self: Broker, vhost: VirtualHost, name: str) -> None:
        """A client declares exchange ``name``, which does not exist yet (406)."""
        limit = self.vhost_limit(vhost.name, "max_exchanges")
        if limit is not None and user_exchanges(vhost) >= limit:
            raise precondition_failed(
                f"cannot declare exchange '{name}': exchange limit in virtual host "
                f"'{vhost.name}' ({limit}) is reached"
            )
        limit = self.limits.max_exchanges
        if limit is not None and sum(map(user_exchanges, self.vhosts.values())) >= limit:
            raise precondition_failed(
                f"cannot declare exchange '{name}': exchange limit of this broker "
                f"({limit}) is reached"
            )
