"""What membership knows of each peer, and the alarms it raises: plain records.

``membership.Membership`` keeps a ``Peer`` per server it has heard of (by
spid) and an ``Alarm`` per kind raised; ``standing.Standing`` reads the peers
(through ``StandingHost``) to build its view, and ``operations`` shows both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from brokerd.cluster.election import PRIMARY

if TYPE_CHECKING:
    from brokerd.cluster.link import Link
    from brokerd.cluster.messages import Status


@dataclass
class Peer:
    spid: str
    type: str = PRIMARY
    start_time: float = 0.0
    address: str = ""
    aliases: set[str] = field(default_factory=set)
    status: Status | None = None
    last_seen: float = float("-inf")
    #: when its statuses started arriving again after a silence (it may not know the root yet)
    active_since: float = float("-inf")
    link: Link | None = None
    inbound: set[int] = field(default_factory=set)
    #: wall-clock time its latest status arrived (for the round-trip echo)
    received_at: float = 0.0
    #: link round-trip time from the echo of our own status, in milliseconds
    rtt_ms: float | None = None
    #: its connections closed and its port refused a new one: its process has ended
    gone: bool = False
    #: when we last answered a status of its that asked for one
    answered_at: float = float("-inf")
    #: since it was heard again, a status of its named the root we recognise: its
    #: vote is current (it counts at once, no abstention after a rejoin)
    caught_up: bool = False
    #: the node its data directory keeps (its link says; ``knownhosts``)
    node: str = ""


@dataclass
class Alarm:
    kind: str
    message: str
    since: float


def server_key(peer: Peer) -> str:
    """Which server a peer record is a run of: its callback address (a restarted
    server comes back there under a new spid), else a name it answered to."""
    return peer.address or min(peer.aliases, default="") or peer.spid
