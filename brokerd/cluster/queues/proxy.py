"""A server's side of the shared queues it does not master: proxied consumers and gets.

Every shared queue a non-root server holds is a proxy (``SharedQueue`` in
its proxy role); this module does its talking to the root, within one
*session* with it (``records.Session`` opens one; the root then releases
everything of the previous one). A local consumer is attached at the root
under its cluster tag ``spid/connection/tag``; the root's deliveries wait in
the consumer's ``pending`` until it is ready (prefetch, flow, socket) and
carry the root's delivery id in ``Message.ref``, so the channel's acks,
rejects and requeues go back as ``Ack`` / ``Reject`` records. When the
session ends (the root changed, a link dropped) every consumer is attached
again under a new one; settlements of deliveries from an old session are
dropped: the root has already requeued those messages.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from brokerd.cluster.plane import records as rec
from brokerd.model.errors import INTERNAL_ERROR, AMQPError, ChannelError, ConnectionError_
from brokerd.model.interfaces import ConsumerSink, Reply
from brokerd.model.message import Message
from brokerd.model.queue import Queue

if TYPE_CHECKING:
    from brokerd.cluster.plane.forwarding import MessagePlane, Outbound
    from brokerd.cluster.queues.shared import SharedQueue

log = logging.getLogger("brokerd.cluster.queues.proxy")

#: requests (gets, purges, counts) that may wait for a root at once; more are refused
MAX_WAITING = 10_000


class Session:
    """One attachment of this server's proxies to a root."""

    __slots__ = ("epoch", "out", "root")

    def __init__(self, root: str, epoch: int, out: Outbound) -> None:
        self.root = root
        self.epoch = epoch
        self.out = out


class ProxiedConsumer:
    """A local consumer of a proxied shared queue, as attached at the root."""

    __slots__ = (
        "attached",
        "consumer",
        "created",
        "owed",
        "pending",
        "queue",
        "reply",
        "tag",
        "windowed",
    )

    def __init__(
        self, queue: SharedQueue, consumer: ConsumerSink, tag: str, reply: Reply | None, now: float
    ) -> None:
        self.queue = queue
        self.consumer = consumer
        self.tag = tag
        #: the client's consume-ok, until the root first accepts it
        self.reply = reply
        self.created = now
        self.attached = False
        #: deliveries from the root the consumer was not ready for yet
        self.pending: deque[tuple[Message, bool]] = deque()
        #: no prefetch window in ack mode: credit goes back as deliveries are written
        self.windowed = bool(getattr(consumer, "no_ack", False)) or not _window(consumer)
        self.owed = 0


def _window(consumer: ConsumerSink) -> int:
    return int(getattr(consumer, "window", 0) or 0)


@dataclass
class Request:
    """A get, purge or count asked of the root, re-asked under a new session."""

    issue: Callable[[Session, int], None]
    answer: Callable[[Any], None]
    created: float
    consume: ProxiedConsumer | None = None
    retries: int = field(default=0)


