"""Pacing: when the cluster's paths fall behind, the connections feeding them
are paused (``flow``). The message plane asks ``check`` once per flush, and
again every ``FLOW_RECHECK`` while a cause holds.

Causes: a link's data lane backlog (``BACKLOG_HIGH``; ``REPLICA_BACKLOG_HIGH``
for the root's link to a replica, whose lag the quorum bounds instead),
unsettled forwards to a peer (count and bytes), and the replicas confirms
wait for (``LAG_HIGH`` events behind). Every bound is named in
docs/architecture.md ("Flow control"). What pacing needs of replication is
the ``Replication`` protocol: the plane knows nothing of queues.

A cause pauses the feeders that sent at least their share of the path's
bytes lately (``Feeders.past_share``): the publishers of a hot queue wait, a
trickle to another queue over the same link does not. Past ``OVERRUN`` times
the bound, the path pauses every feeder, so memory stays bounded however
many light feeders there are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from brokerd.cluster.plane.flow import Feeder, Feeders, FlowControl
from brokerd.cluster.plane.links import Links
from brokerd.cluster.plane.outbound import UNSETTLED_BYTES_HIGH
from brokerd.cluster.plane.transport import Transport

#: bytes waiting on a link's data lane above which the connections feeding it are
#: paused (flow control). Statuses no longer wait behind it (they take the control
#: lane), so the bound is about memory and latency: 4 MiB is a tenth of a second
#: of the link's tens of MB/s, enough to keep it busy
BACKLOG_HIGH = 4 * 1024 * 1024
BACKLOG_LOW = 1024 * 1024
#: the root's bound for a link to a replica: a paused or slow replica is not dead,
#: and while a majority keeps up its lag must not stall the publishers (confirms
#: need a majority only); past this much memory it does slow them
REPLICA_BACKLOG_HIGH = 64 * 1024 * 1024
REPLICA_BACKLOG_LOW = 16 * 1024 * 1024
#: unsettled forwards to one peer above which the publishers feeding it are paused
UNSETTLED_HIGH = 50_000
#: how often flow is checked again while a cause holds (seconds)
FLOW_RECHECK = 0.02
#: feeders are remembered this long after their last forward (seconds)
FEEDER_WINDOW = 1.0
#: past this multiple of its high mark a path pauses all its feeders, not only
#: those past their share
OVERRUN = 2
#: events the replicas confirms wait for may be behind before the publishers feeding
#: the owned queues are paused (flow control), and where they resume
LAG_HIGH = 20_000
LAG_LOW = 5_000


class Replication(Protocol):
    """This server's replication stream, as pacing weighs it (``Stream``)."""

    #: queues this server owns and streams (any: links to its replicas carry them)
    @property
    def owned(self) -> Mapping[str, Any]: ...

    #: its replicas, by spid
    @property
    def replicas(self) -> Mapping[str, Any]: ...

    #: who fed the owned queues lately
    @property
    def feeders(self) -> Feeders: ...

    def quorum_lag(self) -> int:
        """Events the replicas confirms wait for are behind."""

    def reset_feeders(self) -> None: ...


class Pacing:
    """The plane's flow-control checks (see the module docstring)."""

    def __init__(
        self,
        transport: Transport,
        flow: FlowControl,
        links: Links,
        clock: Callable[[], float],
        replication: Replication,
    ) -> None:
        self.transport = transport
        self.flow = flow
        self.links = links
        self.clock = clock
        self.replication = replication
        self._flow_watch = False
        self._feeders_reset = 0.0

    def check(self) -> None:
        """Pace the publishers feeding what fell behind (seed 001 flow control, see
        ``flow``): a link's data lane, unsettled forwards to a peer, the replicas."""
        flow = self.flow
        now = self.clock()
        replicas = self.replication
        outbound = self.transport.outbound
        for out in outbound.values():
            link = self.links.link_to(out.spid)
            backlog = link.backlog if link is not None else 0
            unsettled = len(out.unsettled)
            if out.unsettled_bytes > UNSETTLED_BYTES_HIGH:
                unsettled = max(unsettled, UNSETTLED_HIGH + 1)  # few, but large
            cause = f"link:{out.spid}"
            to_replica = bool(replicas.owned) and out.spid in replicas.replicas
            high, low = (
                (REPLICA_BACKLOG_HIGH, REPLICA_BACKLOG_LOW)
                if to_replica
                else (BACKLOG_HIGH, BACKLOG_LOW)
            )
            held = cause in flow.causes
            if held and backlog < low and unsettled < UNSETTLED_HIGH // 2:
                flow.release(cause)
            elif held or backlog > high or unsettled > UNSETTLED_HIGH:
                feeders = out.feeders
                if to_replica:  # everything feeding the owned queues fills it too
                    feeders = Feeders.merged(feeders, replicas.feeders)
                overrun = backlog > OVERRUN * high or unsettled > OVERRUN * UNSETTLED_HIGH
                reason = flow.causes.get(cause) or (
                    f"link to {out.spid} is behind: {backlog} bytes queued, "
                    f"{unsettled} forwards unsettled"
                )
                flow.hold(cause, reason, self._paced(feeders, overrun))
        for cause in [c for c in flow.causes if c.startswith("link:")]:
            if cause[5:] not in outbound:
                flow.release(cause)  # the peer is gone: what it held back is not behind it
        if replicas is not None:
            lag = replicas.quorum_lag()
            overrun = lag > OVERRUN * LAG_HIGH
            if "replication" in flow.causes:
                if lag < LAG_LOW:
                    flow.release("replication")
                else:
                    flow.hold(
                        "replication",
                        flow.causes["replication"],
                        self._paced(replicas.feeders, overrun),
                    )
            elif lag > LAG_HIGH:
                flow.hold(
                    "replication",
                    f"replicas are {lag} events behind: publishers paced",
                    self._paced(replicas.feeders, overrun),
                )
        elif "replication" in flow.causes:
            flow.release("replication")
        if now - self._feeders_reset >= FEEDER_WINDOW and not flow.active:
            self._feeders_reset = now
            for out in outbound.values():
                out.feeders.clear()
            replicas.reset_feeders()
        if flow.active and not self._flow_watch:
            self._flow_watch = True
            try:
                asyncio.get_running_loop().call_later(FLOW_RECHECK, self._watch)
            except RuntimeError:  # no loop: unit tests check by hand
                self._flow_watch = False

    @staticmethod
    def _paced(feeders: Feeders, overrun: bool) -> Iterable[Feeder]:
        """Whom a cause pauses: those past their share, or everyone once overrun."""
        return feeders if overrun else feeders.past_share()

    def _watch(self) -> None:
        self._flow_watch = False
        self.check()

    def loop_feeders(self, overrun: bool) -> Iterable[Feeder]:
        """Whom the event loop's own lag pauses: of every connection and peer that fed
        the cluster lately, those past their share, or all of them once overrun."""
        feeders = Feeders.merged(
            self.replication.feeders, *(out.feeders for out in self.transport.outbound.values())
        )
        return self._paced(feeders, overrun)
