"""What the console link needs from the server that runs it: ``ConsoleHost``.

consolelink sits beside the server, below it: ``brokerd.server`` starts a
``ConsoleLink`` with itself as the host, and nothing in consolelink imports
``brokerd.server`` (tests/unit/test_layering.py checks it). The server
satisfies this protocol structurally; a test can hand in any object with
the members a path touches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from brokerd.cluster.config import ClusterConfig
    from brokerd.config import BrokerConfig
    from brokerd.model.broker import Broker


class HostRefused(Exception):
    """The host will not do what the console asked (root.enable on a standalone
    broker, on a secondary, a queue that cannot move); the message becomes the
    ack's ``error``."""


class ConsoleHost(Protocol):
    """The server as the console link sees it: identity for ``hello``, state for
    ``status``, and the operations the console's commands run."""

    # -- identity (hello) ---------------------------------------------------------

    @property
    def spid(self) -> str: ...

    @property
    def address(self) -> str:
        """host:port this server is known by (the console's name for it)."""
        ...

    @property
    def started(self) -> float:
        """Start time, seconds since the epoch."""
        ...

    @property
    def worker_of(self) -> tuple[str, int, int] | None:
        """A worker of ``brokerd --workers``: its host's client address, its index and
        the host's worker count (None: a broker of its own)."""
        ...

    @property
    def server_type(self) -> str:
        """primary or secondary (what a clustered server was started as)."""
        ...

    @property
    def status_interval(self) -> float:
        """Seconds between statuses."""
        ...

    @property
    def cluster_checksum(self) -> str | None:
        """The cluster's known-hosts checksum; None without a running cluster."""
        ...

    # -- configuration ------------------------------------------------------------

    @property
    def config(self) -> BrokerConfig:
        """The broker configuration in force."""
        ...

    @property
    def cluster_config(self) -> ClusterConfig | None:
        """The cluster configuration in force; None for a standalone broker."""
        ...

    def install_config(self, config: BrokerConfig) -> None: ...

    def reconfigure_cluster(self, config: ClusterConfig) -> None: ...

    def keep_console_config(self, record: dict[str, Any]) -> None:
        """Keep the applied document with the durable wiring (applied again at start)."""
        ...

    def configure_bridges(self, bridges: list[dict[str, Any]] | None) -> None:
        """The document's bridges (None: it has none; the broker's own run)."""
        ...

    def configure_federation(
        self, upstreams: list[dict[str, Any]] | None, policies: list[dict[str, Any]] | None
    ) -> None:
        """The document's federation upstreams and policies (None: none)."""
        ...

    # -- state (status) -----------------------------------------------------------

    @property
    def broker(self) -> Broker: ...

    @property
    def rates(self) -> Mapping[str, float]:
        """Messages per second over the last second (published, routed, delivered)."""
        ...

    def counts(self) -> dict[str, int]: ...

    def cluster_status(self) -> dict[str, Any] | None:
        """The cluster controller's status; None for a standalone broker."""
        ...

    def resource_status(self) -> dict[str, Any]:
        """Memory and disk readings against their limits."""
        ...

    def resource_alarms(self) -> list[dict[str, Any]]:
        """The memory and disk alarms in effect."""
        ...

    def loop_status(self) -> dict[str, Any]:
        """The event loop's lag and full collections."""
        ...

    def bridge_status(self) -> list[dict[str, Any]]:
        """The bridges running on this server, passwords redacted."""
        ...

    def bridged_total(self) -> int:
        """Messages this server's bridges forwarded since it started."""
        ...

    def cluster_members(self) -> dict[str, Any] | None:
        """The members as ``brokerd ctl cluster members --json`` lists them (their
        version, whether a majority holds it, each member's state, the forgotten);
        None for a standalone broker."""
        ...

    # -- commands -----------------------------------------------------------------

    def state_dump(self) -> str:
        """The full multi-line state dump (as SIGUSR1 logs it)."""
        ...

    def set_root_enabled(self, enabled: bool) -> bool:
        """Allow (or forbid) this server to be root; returns the setting now in
        force. Raises ``HostRefused`` when the server cannot (not clustered, a
        secondary)."""
        ...

    def move_queue(self, vhost: str, name: str, to: str) -> dict[str, Any]:
        """Ask the cluster to hand shared queue ``name`` to the primary ``to`` (a spid).
        Returns at once with ``{"queue", "from", "to", "state": "requested"}``: the
        hand-over completes asynchronously, and statuses report the new owner. Raises
        ``HostRefused`` when it cannot start (a standalone broker, no such queue, a
        classic queue, ``to`` not a live unfenced primary, a move of it under way)."""
        ...

    def rebalance_queues(self, vhost: str) -> dict[str, Any]:
        """Ask the cluster to spread the owners of ``vhost``'s shared queues over the
        primaries: ``{"moves": [{"queue", "from", "to"}, ...]}``, empty when already
        balanced. Raises ``HostRefused`` on a standalone broker."""
        ...

    async def forget_member(self, address: str) -> dict[str, Any]:
        """Ask the root to forget the stopped member at ``address`` (host:port), as
        ``brokerd ctl cluster forget`` does, and wait until a majority of the remaining
        members holds the new set: ``{"forgotten", "version", "committed", "members"}``.
        Raises ``HostRefused`` with the root's reason (it is running, it is the root, a
        change is under way) or on a standalone broker."""
        ...

    async def change_groups(self, action: str, address: str) -> dict[str, Any]:
        """``action`` "grow": ask the root to take the primary at ``address`` (host:port)
        into every quorum group that leaves it out; "shrink": out of every group that
        names it, as ``brokerd ctl queues grow|shrink`` do. Answered once the root
        answered for each queue: ``{"address", "action", "queues": [{"queue", "changed",
        "group", "reason"}]}``, where the root refuses per queue (``reason``). Raises
        ``HostRefused`` on a standalone broker or for a malformed address."""
        ...
