"""The message plane's transport: records to and from each peer, over its link.

Records to one peer gather in its batches (``outbound.Outbound``) and leave once
per event-loop turn (sooner past ``FLUSH_BYTES``), in order, on the peer's link:
the acks of the peer's replication stream first (the link's control lane), then
this server's replication stream to it, then everything else. That last batch
may be held by a gate (a delivery whose acquisition the replicas must have
first): what was gathered before the gate leaves, what follows waits, so a
steady stream flows one replica round trip behind.

Forwards and their settlements are the transport's too: a forward is a message
sent to a peer for some of its queues (``targets``), numbered per peer and kept
until the peer settles it, when the publishers' callbacks get the outcome. What
a forward is *for* (queues, owners) the transport does not know.

Inbound, a link message is decoded and each record handed to the handler
registered for its type (``on``), in order; replication records are gathered
and handed over together after the rest (``on_stream``), then the ``after_batch``
hooks run. Who handles what is the queue side's business: this module imports
nothing of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from brokerd.cluster.plane import records as rec
from brokerd.cluster.plane.flow import feeder
from brokerd.cluster.plane.links import Gate, Lane, Links
from brokerd.cluster.plane.outbound import Outbound
from brokerd.model.interfaces import PublishWaiter
from brokerd.model.message import Message

log = logging.getLogger("brokerd.cluster.plane.transport")

DATA = "cluster.data"
#: a batch this large leaves at once instead of at the end of the loop turn
FLUSH_BYTES = 256 * 1024

#: a handler of one record from a peer
Handler = Callable[[Outbound, Any], None]
#: a forward's place: its peer's outbound and its number there (``Transport.mark``)
Mark = tuple[Outbound, int]


class Transport:
    """Every peer's batches and forwards, and the dispatch of what peers send."""

    def __init__(self, links: Links) -> None:
        self.links = links
        self.outbound: dict[str, Outbound] = {}
        self._flush_scheduled = False
        #: the publisher of the last forward's Cluster-Id (a publisher sends many in a row)
        self._last_id: tuple[Any, str] = (None, "")
        #: record type -> its handler (``on``); ``default`` takes the rest
        self.handlers: dict[type, Handler] = {}
        self.default: Handler = lambda out, r: log.warning(
            "record %s from %s has no handler", type(r).__name__, out.spid
        )
        #: record types applied together after the rest of a link message (``on_stream``)
        self.streams: dict[type, Callable[[Outbound, list[Any]], None]] = {}
        #: after each link message read from a peer
        self.after_batch: list[Callable[[Outbound], None]] = []
        #: at each flush: before the peers' batches leave, each peer's last words
        #: before its batch (credit), and after they all left
        self.before_flush: list[Callable[[], None]] = []
        self.before_peer: list[Callable[[Outbound], None]] = []
        self.after_flush: list[Callable[[], None]] = []
        #: after a peer settled forwards (``Orphans`` waits for an old owner's)
        self.after_settle: list[Callable[[Outbound], None]] = []

    @property
    def spid(self) -> str:
        return self.links.spid

    def on(self, kind: type, handler: Handler) -> None:
        self.handlers[kind] = handler

    def on_stream(self, kind: type, handler: Callable[[Outbound, list[Any]], None]) -> None:
        self.streams[kind] = handler

    # -- peers ----------------------------------------------------------------------

    def out(self, spid: str) -> Outbound:
        out = self.outbound.get(spid)
        if out is None:
            out = self.outbound[spid] = Outbound(spid)
            out.up = self.links.link_to(spid) is not None
        return out

    def reachable(self, spid: str) -> bool:
        """Its link is up and membership has not found it inactive: a paused server
        keeps its link, and what is sent to it waits there until it resumes."""
        out = self.outbound.get(spid)
        return out is not None and out.up and self.links.is_active(spid)

    def reset(self, out: Outbound) -> None:
        """The link with the peer went: what waited to be sent to it goes with it."""
        out.batch = rec.Batch()
        out.repl = rec.Batch()
        out.acks = rec.Batch()
        out.gate = None
        out.held.clear()
        out.settle_run = None

    def forget(self, spid: str) -> None:
        """The peer is gone (inactive): nothing is kept for it."""
        self.outbound.pop(spid, None)

    # -- outbound ---------------------------------------------------------------------

    def batch(self, out: Outbound) -> rec.Batch:
        """The peer's batch, for a record that must follow everything sent before it."""
        if out.fwd_message is not None:
            self.finish_forward(out)
        if out.batch.size > FLUSH_BYTES:
            self._post(out)
        self.schedule()
        return out.batch

    def repl_batch(self, out: Outbound) -> rec.Batch:
        """The peer's replication batch (always sent, ahead of the other one)."""
        if out.repl.size > FLUSH_BYTES:
            self._post_repl(out)
        self.schedule()
        return out.repl

    def ack_batch(self, out: Outbound) -> rec.Batch:
        """The acks of the peer's stream (the control lane)."""
        self.schedule()
        return out.acks

    def hold(self, out: Outbound, gate: Gate) -> None:
        """A record for ``out``'s server waits for ``gate``, and so does everything
        after it. What was gathered before waits only for the gate before: segments
        leave in order as their gates open."""
        if gate.opened or out.gate is gate:
            return
        if out.batch:
            out.held.append((out.gate, out.batch.cut()))
        out.gate = gate
        gate.on_open(self.schedule)

    def schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop: unit tests flush by hand
                self._flush_scheduled = False

    # -- forwards ---------------------------------------------------------------------

    def cluster_id(self, message: Message) -> str:
        """``spid/connection/channel`` of the message's publisher."""
        key = (message.publisher, message.channel)
        if key != self._last_id[0]:
            if isinstance(message.publisher, int):
                text = f"{self.spid}/{message.publisher}/{message.channel}"
            else:
                text = f"{message.publisher}/{message.channel}"
            self._last_id = (key, text)
        return self._last_id[1]

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
                self.finish_forward(out)
            out.fwd_message = message
            out.fwd_redelivered = redelivered
            self.schedule()
        out.fwd_targets.append(target)
        out.feeders.add(feeder(message.publisher), len(message.body))
        if waiter is not None:
            out.fwd_done.append(waiter.defer())
        return True

    def finish_forward(self, out: Outbound) -> None:
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
        self.schedule()

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
        for hook in self.after_settle:
            hook(out)

    def mark(self, spid: str) -> Mark:
        """Where the forward just made to ``spid`` stands in its sequence: ``unsettled_upto``
        says when it and every earlier one to that peer are settled or kept."""
        out = self.outbound[spid]
        return out, out.next_seq  # the forward being gathered gets the next number

    def unsettled_upto(self, mark: Mark) -> bool:
        """A forward up to ``mark`` waits for its peer's settlement: the peer may yet
        put it into a queue (a relay to the queue's next owner, late), so a later
        publish for that queue must not go elsewhere first. False once the peer's
        session ended (``Orphans.keep`` took them)."""
        out, seq = mark
        if self.outbound.get(out.spid) is not out:
            return False
        if out.fwd_message is not None and seq >= out.next_seq:
            return True
        for first in out.unsettled:  # in the order sent: the lowest number first
            return first <= seq
        return False

    # -- sending ----------------------------------------------------------------------

    def flush(self) -> None:
        """Send every peer's batch (once per loop turn)."""
        self._flush_scheduled = False
        for hook in self.before_flush:
            hook()
        for out in list(self.outbound.values()):
            self._send(out, last_words=True)
        for hook in self.after_flush:
            hook()

    def flush_peer(self, spid: str) -> None:
        """Send what is gathered for ``spid`` now (a control message follows it)."""
        out = self.outbound.get(spid)
        if out is not None:
            self._send(out, last_words=False)

    def _send(self, out: Outbound, *, last_words: bool) -> None:
        """Everything gathered for ``out``'s server, in order: the stream's acks, the
        stream, the forward being gathered, settlements, the ``before_peer`` records
        (``last_words``), then the batch as far as its gates allow."""
        if out.acks:
            self._post_acks(out)
        if out.repl:
            self._post_repl(out)
        if out.fwd_message is not None:
            self.finish_forward(out)
        if out.settle_run is not None:
            out.batch.settle(*out.settle_run)
            out.settle_run = None
        if last_words:
            for hook in self.before_peer:
                hook(out)
        if out.batch or out.held:
            self._post(out)

    def _post_repl(self, out: Outbound) -> None:
        data = out.repl.take()
        link = self.links.link_to(out.spid)
        # the stream keeps its place after what was posted before it
        if link is None or not link.post(DATA, data):
            log.debug("replication to %s dropped: link down (%d bytes)", out.spid, len(data))

    def _post_acks(self, out: Outbound) -> None:
        data = out.acks.take()
        link = self.links.link_to(out.spid)
        # acks jump the queue: the owner's confirms and deliveries wait for them
        if link is None or not link.post(DATA, data, True):
            log.debug("replication acks to %s dropped: link down", out.spid)

    def _post(self, out: Outbound) -> None:
        """Send what no closed gate holds, as link messages of about ``FLUSH_BYTES``
        each (cut between the segments a gate or a full batch left): the peer
        applies a link message in one loop turn, so a batch that grew behind a
        slow gate must not reach it as one message of many megabytes."""
        held = out.held
        if out.gate is not None and not out.gate.opened and out.batch.size > FLUSH_BYTES:
            # gated and full: what follows waits for the same gate, in a new segment
            out.held.append((out.gate, out.batch.cut()))
        segments: list[list[Any]] = []
        while held and (held[0][0] is None or held[0][0].opened):
            segments.append(held.popleft()[1])
        if not held and (out.gate is None or out.gate.opened):
            out.gate = None
            if out.batch:
                segments.append(out.batch.cut())
        if not segments:
            return  # deliveries in it wait for the replicas
        link = self.links.link_to(out.spid)
        parts: list[Any] = []
        size = 0
        for segment in segments:
            parts += segment
            size += sum(map(len, segment))
            if size > FLUSH_BYTES:
                self._post_parts(out, link, parts)
                parts, size = [], 0
        if parts:
            self._post_parts(out, link, parts)

    def _post_parts(self, out: Outbound, link: Lane | None, parts: list[Any]) -> None:
        data = rec.joined(parts)
        if link is None or not link.post(DATA, data):
            log.debug("batch to %s dropped: link down (%d bytes)", out.spid, len(data))

    # -- inbound ----------------------------------------------------------------------

    def receive(self, spid: str, body: bytes) -> None:
        """One link message of records from ``spid``, applied in order."""
        try:
            records = rec.decode(body)
        except rec.RecordError as exc:
            log.warning("record batch refused from=%s: %s", spid, exc)
            return
        out = self.out(spid)
        handlers, streams, default = self.handlers, self.streams, self.default
        gathered: dict[type, list[Any]] = {}
        for r in records:
            kind = type(r)
            if kind is rec.Settle:
                self._on_settle(out, r)
            elif kind in streams:
                gathered.setdefault(kind, []).append(r)
            else:
                handlers.get(kind, default)(out, r)
        for kind, stream in gathered.items():
            streams[kind](out, stream)
        for hook in self.after_batch:
            hook(out)
