"""An owner's side of the shared queues: consumers and gets from other servers.

The owner of a shared queue is the primary its placement names (the root orders
placements and owns only the queues placed on it). A consumer connected to
another server attaches to the master queue as a ``RemoteConsumer``, a
``ConsumerSink`` like any local consumer, so the queue's round robin, prefetch
and exclusivity rules span the cluster. Its deliveries travel as ``Deliver``
records; the owner remembers each one it must see settled (``deliveries``), so
that the consumer's server can ack, reject or requeue it, and so that
everything a server held is requeued (redelivered) when its session ends or the
server goes away.

Credit: a consumer with a prefetch window (in ack mode) holds at most that
many unacked deliveries, counted here: prefetch holds end to end. Others
(no-ack, or no prefetch) get ``DEFAULT_WINDOW`` deliveries in flight, and
their server hands credit back as it writes them to its client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.cluster.plane import records as rec
from brokerd.model.errors import INTERNAL_ERROR, NOT_ALLOWED, NOT_FOUND, AMQPError
from brokerd.model.message import Message
from brokerd.model.queue import Queue

if TYPE_CHECKING:
    from brokerd.cluster.plane.outbound import Outbound
    from brokerd.cluster.plane.transport import Transport
    from brokerd.model.storage import Gate
    from brokerd.model.vhost import VirtualHost

log = logging.getLogger("brokerd.cluster.queues.owner")

#: deliveries in flight to a consumer that has no prefetch window of its own
DEFAULT_WINDOW = 8192

#: a delivery the owner waits to see settled: its queue, the message, the consumer
#: (None for basic.get)
Held = tuple[Queue, Message, "RemoteConsumer | None"]


class Peers(Protocol):
    """What the owner side asks of membership."""

    config: Any

    def clock(self) -> float: ...

    def link_to(self, spid: str | None) -> Any: ...


class RemoteConsumer:
    """A consumer on another server, attached to a master queue (a ``ConsumerSink``)."""

    remote = True

    __slots__ = (
        "by_ack",
        "connection_id",
        "exclusive",
        "inflight",
        "no_ack",
        "no_local",
        "out",
        "queue",
        "side",
        "tag",
        "window",
    )

    def __init__(self, side: OwnerSide, out: Outbound, queue: Queue, r: rec.Consume) -> None:
        self.side = side
        self.out = out
        self.queue = queue
        self.tag = r.tag
        self.exclusive = r.exclusive
        self.no_local = r.no_local
        self.no_ack = r.no_ack
        #: "spid/connection": no-local compares it with a forwarded message's publisher
        self.connection_id = r.origin
        #: credit comes back with acks (a prefetch window in ack mode), else explicitly
        self.by_ack = bool(r.window) and not r.no_ack
        self.window = r.window or DEFAULT_WINDOW
        self.inflight = 0

    def ready(self) -> bool:
        return self.out.up and self.inflight < self.window

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        self.side.deliver(self, queue, message, redelivered)

    def cancelled(self, queue: Queue) -> None:
        self.side.consumer_gone(self)

    def hold(self, gate: Gate) -> None:
        """Its delivery waits for the replicas (a ``Recipient``): so does its server's batch."""
        self.side.transport.hold(self.out, gate)

    def __repr__(self) -> str:
        return f"<RemoteConsumer {self.tag} on {self.queue.name} {self.inflight}/{self.window}>"


class Voided:
    """A server whose session was ended here: the queues its consumers left (their
    auto-delete waits for its next session), and whether it was told."""

    __slots__ = ("link_at", "told", "touched")

    def __init__(self, touched: set[Queue]) -> None:
        self.touched = touched
        self.told = False
        #: when a link to it was (last) seen up since the void
        self.link_at: float | None = None


