"""The message plane: moving messages between the servers of a cluster.

Seed 000's "publish message" and "Intra-cluster routing", on the links:

- A publish on a server that is not root, routed to shared queues, is
  *forwarded* once to the root, with every target queue in one record and
  the message's Cluster-Id (``spid/connection/channel``). A match to another
  server's private queue (a meta-binding) is pushed once to that server, or
  through the root when there is no link to it (secondaries are linked to
  primaries only). A forwarded message is applied to the receiver's own
  queues only, so it can never loop.
- Every forward is *settled* by its receiver once its queues took it (runs
  of settlements travel as ranges): the publisher's confirm waits for that,
  and a mandatory message nobody took comes back as basic.return at its
  origin.
- Consumers, gets and their acks on a shared queue are proxied to the root
  (``proxy``); the root delivers to them (``master``).

Records to one peer gather in one ``Batch`` and leave once per event-loop
turn (sooner past ``FLUSH_BYTES``), in order, on the peer's link. The
replication stream (``replicated``, ``replica``) has a batch of its own per
peer that leaves first; the other batch is held while a delivery in it waits
for the replicas (``Outbound.gate``).

A *session* with a peer lasts while both links with it are up and it is
active; when it ends, what was in flight with it is void: unsettled forwards
are nacked (never confirmed without the receiver having taken them), and
the proxy re-attaches its consumers under a new session (``records.Session``)
so the root requeues what it had delivered to the old one. Either side may
see the session end alone (a link cut one way, a peer seen inactive from one
side only), while the other goes on counting on records that were dropped:
the side that ended it requeues at once what the peer held, ignores the
peer's consumer records until a new session, and tells it with a
``records.Void`` as soon as a link is back, so the peer nacks its unsettled
forwards and opens a new session.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from brokerd.cluster import records as rec
from brokerd.cluster.flow import Feeder, FlowControl
from brokerd.cluster.master import MasterSide
from brokerd.cluster.proxy import ProxySide
from brokerd.cluster.queues import SharedQueue
from brokerd.cluster.replica import ReplicaSide
from brokerd.cluster.replicated import LAG_HIGH, LAG_LOW, Gate, ReplicaSet
from brokerd.model.message import Message
from brokerd.model.queue import PublishWaiter

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership
    from brokerd.model.broker import Broker
    from brokerd.model.vhost import VirtualHost

log = logging.getLogger("brokerd.cluster.forwarding")

DATA = "cluster.data"
#: a batch this large leaves at once instead of at the end of the loop turn
FLUSH_BYTES = 256 * 1024
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
#: bytes of orphaned forwards kept for the next root; past it the oldest are nacked
ORPHAN_BYTES_MAX = 64 * 1024 * 1024

Done = Callable[[bool, int], None]
#: an unsettled forward: the message, its targets, the publishers' callbacks, and
#: whether it went flagged redelivered
Unsettled = tuple[Message, list[tuple[str, str]], list[Done] | None, bool]
#: unsettled forwards' bytes to one peer above which its feeders are paused
UNSETTLED_BYTES_HIGH = 64 * 1024 * 1024


def feeder(publisher: int | str) -> Feeder:
    """A message's feeder: its local connection, or the peer it was forwarded from
    (``publisher`` is then ``spid/connection``)."""
    return publisher if isinstance(publisher, int) else publisher.partition("/")[0]


class Outbound:
    """What this server sends to one peer, and what it waits to hear back."""

    __slots__ = (
        "batch",
        "feeders",
        "fwd_done",
        "fwd_message",
        "fwd_redelivered",
        "fwd_targets",
        "gate",
        "held",
        "next_seq",
        "repl",
        "settle_run",
        "spid",
        "unsettled",
        "unsettled_bytes",
        "up",
    )

    def __init__(self, spid: str) -> None:
        self.spid = spid
        self.batch = rec.Batch()
        #: the forward being gathered: one record per message, every target in it
        self.fwd_message: Message | None = None
        self.fwd_targets: list[tuple[str, str]] = []
        self.fwd_done: list[Done] = []
        self.fwd_redelivered = False
        self.next_seq = 1
        #: forwards sent and not yet settled: seq -> what to send again if the peer
        #: fails before settling (see ``MessagePlane.orphan``)
        self.unsettled: dict[int, Unsettled] = {}
        #: the bodies' bytes held in ``unsettled`` (flow control bounds it)
        self.unsettled_bytes = 0
        #: settlements of its forwards to send: [first, last, ok, routed]
        self.settle_run: list[Any] | None = None
        #: its link is up (deliveries wait while it is not)
        self.up = False
        #: replication records for it (root -> replica, or acks back), sent first
        self.repl = rec.Batch()
        #: ``batch`` holds a delivery that waits for the replicas: not sent until open
        self.gate: Gate | None = None
        #: earlier records cut off at each new gate: (the gate they wait for, records)
        self.held: deque[tuple[Gate | None, list[Any]]] = deque()
        #: connections (ids) and peers (spids) whose publishes were forwarded here
        #: lately: what flow control pauses when this link falls behind
        self.feeders: set[Feeder] = set()


class SettleWaiter:
    """A forward received from a peer, settled once every queue it reached took it
    (some may defer: a relay to another server). Implements ``PublishWaiter``."""

    __slots__ = ("armed", "deferred", "ok", "out", "plane", "routed", "seq", "waiting")

    def __init__(self, plane: MessagePlane, out: Outbound, seq: int) -> None:
        self.plane = plane
        self.out = out
        self.seq = seq
        self.deferred = 0
        self.waiting = 0
        self.ok = True
        self.routed = 0
        self.armed = False

    def defer(self) -> Done:
        self.deferred += 1
        self.waiting += 1
        return self._done

    def _done(self, ok: bool, routed: int) -> None:
        self.waiting -= 1
        self.ok = self.ok and ok
        self.routed += routed
        if self.waiting == 0 and self.armed:
            self.plane.settle(self.out, self.seq, self.ok, self.routed)

    def arm(self, ok: bool, routed: int) -> None:
        self.ok = self.ok and ok
        self.routed += routed - self.deferred
        self.armed = True
        if self.waiting == 0:
            self.plane.settle(self.out, self.seq, self.ok, self.routed)


class _Callbacks:
    """A kept forward pushed into this server's queues once it became root: the
    publishers' callbacks are called as a settlement would (implements
    ``PublishWaiter``)."""

    __slots__ = ("armed", "done", "ok", "routed", "waiting")

    def __init__(self, done: list[Done]) -> None:
        self.done = done
        self.waiting = 0
        self.ok = True
        self.routed = 0
        self.armed = False

    def defer(self) -> Done:
        self.waiting += 1
        return self._one

    def _one(self, ok: bool, routed: int) -> None:
        self.waiting -= 1
        self.ok = self.ok and ok
        if self.waiting == 0 and self.armed:
            self._finish()

    def arm(self, ok: bool, routed: int) -> None:
        self.ok = self.ok and ok
        self.routed = routed
        self.armed = True
        if self.waiting == 0:
            self._finish()

    def _finish(self) -> None:
        for i, callback in enumerate(self.done):
            callback(self.ok, self.routed if i == 0 else 0)


class MessagePlane:
    """Forwards, settlements and the link batches; the root and proxy sides use it."""

    def __init__(
        self,
        members: Membership,
        broker: Broker | None,
        vhost: str,
        on_block: Callable[[str, str | None], None] | None = None,
    ) -> None:
        self.members = members
        self.broker = broker
        self.vhost_name = vhost
        #: sets or clears a cause of blocking publishers (the server's block_publishers)
        self.on_block = on_block
        #: which connections are paused, and why (the controller connects it to the server)
        self.flow = FlowControl()
        self.outbound: dict[str, Outbound] = {}
        self.master = MasterSide(self)
        self.proxy = ProxySide(self)
        #: as root: the replicas of the master queues; else: this server's copies
        self.replicas = ReplicaSet(self)
        self.replica = ReplicaSide(self)
        #: this server is the root: its shared queues are the masters
        self.is_root = False
        self._flush_scheduled = False
        self._flow_watch = False
        self._feeders_reset = 0.0
        #: forwards to a root that failed before settling them, to send to the next
        #: (``orphan``), their bytes, and since when the oldest waits
        self.orphans: deque[Unsettled] = deque()
        self.orphan_bytes = 0
        self.orphans_since = 0.0
        #: the root before the last change (its forwards are orphaned after it)
        self._root_was: str | None = None
        self._last_id: tuple[Any, str] = (None, "")

    @property
    def spid(self) -> str:
        return self.members.spid

    def root_spid(self) -> str | None:
        return self.members.current_root

    def vhost(self) -> VirtualHost | None:
        return self.broker.vhosts.get(self.vhost_name) if self.broker is not None else None

    def shared_queues(self) -> list[SharedQueue]:
        vhost = self.vhost()
        if vhost is None:
            return []
        return [q for q in vhost.queues.values() if isinstance(q, SharedQueue)]

    def cluster_id(self, message: Message) -> str:
        """``spid/connection/channel`` of the message's publisher (the last one made is
        kept: a publisher sends many messages in a row)."""
        key = (message.publisher, message.channel)
        if key != self._last_id[0]:
            if isinstance(message.publisher, int):
                text = f"{self.spid}/{message.publisher}/{message.channel}"
            else:
                text = f"{message.publisher}/{message.channel}"
            self._last_id = (key, text)
        return self._last_id[1]

    # -- outbound ------------------------------------------------------------------

    def out(self, spid: str) -> Outbound:
        out = self.outbound.get(spid)
        if out is None:
            out = self.outbound[spid] = Outbound(spid)
            out.up = self.members.link_to(spid) is not None
        return out

    def batch(self, out: Outbound) -> rec.Batch:
        """The peer's batch, for a record that must follow everything sent before it."""
        if out.fwd_message is not None:
            self._finish_forward(out)
        if out.batch.size > FLUSH_BYTES:
            self._post(out)
        self._schedule()
        return out.batch

    def repl_batch(self, out: Outbound) -> rec.Batch:
        """The peer's replication batch (always sent, ahead of the other one)."""
        if out.repl.size > FLUSH_BYTES:
            self._post_repl(out)
        self._schedule()
        return out.repl

    def hold(self, out: Outbound, gate: Gate) -> None:
        """A delivery to ``out``'s server waits for ``gate`` (its acquisition must reach
        the replicas first), and so does everything after it. What was gathered
        before waits only for the gate before: segments leave in order as their
        gates open, so a steady stream flows one replica round trip behind."""
        if gate.opened or out.gate is gate:
            return
        if out.batch:
            out.held.append((out.gate, out.batch.cut()))
        out.gate = gate
        gate.on_open(self._schedule)

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop: unit tests flush by hand
                self._flush_scheduled = False

    def forward(
        self,
        spid: str | None,
        message: Message,
        target: tuple[str, str],
        waiter: PublishWaiter | None,
        redelivered: bool = False,
    ) -> bool:
        """Send ``message`` for ``target`` (spid, queue) to server ``spid``; one record
        per message and server, so pushes of one publish to several of its queues
        share it. False if the server cannot be reached (the publisher is nacked)."""
        if spid is None or spid == self.spid:
            return False
        out = self.out(spid)
        if not out.up:
            return False
        if out.fwd_message is not message or out.fwd_redelivered != redelivered:
            if out.fwd_message is not None:
                self._finish_forward(out)
            out.fwd_message = message
            out.fwd_redelivered = redelivered
            self._schedule()
        out.fwd_targets.append(target)
        out.feeders.add(feeder(message.publisher))
        if waiter is not None:
            out.fwd_done.append(waiter.defer())
        return True

    def forward_private(
        self, spid: str, queue: str, message: Message, waiter: PublishWaiter | None
    ) -> bool:
        """A match to a private queue of ``spid``: straight there if linked, else the
        root relays it (a secondary is linked to the primaries only)."""
        if spid == self.spid:
            return False
        if self.out(spid).up:
            return self.forward(spid, message, ("", queue), waiter)
        root = self.root_spid()
        if root == self.spid:
            return False
        return self.forward(root, message, (spid, queue), waiter)

    def _finish_forward(self, out: Outbound) -> None:
        message = out.fwd_message
        assert message is not None
        seq = out.next_seq
        out.next_seq = seq + 1
        out.batch.forward(
            seq,
            self.cluster_id(message),
            out.fwd_targets,
            message.exchange,
            message.routing_key,
            message.props_raw,
            message.body,
            out.fwd_redelivered,
        )
        out.unsettled[seq] = (message, out.fwd_targets, out.fwd_done or None, out.fwd_redelivered)
        out.unsettled_bytes += len(message.body)
        out.fwd_message = None
        out.fwd_targets = []
        out.fwd_done = []
        out.fwd_redelivered = False
        if out.batch.size > FLUSH_BYTES:
            self._post(out)  # a link message stays small: the receiver's turn stays short

    def settle(self, out: Outbound, seq: int, ok: bool, routed: int) -> None:
        """A forward from ``out``'s server is settled: coalesce runs into ranges."""
        run = out.settle_run
        if run is not None and seq == run[1] + 1 and run[2] == ok and run[3] == routed:
            run[1] = seq
            return
        if run is not None:
            self.batch(out).settle(*run)
        out.settle_run = [seq, seq, ok, routed]
        self._schedule()

    def flush(self) -> None:
        """Send every peer's batch (once per loop turn)."""
        self._flush_scheduled = False
        self.replicas.sent()
        for out in list(self.outbound.values()):
            if out.repl:
                self._post_repl(out)
            if out.fwd_message is not None:
                self._finish_forward(out)
            if out.settle_run is not None:
                out.batch.settle(*out.settle_run)
                out.settle_run = None
            self.proxy.pay_credit(out)
            if out.batch or out.held:
                self._post(out)
        self._check_backlog()

    def flush_peer(self, spid: str) -> None:
        """Send what is gathered for ``spid`` now (a control message follows it)."""
        out = self.outbound.get(spid)
        if out is None:
            return
        if out.repl:
            self._post_repl(out)
        if out.fwd_message is not None:
            self._finish_forward(out)
        if out.settle_run is not None:
            out.batch.settle(*out.settle_run)
            out.settle_run = None
        if out.batch or out.held:
            self._post(out)

    def _post_repl(self, out: Outbound) -> None:
        data = out.repl.take()
        link = self.members.link_to(out.spid)
        # a replica's acks jump the queue (the root's deliveries wait for them); the
        # root's stream keeps its place after the wiring posted before it
        if link is None or not link.post(DATA, data, not self.is_root):
            log.debug("replication to %s dropped: link down (%d bytes)", out.spid, len(data))

    def _post(self, out: Outbound) -> None:
        parts: list[Any] = []
        held = out.held
        while held and (held[0][0] is None or held[0][0].opened):
            parts += held.popleft()[1]
        if not held and (out.gate is None or out.gate.opened):
            out.gate = None
            parts += out.batch.cut()
        if not parts:
            return  # deliveries in it wait for the replicas
        data = rec.joined(parts)
        link = self.members.link_to(out.spid)
        if link is None or not link.post(DATA, data):
            log.debug("batch to %s dropped: link down (%d bytes)", out.spid, len(data))

    def _check_backlog(self) -> None:
        """Pace the publishers feeding what fell behind (seed 001 flow control, see
        ``flow``): a link's data lane, unsettled forwards to a peer, the replicas."""
        flow = self.flow
        now = self.members.clock()
        replicas = self.replicas if self.is_root else None
        for out in self.outbound.values():
            link = self.members.link_to(out.spid)
            backlog = link.backlog if link is not None else 0
            unsettled = len(out.unsettled)
            if out.unsettled_bytes > UNSETTLED_BYTES_HIGH:
                unsettled = max(unsettled, UNSETTLED_HIGH + 1)  # few, but large
            cause = f"link:{out.spid}"
            if replicas is not None and out.spid in replicas.replicas:
                high, low = REPLICA_BACKLOG_HIGH, REPLICA_BACKLOG_LOW
                feeders: set[Feeder] = out.feeders | replicas.feeders
            else:
                high, low = BACKLOG_HIGH, BACKLOG_LOW
                feeders = out.feeders
            if cause in flow.causes:
                if backlog < low and unsettled < UNSETTLED_HIGH // 2:
                    flow.release(cause)
                else:
                    flow.hold(cause, flow.causes[cause], feeders)
            elif backlog > high or unsettled > UNSETTLED_HIGH:
                flow.hold(
                    cause,
                    f"link to {out.spid} is behind: {backlog} bytes queued, "
                    f"{unsettled} forwards unsettled",
                    feeders,
                )
        if replicas is not None:
            lag = replicas.quorum_lag()
            if "replication" in flow.causes:
                if lag < LAG_LOW:
                    flow.release("replication")
                else:
                    flow.hold("replication", flow.causes["replication"], replicas.feeders)
            elif lag > LAG_HIGH:
                flow.hold(
                    "replication",
                    f"replicas are {lag} events behind: publishers paced",
                    replicas.feeders,
                )
        elif "replication" in flow.causes:
            flow.release("replication")
        if now - self._feeders_reset >= FEEDER_WINDOW and not flow.active:
            self._feeders_reset = now
            for out in self.outbound.values():
                out.feeders.clear()
            self.replicas.reset_feeders()
        if flow.active and not self._flow_watch:
            self._flow_watch = True
            try:
                asyncio.get_running_loop().call_later(FLOW_RECHECK, self._watch_backlog)
            except RuntimeError:  # no loop: unit tests check by hand
                self._flow_watch = False

    def _watch_backlog(self) -> None:
        self._flow_watch = False
        self._check_backlog()

    def all_feeders(self) -> set[Feeder]:
        """Every connection and peer that fed the cluster lately (the event loop's
        own lag pauses them all)."""
        feeders: set[Feeder] = set(self.replicas.feeders)
        for out in self.outbound.values():
            feeders |= out.feeders
        return feeders

    # -- inbound -------------------------------------------------------------------

    def receive(self, spid: str, body: bytes) -> None:
        """One link message of records from ``spid``, applied in order."""
        try:
            records = rec.decode(body)
        except rec.RecordError as exc:
            log.warning("record batch refused from=%s: %s", spid, exc)
            return
        out = self.out(spid)
        master, proxy = self.master, self.proxy
        stream: list[rec.Replicate] = []
        for r in records:
            if isinstance(r, rec.Forward):
                self._on_forward(out, r)
            elif isinstance(r, rec.Settle):
                self._on_settle(out, r)
            elif isinstance(r, rec.Deliver | rec.Got | rec.Reply):
                proxy.receive(out, r)
            elif isinstance(r, rec.Void):
                self._on_void(out, r)
            elif isinstance(r, rec.Replicate):
                stream.append(r)
            elif isinstance(r, rec.Replicated):
                self.replicas.acked(spid, r.seq)
            else:
                master.receive(out, r)
        if stream:
            self.replica.receive(out, stream)
        master.after_batch(out)

    def _on_forward(self, out: Outbound, r: rec.Forward) -> None:
        origin, _, channel = r.cluster_id.rpartition("/")
        message = Message(
            r.exchange,
            r.routing_key,
            r.props,
            r.body,
            origin,
            int(channel) if channel.isascii() and channel.isdigit() else 0,
        )
        waiter = SettleWaiter(self, out, r.seq)
        ok, routed = self._apply_forward(message, r.targets, r.redelivered, waiter)
        waiter.arm(ok, routed)

    def _apply_forward(
        self,
        message: Message,
        targets: list[tuple[str, str]],
        redelivered: bool,
        waiter: PublishWaiter,
    ) -> tuple[bool, int]:
        """Push a forwarded message into this server's queues: (all took it, routed)."""
        vhost = self.vhost()
        ok = True
        routed = 0
        for spid, name in targets:
            if spid and spid != self.spid:
                # a relay: the root passes a secondary's match on to another secondary
                if self.is_root and self.forward(spid, message, ("", name), waiter):
                    routed += 1
                else:
                    ok = False
                continue
            queue = vhost.queues.get(name) if vhost is not None else None
            if queue is None:
                continue  # gone meanwhile: not routed (a mandatory return at the origin)
            if not queue.local:
                ok = False  # not mastered here (the root moved): the publisher is nacked
                continue
            if redelivered:
                queue.restore(message, waiter)
                routed += 1
            elif queue.push(message, waiter):
                routed += 1
            else:
                ok = False
        return ok, routed

    def _on_settle(self, out: Outbound, r: rec.Settle) -> None:
        unsettled = out.unsettled
        if r.last - r.first >= len(unsettled):  # a wide range: walk what is waiting instead
            seqs = [s for s in unsettled if r.first <= s <= r.last]
        else:
            seqs = range(r.first, r.last + 1)
        for seq in seqs:
            entry = unsettled.pop(seq, None)
            if entry is None:
                continue
            out.unsettled_bytes -= len(entry[0].body)
            done = entry[2]
            if done:
                for i, callback in enumerate(done):
                    callback(r.ok, r.routed if i == 0 else 0)

    def _on_void(self, out: Outbound, r: rec.Void) -> None:
        """The peer ended our session on its own: what we sent it may have been dropped.
        Forwards it did take were settled before this record (one ordered link)."""
        count = len(out.unsettled)
        self.orphan(out, maybe_taken=False)
        log.warning(
            "session voided by %s (epoch %d): %d unsettled forwards to send again",
            out.spid,
            r.epoch,
            count,
        )
        self.proxy.voided(out.spid)
        self.send_orphans()

    # -- events from membership --------------------------------------------------------

    def orphan(self, out: Outbound, *, maybe_taken: bool) -> None:
        """The peer will not settle its forwards (it failed, or voided our session).
        Those to the root are kept, to go again to whichever server is root next
        (``send_orphans``), flagged redelivered if the peer may have taken them;
        others (a private queue's server) can go nowhere else and are nacked.
        ``maybe_taken`` is false after a void: what the peer took it settled first."""
        if out.fwd_message is not None:
            self._finish_forward(out)
        unsettled, out.unsettled = out.unsettled, {}
        out.unsettled_bytes = 0
        to_root = out.spid == self.root_spid() or out.spid == self._root_was
        for message, targets, done, redelivered in unsettled.values():
            if to_root and all(not spid for spid, _name in targets):
                if not self.orphans:
                    self.orphans_since = self.members.clock()
                self.orphans.append((message, targets, done, redelivered or maybe_taken))
                self.orphan_bytes += len(message.body)
            else:
                for callback in done or ():
                    callback(False, 0)
        while self.orphan_bytes > ORPHAN_BYTES_MAX and self.orphans:
            self._nack_orphan(self.orphans.popleft())

    def _nack_orphan(self, orphan: Unsettled) -> None:
        self.orphan_bytes -= len(orphan[0].body)
        for callback in orphan[2] or ():
            callback(False, 0)

    def send_orphans(self) -> None:
        """Send the kept forwards to the root, in the order they were first sent: to
        its link, or into our own queues if we are root now."""
        root = self.root_spid()
        if not self.orphans or root is None:
            return
        if root != self.spid and not self.out(root).up:
            return
        orphans, self.orphans = self.orphans, deque()
        self.orphan_bytes = 0
        log.warning("%d unsettled forwards sent again to root %s", len(orphans), root)
        for message, targets, done, redelivered in orphans:
            if root == self.spid:
                waiter = _Callbacks(done or [])
                ok, routed = self._apply_forward(message, targets, redelivered, waiter)
                waiter.arm(ok, routed)
                continue
            out = self.out(root)
            if out.fwd_message is not None:
                self._finish_forward(out)
            out.fwd_message = message
            out.fwd_redelivered = redelivered
            out.fwd_targets = list(targets)
            out.fwd_done = list(done or ())
            out.feeders.add(feeder(message.publisher))
            self._finish_forward(out)
        self._schedule()

    def expire_orphans(self) -> None:
        """Kept forwards that found no root within the open timeout are nacked."""
        if self.orphans and (
            self.members.clock() - self.orphans_since > self.members.config.open_timeout
        ):
            log.warning("%d unsettled forwards found no root in time: nacked", len(self.orphans))
            while self.orphans:
                self._nack_orphan(self.orphans.popleft())
            self.orphan_bytes = 0

    def fail_forwards(self, out: Outbound) -> None:
        """The link with the peer is gone: keep (or nack) its forwards, drop what
        waited for it."""
        self.orphan(out, maybe_taken=True)
        out.batch = rec.Batch()
        out.repl = rec.Batch()
        out.gate = None
        out.held.clear()
        out.settle_run = None

    def _check_root_link(self) -> None:
        """Block publishers while the link to the root is down: what they publish for
        shared queues could only be nacked (a new root, or the link, ends it)."""
        if self.on_block is None:
            return
        root = self.root_spid()
        if root is None or root == self.spid or self.members.link_to(root) is not None:
            self.on_block("cluster-root-link", None)
        else:
            self.on_block(
                "cluster-root-link", f"cluster not ready: the link to root {root} is down"
            )

    def link_ready(self, spid: str) -> None:
        out = self.out(spid)
        out.up = True
        if self.is_root and spid in self.members.replica_peers():
            self.replicas.add(out, self.shared_queues())
        self.master.link_ready(out)
        self.proxy.session_check()
        if spid == self.root_spid():
            self._check_root_link()
            self.send_orphans()

    def peer_lost(self, spid: str, why: str) -> None:
        """A link with the peer dropped, or it went inactive: the session is over."""
        out = self.outbound.get(spid)
        if out is None:
            return
        out.up = self.members.link_to(spid) is not None
        if out.unsettled or out.fwd_message is not None:
            log.warning("forwards to %s failed: %d unsettled (%s)", spid, len(out.unsettled), why)
        self.fail_forwards(out)
        self.replicas.remove(spid, why)
        self.proxy.session_lost(spid)
        # what it held is requeued now, and what it still sends in this session ignored
        self.master.void(out, gone=why == "inactive")
        if why == "inactive":
            self.replicas.forget(spid)
            self.outbound.pop(spid, None)
        if spid == self.root_spid():
            self._check_root_link()

    def root_changed(self, old: str | None, new: str | None) -> None:
        """Flip the shared queues' roles and move the proxy to the new root; what the
        old root left unsettled goes to the new one."""
        self._root_was = old
        self.is_root = new == self.spid
        if old is not None and old != self.spid:
            out = self.outbound.get(old)
            if out is not None:
                self.fail_forwards(out)
            self.proxy.session_lost(old)
        if old == self.spid:
            self.master.release_all()
            self.replicas.clear()
        if self.is_root:
            self.replica.forget_source()
        else:
            self.replica.root_changed(new)
        queues = self.shared_queues()
        for queue in queues:
            if self.is_root:
                queue.become_master()
            else:
                queue.become_proxy()
        if self.is_root:
            for spid in self.members.replica_peers():
                self.replicas.add(self.out(spid), queues)
        if new is not None and not self.is_root:
            self.proxy.session_check()
        self.send_orphans()
        self._check_root_link()

    def primary_seen(self, spid: str) -> None:
        """An active primary's status arrived: the root takes it as a replica if it
        is not one (it came back, or its link was restored)."""
        replicas = self.replicas
        if self.is_root and spid not in replicas.replicas:
            out = self.out(spid)
            if out.up and spid in self.members.replica_peers():
                replicas.add(out, self.shared_queues())

    def tick(self) -> None:
        self.proxy.tick()
        self.master.tick()
        self.send_orphans()
        self.expire_orphans()
        if self.is_root and self.members.acting:  # never while suspended (see released_to)
            self.replicas.resume()
            patience = 2 * self.members.config.heartbeat_timeout
            stalled = self.replicas.check(self.members.clock(), patience)
            if stalled:
                self.members.raise_alarm(
                    "replication",
                    f"replica {', '.join(stalled)} acked nothing for {patience:.0f}s "
                    "(kept in the set: its link is up)",
                )
            else:
                self.members.clear_alarm("replication")
