"""Lane probes: does a link's data lane still deliver, end to end?

A lane's AMQP heartbeat proves the far end's *connection* is alive: both sides
write heartbeats and read the other's. It does not prove that what we write on
the data lane is taken and acted on. A soak on the network bed saw a data lane
that did neither for 27 s while its heartbeats and the control lane worked: the
root answered a primary's sync request every second and the primary never got
an answer, so it stayed not ready. (The cause, found by the state dumps of a
later soak: a link that opened while the server blocked its publishers inherited
the block, and its lane's publishes were never read; fixed in
``protocol/negotiation.py``.) Whatever the cause, the cure for a lane that does
not deliver is to build the link again: the planes treat a lost link as a lost
session and send what was unsettled again.

So every heartbeat a link posts a probe (``cluster.lane-probe``, a number) on its
data lane, and the peer echoes it on its own link's control lane
(``cluster.lane-echo``). A link whose oldest unanswered probe is older than
``stall_after`` is dropped and reconnects. Flow control may pause reading a data
lane (``plane/flow.py``), but for milliseconds to seconds: ``stall_after`` is
several heartbeat timeouts, so only a lane stuck far past any pause is reset.
A cluster is one LAN (seed 000); links between sites are bridges, not this.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger("brokerd.cluster.link")

PROBE = "cluster.lane-probe"
ECHO = "cluster.lane-echo"
#: unanswered probes a link remembers (it sends no more past this: the oldest decides)
MAX_WAITING = 64


def stall_after(timeout: float) -> float:
    """Seconds without an echo of the oldest probe before the link is rebuilt: four
    heartbeat timeouts, at least ten seconds. A probe waits behind what the lane
    carries before it (a replica's backlog may hold tens of MB, drained at LAN
    speed in a second or two), and rebuilding a link that is merely slow would send
    it all again: so the bound is far past any backlog a LAN link drains."""
    return max(10.0, 4 * timeout)


@dataclass
class LaneProbe:
    """One link's probes: numbered for the link's life, never reused (an echo of an
    earlier connection's probe answers nothing sent since)."""

    sent: int = 0
    #: (number, when sent) of each probe not echoed yet, oldest first
    waiting: deque[tuple[int, float]] = field(default_factory=deque)

    def restart(self) -> None:
        """The link came up (again): nothing is owed on the new connections."""
        self.waiting.clear()

    def next(self, now: float) -> bytes | None:
        """The next probe's body, or None while too many are unanswered."""
        if len(self.waiting) >= MAX_WAITING:
            return None
        self.sent += 1
        self.waiting.append((self.sent, now))
        return self.sent.to_bytes(8, "big")

    def echo(self, body: bytes) -> None:
        """The peer read probes up to this one."""
        if len(body) != 8:
            return
        number = int.from_bytes(body, "big")
        waiting = self.waiting
        while waiting and waiting[0][0] <= number:
            waiting.popleft()

    def stalled(self, now: float, after: float) -> float | None:
        """How long the oldest unanswered probe has waited, if longer than ``after``."""
        if not self.waiting:
            return None
        waited = now - self.waiting[0][1]
        return waited if waited > after else None


class ProbedLink(Protocol):
    """What probing needs of a link (``link.Link``)."""

    address: str
    peer_spid: str | None
    probe: LaneProbe

    @property
    def up(self) -> bool: ...

    def post(self, kind: str, body: bytes, control: bool = False) -> bool: ...
    def drop(self, reason: str) -> None: ...


def probe_links(links: Iterable[ProbedLink], now: float, timeout: float) -> None:
    """Once a heartbeat, for the links that carry messages: drop the ones whose data
    lane has not delivered a probe for ``stall_after(timeout)``, probe the others."""
    after = stall_after(timeout)
    for link in links:
        if not link.up:
            continue
        waited = link.probe.stalled(now, after)
        if waited is not None:
            log.warning(
                "link stalled address=%s peer=%s: no probe echoed for %.1fs on its data "
                "lane: rebuilt",
                link.address,
                link.peer_spid,
                waited,
            )
            link.drop(f"data lane stalled: no probe echoed for {waited:.1f}s")
            continue
        body = link.probe.next(now)
        if body is not None:
            link.post(PROBE, body)