class _GetFor:
    """The server a basic.get answers (a ``Recipient``: its batch waits for the gate)."""

    __slots__ = ("out", "transport")

    def __init__(self, transport: Transport, out: Outbound) -> None:
        self.transport = transport
        self.out = out

    def hold(self, gate: Gate) -> None:
        self.transport.hold(self.out, gate)

    def __repr__(self) -> str:
        return f"<GetFor {self.out.spid}>"


class OwnerSide:
    """Everything an owner holds for consumers and gets of other servers."""

    def __init__(
        self,
        transport: Transport,
        vhost: Callable[[], VirtualHost | None],
        vhost_name: str,
        peers: Peers,
    ) -> None:
        self.transport = transport
        self.vhost = vhost
        self.vhost_name = vhost_name
        self.peers = peers
        self._delivery = 0
        #: per server: its consumers by cluster tag
        self.consumers: dict[str, dict[str, RemoteConsumer]] = {}
        #: per server: deliveries it has not settled yet, by delivery id
        self.deliveries: dict[str, dict[int, Held]] = {}
        #: queues that lost consumers to a session reset in the batch being read
        self._reset: set[Queue] = set()
        #: per server: the epoch of the last session it opened here
        self.epochs: dict[str, int] = {}
        #: servers whose session this side ended on its own (see ``void``)
        self.voided: dict[str, Voided] = {}

    # -- records from a proxy ------------------------------------------------------

    def receive(self, out: Outbound, r: rec.Record) -> None:
        if isinstance(r, rec.Session):
            self._session(out, r)
            return
        voided = self.voided.get(out.spid)
        if voided is not None:
            # sent within a session this side ended: its deliveries are requeued
            # already; it hears so and comes back with a new one
            self._tell_void(out, voided)
            return
        if isinstance(r, rec.Ack):
            self._settle(out, r.ids, "ack")
        elif isinstance(r, rec.Reject):
            self._settle(out, r.ids, "requeue" if r.requeue else "reject")
        elif isinstance(r, rec.Credit):
            self._credit(out, r)
        elif isinstance(r, rec.Consume):
            self._consume(out, r)
        elif isinstance(r, rec.Cancel):
            self._cancel(out, r)
        elif isinstance(r, rec.Get):
            self._get(out, r)
        elif isinstance(r, rec.Purge):
            self._with_queue(out, r.req, r.queue, lambda q: (q.drop_all(), 0), taking=True)
        elif isinstance(r, rec.Stat):
            self._with_queue(out, r.req, r.queue, _stat)

    def _session(self, out: Outbound, r: rec.Session) -> None:
        log.info("session from=%s epoch=%d: releasing what it held", out.spid, r.epoch)
        self.epochs[out.spid] = r.epoch
        voided = self.voided.pop(out.spid, None)
        self.release(out, gone=False)
        if voided is not None:
            self._reset |= voided.touched  # auto-delete is decided once it re-attached

    def void(self, out: Outbound, *, gone: bool) -> None:
        """This side ended the session with ``out``'s server on its own (a link cut or
        dropped, the server seen inactive): records either way may have been dropped
        while the other side still counts on them. What it held is requeued
        (redelivered) and its consumers detached now; whatever it sends is ignored
        until it opens a new session, which a ``Void`` record asks it to do."""
        if out.spid in self.voided:
            return
        reset, self._reset = self._reset, set()
        self.release(out, gone=gone)
        touched, self._reset = self._reset, reset
        self.voided[out.spid] = Voided(touched)

    def _tell_void(self, out: Outbound, voided: Voided) -> None:
        """Send the ``Void`` once per link, after a grace: a server that saw the
        session end too opens a new one as its link comes back, and its ``Session``
        clears the void without a second round of requeues."""
        members = self.peers
        if voided.told or members.link_to(out.spid) is None:
            return
        now = members.clock()
        if voided.link_at is None:
            voided.link_at = now
        if now - voided.link_at < members.config.heartbeat_interval / 2:
            return  # asked again at the next tick
        voided.told = True
        self.transport.batch(out).void(self.epochs.get(out.spid, 0))

    def tick(self) -> None:
        for spid, voided in list(self.voided.items()):
            if not voided.told and self.peers.link_to(spid) is not None:  # not a gone server's
                self._tell_void(self.transport.out(spid), voided)

    def after_batch(self, out: Outbound) -> None:
        """A batch is read: a queue a session reset left without consumers, and that
        the server did not re-attach to, is auto-deleted now."""
        if not self._reset:
            return
        queues, self._reset = self._reset, set()
        for queue in queues:
            _maybe_unused(queue)

    def _master_queue(self, name: str, taking: bool = False) -> Queue | AMQPError:
        """The queue mastered here; ``taking``: for a get or a purge, which a queue being
        handed over refuses as not mastered (the proxy asks its next owner)."""
        vhost = self.vhost()
        queue = vhost.queues.get(name) if vhost is not None else None
        if queue is None or queue.exclusive:
            return AMQPError(NOT_FOUND, f"no queue '{name}' in vhost '{self.vhost_name}'")
        if not queue.local or (taking and getattr(queue, "moving", None) is not None):
            return AMQPError(INTERNAL_ERROR, f"queue '{name}' is not mastered on this server")
        return queue

    def _refuse(self, out: Outbound, req: int, error: AMQPError) -> None:
        self.transport.batch(out).reply(
            req, error.reply_code, error.text, hard=error.reply_code >= 500
        )

    def _consume(self, out: Outbound, r: rec.Consume) -> None:
        queue = self._master_queue(r.queue)
        if isinstance(queue, AMQPError):
            self._refuse(out, r.req, queue)
            return
        mine = self.consumers.setdefault(out.spid, {})
        if r.tag in mine:
            self._refuse(out, r.req, AMQPError(NOT_ALLOWED, f"consumer tag '{r.tag}' in use"))
            return
        consumer = RemoteConsumer(self, out, queue, r)

        def answered(error: AMQPError | None) -> None:
            if error is not None:
                self._refuse(out, r.req, error)
                return
            mine[r.tag] = consumer
            self.transport.batch(out).reply(r.req, 0)  # before its first delivery

        queue.add_consumer(consumer, answered)

    def _cancel(self, out: Outbound, r: rec.Cancel) -> None:
        consumer = self.consumers.get(out.spid, {}).pop(r.tag, None)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)  # the last one anywhere: auto-delete

    def _get(self, out: Outbound, r: rec.Get) -> None:
        queue = self._master_queue(r.queue, taking=True)
        if isinstance(queue, AMQPError):
            self._refuse(out, r.req, queue)
            return
        got = queue.take(r.no_ack, _GetFor(self.transport, out))
        batch = self.transport.batch(out)
        if got is None:
            batch.reply(r.req, 0)  # get-empty
            return
        message, redelivered, remaining = got
        delivery = 0
        if not r.no_ack:
            delivery = self._hold(out, queue, message, None)
        batch.got(
            r.req,
            delivery,
            redelivered,
            remaining,
            message.exchange,
            message.routing_key,
            message.props_raw,
            message.body,
        )

    def _with_queue(
        self, out: Outbound, req: int, name: str, answer: object, taking: bool = False
    ) -> None:
        queue = self._master_queue(name, taking)
        if isinstance(queue, AMQPError):
            self._refuse(out, req, queue)
            return
        a, b = answer(queue)  # type: ignore[operator]
        self.transport.batch(out).reply(req, 0, "", a, b)

    # -- deliveries --------------------------------------------------------------------

    def _hold(
        self, out: Outbound, queue: Queue, message: Message, rc: RemoteConsumer | None
    ) -> int:
        self._delivery += 1
        held = self.deliveries.get(out.spid)
        if held is None:
            held = self.deliveries[out.spid] = {}
        held[self._delivery] = (queue, message, rc)
        queue.unacked += 1
        return self._delivery

    def deliver(
        self, rc: RemoteConsumer, queue: Queue, message: Message, redelivered: bool
    ) -> None:
        out = rc.out
        delivery = 0 if rc.no_ack else self._hold(out, queue, message, rc)
        rc.inflight += 1
        self.transport.batch(out).deliver(
            rc.tag,
            delivery,
            redelivered,
            message.exchange,
            message.routing_key,
            message.props_raw,
            message.body,
        )

    def _settle(self, out: Outbound, ids: list[int], outcome: str) -> None:
        held = self.deliveries.get(out.spid)
        if not held:
            return
        by_queue: dict[Queue, list[Message]] = {}
        for delivery in ids:
            entry = held.pop(delivery, None)
            if entry is None:
                continue  # settled already, or released with its session
            queue, message, rc = entry
            queue.unacked -= 1
            if rc is not None and rc.by_ack:
                rc.inflight -= 1
            by_queue.setdefault(queue, []).append(message)
        for queue, messages in by_queue.items():
            getattr(queue, outcome)(messages)
            queue.dispatch()  # credit came back

    def _credit(self, out: Outbound, r: rec.Credit) -> None:
        consumer = self.consumers.get(out.spid, {}).get(r.tag)
        if consumer is not None:
            consumer.inflight = max(0, consumer.inflight - r.count)
            consumer.queue.dispatch()

    # -- sessions ----------------------------------------------------------------------

    def consumer_gone(self, rc: RemoteConsumer) -> None:
        """Its queue was deleted."""
        self.consumers.get(rc.out.spid, {}).pop(rc.tag, None)

    def release(self, out: Outbound, *, gone: bool) -> None:
        """Detach every consumer of the server and requeue what it held (redelivered).

        ``gone``: the server went away, so an auto-delete queue it was the last
        consumer of goes; after a session reset its consumers come right back."""
        touched: set[Queue] = set()
        for consumer in self.consumers.pop(out.spid, {}).values():
            queue = consumer.queue
            if queue.detach(consumer):
                touched.add(queue)
        held = self.deliveries.pop(out.spid, {})
        by_queue: dict[Queue, list[Message]] = {}
        for _delivery, (queue, message, _rc) in sorted(held.items()):
            queue.unacked -= 1
            by_queue.setdefault(queue, []).append(message)
        for queue, messages in by_queue.items():
            queue.requeue(messages)
        if held:
            log.warning("requeued %d deliveries of %s", len(held), out.spid)
        if gone:
            for queue in touched:
                _maybe_unused(queue)
        else:
            self._reset |= touched

    def release_queue(self, queue: Queue) -> None:
        """This server stops owning ``queue`` (its placement moved): its consumers from
        elsewhere are detached (their servers re-attach at the new owner) and what
        they held goes back into it first."""
        for spid, consumers in self.consumers.items():
            for tag, consumer in list(consumers.items()):
                if consumer.queue is queue:
                    del consumers[tag]
                    queue.detach(consumer)
            held = self.deliveries.get(spid, {})
            mine = sorted(d for d, (q, _m, _c) in held.items() if q is queue)
            if mine:
                messages = [held.pop(d)[1] for d in mine]
                queue.unacked -= len(messages)
                queue.requeue(messages)

    def link_ready(self, out: Outbound) -> None:
        voided = self.voided.get(out.spid)
        if voided is not None:  # a new link: told (again) after the grace
            voided.link_at = self.peers.clock()
            voided.told = False
        for consumer in list(self.consumers.get(out.spid, {}).values()):
            consumer.queue.dispatch()


def _stat(queue: Queue) -> tuple[int, int]:
    """A declare's counts for another server: a use of the queue (x-expires)."""
    queue.touch()
    return queue.message_count, queue.consumer_count


def _maybe_unused(queue: Queue) -> None:
    queue.check_unused()