class ProxySide:
    """This server's proxied consumers and requests, and its session with the root."""

    def __init__(self, plane: MessagePlane) -> None:
        self.plane = plane
        self.session: Session | None = None
        self._epoch = 0
        self._req = 0
        self.requests: dict[int, Request] = {}
        self.by_tag: dict[str, ProxiedConsumer] = {}
        self.waiting: list[Request] = []
        self._owing: set[ProxiedConsumer] = set()

    # -- the session -------------------------------------------------------------

    def session_check(self) -> None:
        """Open a session with the root when there is one to open."""
        plane = self.plane
        root = plane.root_spid()
        if root is None or root == plane.spid:
            return
        if self.session is not None and self.session.root == root:
            return
        out = plane.out(root)
        if not out.up or not plane.members.in_sync(root):
            return
        self._epoch += 1
        session = self.session = Session(root, self._epoch, out)
        plane.batch(out).session(self._epoch)
        log.info("session opened root=%s epoch=%d", root, self._epoch)
        for state in list(self.by_tag.values()):
            self._send_consume(session, state)
        waiting, self.waiting = self.waiting, []
        for request in waiting:
            self._send(session, request)

    def session_lost(self, spid: str) -> None:
        session = self.session
        if session is None or session.root != spid:
            return
        self.session = None
        log.warning("session with root %s ended: re-attaching consumers", spid)
        requests, self.requests = self.requests, {}
        for request in requests.values():
            if request.consume is None:
                self.waiting.append(request)  # asked again of the next root
        for state in self.by_tag.values():
            state.attached = False
            state.pending.clear()
            state.owed = 0
        self._owing.clear()

    def voided(self, spid: str) -> None:
        """The root ended our session on its own (``records.Void``): open a new one."""
        if self.session is not None and self.session.root == spid:
            self.session_lost(spid)
            self.session_check()

    def tick(self) -> None:
        """Open a session if one is due; give up on what waited too long for a root."""
        self.session_check()
        members = self.plane.members
        now = members.clock()
        limit = members.config.open_timeout
        expired = [r for r in self.waiting if now - r.created > limit]
        if expired:
            self.waiting = [r for r in self.waiting if now - r.created <= limit]
            for request in expired:
                request.answer(_not_ready(members))
        for state in list(self.by_tag.values()):
            if state.reply is not None and not state.attached and now - state.created > limit:
                self._drop(state)
                reply, state.reply = state.reply, None
                reply(_not_ready(members))

    # -- requests ----------------------------------------------------------------------

    def _next_req(self) -> int:
        self._req += 1
        return self._req

    def _send(self, session: Session, request: Request) -> None:
        req = self._next_req()
        self.requests[req] = request
        request.issue(session, req)

    def _ask(self, issue: Callable[[Session, int], None], answer: Callable[[Any], None]) -> None:
        request = Request(issue, answer, self.plane.members.clock())
        if self.session is not None:
            self._send(self.session, request)
        elif len(self.waiting) < MAX_WAITING:
            self.waiting.append(request)
        else:
            answer(_not_ready(self.plane.members))

    def get(self, queue: Queue, no_ack: bool, reply: Reply) -> None:
        def issue(session: Session, req: int) -> None:
            self.plane.batch(session.out).get(req, queue.name, no_ack)

        def answer(r: Any) -> None:
            if isinstance(r, rec.Got):
                message = Message(r.exchange, r.routing_key, r.props, r.body)
                message.ref = (self.session, r.delivery) if r.delivery else None
                reply((message, r.redelivered, r.remaining))
            elif isinstance(r, rec.Reply) and r.code == 0:
                reply(None)  # get-empty
            else:
                reply(_error(r))

        self._ask(issue, answer)

    def purge(self, queue: Queue, reply: Reply) -> None:
        def issue(session: Session, req: int) -> None:
            self.plane.batch(session.out).purge(req, queue.name)

        self._ask(issue, lambda r: reply(r.a if _ok(r) else _error(r)))

    def stat(self, queue: Queue, reply: Reply) -> None:
        def issue(session: Session, req: int) -> None:
            self.plane.batch(session.out).stat(req, queue.name)

        self._ask(issue, lambda r: reply((r.a, r.b) if _ok(r) else _error(r)))

    # -- consumers ---------------------------------------------------------------------

    def _tag(self, consumer: ConsumerSink) -> str:
        base = f"{self.plane.spid}/{consumer.connection_id}/{consumer.tag}"
        tag, n = base, 1
        while tag in self.by_tag:  # one tag on two channels of a connection
            n += 1
            tag = f"{base}~{n}"
        return tag

    def attach(self, queue: SharedQueue, consumer: ConsumerSink, reply: Reply | None) -> None:
        """basic.consume on a proxied queue: the root decides (exclusivity counts
        consumers everywhere); ``reply`` answers when it has."""
        state = ProxiedConsumer(
            queue, consumer, self._tag(consumer), reply, self.plane.members.clock()
        )
        queue.proxied[consumer] = state
        self.by_tag[state.tag] = state
        if self.session is not None:
            self._send_consume(self.session, state)

    def adopt(self, queue: SharedQueue) -> None:
        """The queue became a proxy: attach its local consumers at the new root."""
        now = self.plane.members.clock()
        for consumer in queue.consumers:
            if consumer in queue.proxied:
                continue
            state = ProxiedConsumer(queue, consumer, self._tag(consumer), None, now)
            queue.proxied[consumer] = state
            self.by_tag[state.tag] = state
            if self.session is not None:
                self._send_consume(self.session, state)

    def forget(self, queue: SharedQueue) -> None:
        """The queue became the master here: its consumers are local ones now."""
        for consumer, state in list(queue.proxied.items()):
            self.by_tag.pop(state.tag, None)
            self._owing.discard(state)
            reply, state.reply = state.reply, None
            if reply is not None:  # its consume was still waiting for the old root
                Queue.add_consumer(queue, consumer, reply)
        queue.proxied.clear()

    def _send_consume(self, session: Session, state: ProxiedConsumer) -> None:
        consumer = state.consumer
        r = rec.Consume(
            0,
            state.tag,
            state.queue.name,
            _window(consumer),
            bool(getattr(consumer, "no_ack", False)),
            consumer.exclusive,
            consumer.no_local,
            f"{self.plane.spid}/{consumer.connection_id}",
        )
        request = Request(lambda s, req: None, lambda r: self._consumed(state, r), 0.0, state)
        r.req = self._next_req()
        self.requests[r.req] = request
        self.plane.batch(session.out).consume(r)

    def _consumed(self, state: ProxiedConsumer, r: Any) -> None:
        queue, consumer = state.queue, state.consumer
        if state.tag not in self.by_tag:
            return  # cancelled meanwhile (the cancel went after the consume)
        if _ok(r):
            state.attached = True
            reply, state.reply = state.reply, None
            if reply is not None:
                queue.consumers.append(consumer)
                queue.had_consumers = True
                reply(None)
            return
        error = _error(r)
        if error.reply_code == INTERNAL_ERROR:
            return  # the root moved meanwhile: attached again under the next session
        self._drop(state)
        reply, state.reply = state.reply, None
        if reply is not None:
            reply(error)
        else:  # it was attached before and cannot be now (its queue is gone there)
            if consumer in queue.consumers:
                queue.consumers.remove(consumer)
            consumer.cancelled(queue)

    def _drop(self, state: ProxiedConsumer) -> None:
        self.by_tag.pop(state.tag, None)
        state.queue.proxied.pop(state.consumer, None)
        self._owing.discard(state)

    def detach(self, queue: SharedQueue, consumer: ConsumerSink) -> None:
        """basic.cancel (or the channel went): deliveries it never got go back."""
        state = queue.proxied.get(consumer)
        if state is None:
            return
        self._drop(state)
        session = self.session
        if session is None or queue.deleted:
            return
        returned = [m.ref[1] for m, _ in state.pending if _current(m, session)]
        state.pending.clear()
        batch = self.plane.batch(session.out)
        batch.cancel(state.tag)
        if returned:
            batch.reject(returned, True)

    # -- deliveries --------------------------------------------------------------------

    def receive(self, out: Outbound, r: rec.Record) -> None:
        """A ``Deliver``, ``Got`` or ``Reply`` from the root."""
        session = self.session
        if session is None or out is not session.out:
            return  # from a session that ended: the root has released it
        if isinstance(r, rec.Deliver):
            self._deliver(session, r)
            return
        request = self.requests.pop(r.req, None)  # type: ignore[union-attr]
        if request is not None:
            request.answer(r)

    def _deliver(self, session: Session, r: rec.Deliver) -> None:
        state = self.by_tag.get(r.tag)
        message = Message(r.exchange, r.routing_key, r.props, r.body)
        if r.delivery:
            message.ref = (session, r.delivery)
        if state is None or not state.attached:
            if r.delivery:  # cancelled meanwhile: back to the queue
                self.plane.batch(session.out).reject([r.delivery], True)
            return
        state.pending.append((message, r.redelivered))
        if len(state.pending) == 1:
            self.drain(state)

    def drain(self, state: ProxiedConsumer) -> None:
        """Hand waiting deliveries to the consumer while it is ready."""
        consumer, pending, queue = state.consumer, state.pending, state.queue
        delivered = 0
        while pending and consumer.ready():
            message, redelivered = pending.popleft()
            queue.stats_out += 1
            consumer.deliver(queue, message, redelivered)
            delivered += 1
        if delivered and state.windowed:
            state.owed += delivered
            self._owing.add(state)
            self.plane.schedule()

    def pay_credit(self, out: Outbound) -> None:
        """At a flush: tell the root how many deliveries windowed consumers took."""
        session = self.session
        if not self._owing or session is None or out is not session.out:
            return
        for state in self._owing:
            if state.owed:
                out.batch.credit(state.tag, state.owed)
                state.owed = 0
        self._owing.clear()

    def settle(self, messages: Any, outcome: str) -> None:
        """The channel settled deliveries of this session's root: tell it."""
        session = self.session
        if session is None:
            return
        ids = [m.ref[1] for m in messages if _current(m, session)]
        if not ids:
            return
        batch = self.plane.batch(session.out)
        if outcome == "ack":
            batch.ack(ids)
        else:
            batch.reject(ids, outcome == "requeue")


def _current(message: Message, session: Session) -> bool:
    ref = message.ref
    return ref is not None and ref[0] is session  # type: ignore[index]


def _ok(r: Any) -> bool:
    return isinstance(r, rec.Reply) and r.code == 0


def _error(r: Any) -> AMQPError:
    if isinstance(r, AMQPError):
        return r
    if isinstance(r, rec.Reply):
        cls = ConnectionError_ if r.hard else ChannelError
        return cls(r.code, r.text)
    return ConnectionError_(INTERNAL_ERROR, "unexpected answer from the root")


def _not_ready(members: Any) -> AMQPError:
    reason = members.not_ready_reason or "no session with the root"
    return ConnectionError_(INTERNAL_ERROR, f"cluster not ready: {reason}")
