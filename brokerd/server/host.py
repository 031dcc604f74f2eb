"""What the server's observers (dumps, metrics) read of it, as a protocol.

``Server`` (``brokerd.server.app``) satisfies it structurally; each observer
extends it with the few members only it reads (``dump.DumpHost``,
``metrics.MetricsHost``), so none of them types against the whole server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from brokerd.cluster.controller import ClusterController
    from brokerd.model.broker import Broker
    from brokerd.server.loopwatch import LoopWatch
    from brokerd.server.resources import ResourceMonitor
    from brokerd.store.disk import DiskStore


class ServerState(Protocol):
    """The state both a dump and a scrape report."""

    @property
    def spid(self) -> str: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def resources(self) -> ResourceMonitor: ...

    @property
    def store(self) -> DiskStore: ...

    @property
    def loopwatch(self) -> LoopWatch: ...

    @property
    def cluster(self) -> ClusterController | None: ...

    def cluster_summary(self) -> dict[str, Any]: ...
