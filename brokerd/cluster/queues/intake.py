"""Forwarded publishes into this server's queues, and what a peer's void undoes.

A ``Forward`` record from a peer names the queues it is for here (its
targets); each is pushed into its queue, and the forward is settled once every
queue took it (``SettleWaiter``: some defer, a disk write or a relay). A
forward is applied to this server's own queues only, so it never loops: a
target with another server's spid is a relay the root passes on (a secondary's
match on another secondary's private queue), and a target not owned here
fails the forward, unless it is a replicated queue, whose publishes are kept
for its next owner (``orphans``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from brokerd.cluster.plane import records as rec
from brokerd.cluster.plane.outbound import Outbound, SettleWaiter
from brokerd.model.interfaces import PublishWaiter
from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.cluster.plane.transport import Transport
    from brokerd.cluster.queues.orphans import Orphans
    from brokerd.model.vhost import VirtualHost

log = logging.getLogger("brokerd.cluster.queues.intake")


class ProxyVoid(Protocol):
    def voided(self, spid: str) -> None:
        """The owner ended our session on its own: open a new one."""


class Intake:
    """Forwards from peers, applied to this server's queues."""

    def __init__(
        self,
        transport: Transport,
        vhost: Callable[[], VirtualHost | None],
        orphans: Orphans,
        proxy: ProxyVoid,
        is_root: Callable[[], bool],
    ) -> None:
        self.transport = transport
        self.vhost = vhost
        self.orphans = orphans
        self.proxy = proxy
        self.is_root = is_root

    @property
    def spid(self) -> str:
        return self.transport.spid

    def on_forward(self, out: Outbound, r: rec.Forward) -> None:
        origin, _, channel = r.cluster_id.rpartition("/")
        message = Message(
            r.exchange,
            r.routing_key,
            r.props,
            r.body,
            origin,
            int(channel) if channel.isascii() and channel.isdigit() else 0,
        )
        waiter = SettleWaiter(self.transport, out, r.seq)
        ok, routed = self.apply(message, r.targets, r.redelivered, waiter, sender=out.spid)
        waiter.arm(ok, routed)

    def apply(
        self,
        message: Message,
        targets: list[tuple[str, str]],
        redelivered: bool,
        waiter: PublishWaiter,
        kept: bool = False,
        sender: str = "",
    ) -> tuple[bool, int]:
        """Push a forwarded message into this server's queues: (all took it, routed).
        ``kept``: it is one of the kept publishes (``orphans``), going in at last.
        ``sender``: the peer that forwarded it; from a queue's old owner that holds
        this server's earlier publishes (``SharedQueue.behind``), it is one of those,
        or came before them: it goes in ahead of what is kept for the queue here. So
        does one from any former owner of the queue: a fenced owner relays what it
        kept, and what it kept was sent before anything held here (the old owner
        a publish here waits on may have relayed it to the next, which relays it on:
        a second hop once landed behind the publish that waited for it)."""
        vhost = self.vhost()
        ok = True
        routed = 0
        for spid, name in targets:
            if spid and spid != self.spid:
                # a relay: the root passes a secondary's match on to another secondary
                if self.is_root() and self.transport.forward(spid, message, ("", name), waiter):
                    routed += 1
                else:
                    ok = False
                continue
            queue = vhost.queues.get(name) if vhost is not None else None
            if queue is None:
                continue  # gone meanwhile: not routed (a mandatory return at the origin)
            if getattr(queue, "replicated_kind", False) and (
                queue.frozen
                or (not queue.local and queue.moving == self.spid)
                or (
                    queue.local
                    and not kept
                    and self.orphans.holds(name)
                    and not (sender and (queue.behind() == sender or sender in queue.former_owners))
                )
            ):
                # kept for the queue's next owner, in order: this server handed it over
                # already (``handover``), or is the target of its move and has not the
                # placement yet (the sender had it first), or keeps publishes for it
                # that this one must not overtake
                self.orphans.hold(message, ("", name), waiter, redelivered)
                routed += 1
                continue
            if not getattr(queue, "local", True):  # (a private queue is always here)
                ok = False  # not owned here (a failover moved it): the publisher is nacked
                continue
            orphans = self.orphans
            passing, orphans.passing = orphans.passing, True  # checked above
            try:
                if redelivered:
                    queue.restore(message, waiter)
                    routed += 1
                elif queue.push(message, waiter):
                    routed += 1
                else:
                    ok = False
            finally:
                orphans.passing = passing
        return ok, routed

    def on_void(self, out: Outbound, r: rec.Void) -> None:
        """The peer ended our session on its own: what we sent it may have been dropped.
        Forwards it did take were settled before this record (one ordered link)."""
        count = len(out.unsettled)
        # it may have taken some: their settlements may have been dropped with the
        # link that ended the session (the void itself comes on the next one)
        self.orphans.keep(out, maybe_taken=True)
        # a void of a session that never was (epoch 0) with nothing to resend is routine:
        # the peer ended the data lane's session on a cut link, whatever it carried
        log.log(
            logging.WARNING if count or r.epoch else logging.INFO,
            "session voided by %s (epoch %d): %d unsettled forwards to send again",
            out.spid,
            r.epoch,
            count,
        )
        self.proxy.voided(out.spid)
        self.orphans.send()
