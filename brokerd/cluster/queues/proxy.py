"""A server's side of the shared queues it does not own: proxied consumers and gets.

A shared queue is owned (mastered) by one server, the primary its placement in
the state log names (whoever is root). Everywhere else it is a proxy
(``SharedQueue`` in its proxy role), and this module does the proxy's talking
to the owner, within one *session* per owner (``records.Session`` opens one;
the owner then releases everything of the previous one). A local consumer is
attached at its queue's owner under its cluster tag ``spid/connection/tag``;
the owner's deliveries wait in the consumer's ``pending`` until it is ready
(prefetch, flow, socket) and carry the session and the owner's delivery id in
``Message.ref``, so the channel's acks, rejects and requeues go back as ``Ack``
/ ``Reject`` records. When a session ends (a link with the owner dropped, the
owner went away) every consumer attached under it is attached again under a new
one; settlements of deliveries from an old session are dropped: the owner has
already requeued those messages."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from brokerd.cluster.plane import records as rec
from brokerd.cluster.queues.proxied import (
    MAX_WAITING,
    RETRIES,
    Members,
    ProxiedConsumer,
    Request,
    Session,
    error_of,
    is_current,
    is_gone,
    is_ok,
    missing,
    not_mastered,
    not_ready,
    unavailable,
    window_of,
)
from brokerd.model.errors import (
    INTERNAL_ERROR,
)
from brokerd.model.interfaces import ConsumerSink, Reply
from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.cluster.plane.outbound import Outbound
    from brokerd.cluster.plane.transport import Transport
    from brokerd.cluster.queues.shared import SharedQueue

log = logging.getLogger("brokerd.cluster.queues.proxy")


class ProxySide:
    """This server's proxied consumers and requests, and its sessions with the owners."""

    def __init__(
        self, transport: Transport, members: Members, root_spid: Callable[[], str | None]
    ) -> None:
        self.transport = transport
        self.members = members
        self.root_spid = root_spid
        #: by owner spid
        self.sessions: dict[str, Session] = {}
        self._epoch = 0
        self._req = 0
        self.requests: dict[int, Request] = {}
        self.by_tag: dict[str, ProxiedConsumer] = {}
        self.waiting: list[Request] = []
        #: requests whose owner answered 404 for a queue this server still holds: it
        #: dropped the queue (auto-delete, x-expires) before the root's ordered delete
        #: reached here, or it has not applied the queue's declare yet (``stale``)
        self.stale: dict[SharedQueue, list[Request]] = {}
        self._owing: set[ProxiedConsumer] = set()

    @property
    def session(self) -> Session | None:
        """The session with the root (the status shows it)."""
        root = self.root_spid()
        return self.sessions.get(root) if root is not None else None

    # -- sessions ------------------------------------------------------------------

    def _owners(self) -> set[str]:
        """The servers this one needs a session with: the root, and the owners of the
        classic queues it proxies."""
        wanted = {state.queue.owner_spid() for state in self.by_tag.values()}
        wanted |= {r.queue.owner_spid() for r in self.waiting if r.queue is not None}
        root = self.root_spid()
        if root is not None:
            wanted.add(root)
        wanted.discard(None)
        wanted.discard(self.transport.spid)
        return wanted  # type: ignore[return-value]

    def session_check(self) -> None:
        """Open a session with each owner there is one to open with."""
        if not self._synced():
            return  # this server's wiring is not the cluster's yet
        for peer in sorted(self._owners()):
            if peer not in self.sessions:
                self._open(peer)

    def _open(self, peer: str) -> Session | None:
        out = self.transport.out(peer)
        if not out.up:
            return None
        self._epoch += 1
        session = self.sessions[peer] = Session(peer, self._epoch, out)
        self.transport.batch(out).session(self._epoch)
        log.info("session opened with=%s epoch=%d", peer, self._epoch)
        for state in list(self.by_tag.values()):
            if state.session is None and state.queue.owner_spid() == peer:
                self._send_consume(session, state)
        waiting, self.waiting = self.waiting, []
        for request in waiting:
            if request.queue is not None and request.queue.owner_spid() == peer:
                self._send(session, request)
            else:
                self.waiting.append(request)
        return session

    def session_lost(self, spid: str) -> None:
        session = self.sessions.pop(spid, None)
        if session is None:
            return
        log.warning("session with %s ended: re-attaching its consumers", spid)
        for req, request in list(self.requests.items()):
            if request.session is session:
                del self.requests[req]
                if request.consume is None:
                    self.waiting.append(request)  # asked again of the next owner
        for state in self.by_tag.values():
            if state.session is session:
                self._unattach(state)

    def voided(self, spid: str) -> None:
        """The owner ended our session on its own (``records.Void``): open a new one."""
        if spid in self.sessions:
            self.session_lost(spid)
            self.session_check()

    def tick(self) -> None:
        """Open sessions that are due, ask again what an owner refused for want of
        its placement, give up on what waited too long for an owner."""
        self.session_check()
        for state in list(self.by_tag.values()):
            if state.session is None:
                session = self._session_for(state.queue)
                if session is not None and state.session is None:
                    self._send_consume(session, state)
        self._ask_stale_again(self.members.clock())
        waiting, self.waiting = self.waiting, []
        for request in waiting:
            session = self._session_for(request.queue) if request.queue is not None else None
            if session is not None:
                self._send(session, request)
            else:
                self.waiting.append(request)
        members = self.members
        now = members.clock()
        limit = members.config.open_timeout
        expired = [r for r in self.waiting if now - r.created > limit]
        if expired:
            self.waiting = [r for r in self.waiting if now - r.created <= limit]
            for request in expired:
                request.answer(not_ready(members, request.queue))
        for state in list(self.by_tag.values()):
            if state.reply is not None and not state.attached and now - state.created > limit:
                self._drop(state)
                reply, state.reply = state.reply, None
                reply(not_ready(members, state.queue))

    # -- requests ----------------------------------------------------------------------

    def _next_req(self) -> int:
        self._req += 1
        return self._req

    def _send(self, session: Session, request: Request) -> None:
        req = self._next_req()
        request.session = session
        self.requests[req] = request
        request.issue(session, req)

    def _session_for(self, queue: SharedQueue) -> Session | None:
        owner = queue.owner_spid()
        if owner is None or owner == self.transport.spid:
            return None
        session = self.sessions.get(owner)
        if session is None and self._synced():
            session = self._open(owner)
        return session

    def _synced(self) -> bool:
        """This server's wiring is the root's: sessions may open (the queues they name
        exist at their owners)."""
        root = self.root_spid()
        return root is not None and (root == self.transport.spid or self.members.in_sync(root))

    def _ask(
        self,
        queue: SharedQueue,
        issue: Callable[[Session, int], None],
        answer: Callable[[Any], None],
        here: Callable[[], None] | None = None,
    ) -> None:
        if unavailable(queue):
            answer(not_ready(self.members, queue))
            return
        request = Request(queue, issue, answer, self.members.clock(), here=here)
        session = self._session_for(queue)
        if session is not None:
            self._send(session, request)
        elif len(self.waiting) < MAX_WAITING:
            self.waiting.append(request)
        else:
            answer(not_ready(self.members, queue))

    def get(self, queue: SharedQueue, no_ack: bool, reply: Reply) -> None:
        asked: list[Session] = []

        def issue(session: Session, req: int) -> None:
            asked.append(session)
            self.transport.batch(session.out).get(req, queue.name, no_ack)

        def answer(r: Any) -> None:
            if isinstance(r, rec.Got):
                message = Message(r.exchange, r.routing_key, r.props, r.body)
                message.ref = (asked[-1], r.delivery) if r.delivery else None
                reply((message, r.redelivered, r.remaining))
            elif isinstance(r, rec.Reply) and r.code == 0:
                reply(None)  # get-empty
            else:
                reply(error_of(r))

        self._ask(queue, issue, answer)

    def purge(self, queue: SharedQueue, reply: Reply) -> None:
        def issue(session: Session, req: int) -> None:
            self.transport.batch(session.out).purge(req, queue.name)

        self._ask(
            queue,
            issue,
            lambda r: reply(r.a if is_ok(r) else error_of(r)),
            lambda: queue.purge(reply),
        )

    def stat(self, queue: SharedQueue, reply: Reply) -> None:
        def issue(session: Session, req: int) -> None:
            self.transport.batch(session.out).stat(req, queue.name)

        self._ask(
            queue,
            issue,
            lambda r: reply((r.a, r.b) if is_ok(r) else error_of(r)),
            lambda: queue.stat(reply),
        )

    # -- consumers ---------------------------------------------------------------------

    def _tag(self, consumer: ConsumerSink) -> str:
        base = f"{self.transport.spid}/{consumer.connection_id}/{consumer.tag}"
        tag, n = base, 1
        while tag in self.by_tag:  # one tag on two channels of a connection
            n += 1
            tag = f"{base}~{n}"
        return tag

    def attach(self, queue: SharedQueue, consumer: ConsumerSink, reply: Reply | None) -> None:
        """basic.consume on a proxied queue: its owner decides (exclusivity counts
        consumers everywhere); ``reply`` answers when it has."""
        if unavailable(queue) and reply is not None:
            reply(not_ready(self.members, queue))
            return
        state = ProxiedConsumer(queue, consumer, self._tag(consumer), reply, self.members.clock())
        queue.proxied[consumer] = state
        self.by_tag[state.tag] = state
        session = self._session_for(queue)  # a session it opens sends the consume
        if session is not None and state.session is None:
            self._send_consume(session, state)

    def adopt(self, queue: SharedQueue) -> None:
        """The queue became a proxy: attach its local consumers at its new owner."""
        now = self.members.clock()
        session = self._session_for(queue)
        for consumer in queue.consumers:
            if consumer in queue.proxied:
                continue
            state = ProxiedConsumer(queue, consumer, self._tag(consumer), None, now)
            queue.proxied[consumer] = state
            self.by_tag[state.tag] = state
            if session is not None and state.session is None:
                self._send_consume(session, state)

    def forget(self, queue: SharedQueue) -> None:
        """The queue's owner is this server now: its consumers are local ones."""
        for consumer, state in list(queue.proxied.items()):
            self.by_tag.pop(state.tag, None)
            self._owing.discard(state)
            reply, state.reply = state.reply, None
            if reply is not None:  # its consume was still waiting for the old owner
                queue.add_consumer(consumer, reply)  # served here now (its owner role)
        queue.proxied.clear()
        waiting, self.waiting = self.waiting, []
        for request in waiting:  # asked of the old owner, answered here now
            if request.queue is not queue:
                self.waiting.append(request)
            elif request.here is not None:
                request.here()
            else:
                request.answer(not_ready(self.members, queue))

    def replaced(self, queue: SharedQueue) -> None:
        """A proxied classic queue has another owner now (or none): its consumers
        leave the old owner and attach at the new one. With nobody to own it they are
        cancelled, as RabbitMQ cancels consumers of a queue whose node went down."""
        owner = queue.owner_spid()
        for consumer, state in list(queue.proxied.items()):
            session = state.session
            if session is not None and session.peer == owner:
                continue
            self._leave(state)
            self._unattach(state)
            if owner is None:
                self._drop(state)
                reply, state.reply = state.reply, None
                if reply is not None:
                    reply(not_ready(self.members, queue))
                else:
                    queue.detach(consumer)
                    consumer.cancelled(queue)
                continue
            new = self._session_for(queue)
            if new is not None and state.session is None:
                self._send_consume(new, state)

    def _leave(self, state: ProxiedConsumer) -> None:
        """Cancel the consumer at its owner, and give back what it never handed on
        (nothing to tell a session that ended: the owner released it all)."""
        session = state.session
        if session is None or self.sessions.get(session.peer) is not session:
            return
        returned = [m.ref[1] for m, _ in state.pending if is_current(m, session)]
        batch = self.transport.batch(session.out)
        batch.cancel(state.tag)
        if returned:
            batch.reject(returned, True)

    def _unattach(self, state: ProxiedConsumer) -> None:
        """Its session is over for it: attached again under the next one."""
        state.session = None
        state.attached = False
        state.pending.clear()
        state.owed = 0
        self._owing.discard(state)

    def _send_consume(self, session: Session, state: ProxiedConsumer) -> None:
        consumer = state.consumer
        r = rec.Consume(
            0,
            state.tag,
            state.queue.name,
            window_of(consumer),
            bool(getattr(consumer, "no_ack", False)),
            consumer.exclusive,
            consumer.no_local,
            f"{self.transport.spid}/{consumer.connection_id}",
        )
        request = Request(None, lambda s, req: None, lambda r: self._consumed(state, r), 0.0, state)
        request.session = state.session = session
        r.req = self._next_req()
        self.requests[r.req] = request
        self.transport.batch(session.out).consume(r)

    def _consumed(self, state: ProxiedConsumer, r: Any) -> None:
        queue, consumer = state.queue, state.consumer
        if state.tag not in self.by_tag:
            return  # cancelled meanwhile (the cancel went after the consume)
        if is_ok(r):
            state.attached = True
            reply, state.reply = state.reply, None
            if reply is not None:
                queue.attach(consumer)  # the owner accepted it: listed here
                reply(None)
            return
        error = error_of(r)
        if error.reply_code == INTERNAL_ERROR:
            # the owner moved meanwhile, or the consume reached the new owner before
            # the placement did: attached again (``tick``)
            self._unattach(state)
            return
        self._drop(state)
        reply, state.reply = state.reply, None
        if reply is not None:
            reply(error)
        else:  # it was attached before and cannot be now (its queue is gone there)
            queue.detach(consumer)
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
        if not queue.deleted:
            self._leave(state)
        state.pending.clear()

    # -- deliveries --------------------------------------------------------------------

    def receive(self, out: Outbound, r: rec.Record) -> None:
        """A ``Deliver``, ``Got`` or ``Reply`` from an owner."""
        session = self.sessions.get(out.spid)
        if session is None or out is not session.out:
            return  # from a session that ended: the owner has released it
        if isinstance(r, rec.Deliver):
            self._deliver(session, r)
            return
        request = self.requests.get(r.req)  # type: ignore[union-attr]
        if request is not None and request.session is session:
            del self.requests[r.req]  # type: ignore[union-attr]
            if not_mastered(r) and request.consume is None and request.retries < RETRIES:
                # it reached the owner before the placement did: asked again (``tick``)
                request.retries += 1
                request.session = None
                self.waiting.append(request)
                return
            gone = is_gone(r) and request.queue is not None and request.consume is None
            if gone and self._stale(request):
                return
            request.answer(r)

    # -- a queue its owner no longer has -------------------------------------------------

    def _stale(self, request: Request) -> bool:
        """The owner has no such queue, but this server still does: this server's view
        is behind the cluster's. Hold the answer until the root's ordered delete
        removes the queue here (``queue_gone``: the 404 is then this server's view
        too, and a declare that follows makes the queue anew), or ask again at the
        next tick (the owner had not applied the declare yet), a few times."""
        queue = request.queue
        assert queue is not None
        if queue.deleted or request.retries >= RETRIES:
            return False
        request.retries += 1
        request.session = None
        request.created = self.members.clock()
        self.stale.setdefault(queue, []).append(request)
        return True

    def queue_gone(self, queue: Any) -> None:
        """VirtualHost hook: a queue was removed here; what waited for that is answered."""
        for request in self.stale.pop(queue, ()):
            request.answer(missing(queue))

    def _ask_stale_again(self, now: float) -> None:
        """Stale requests a heartbeat timeout old are asked of the owner again."""
        limit = self.members.config.heartbeat_timeout
        for queue, requests in list(self.stale.items()):
            due = [r for r in requests if now - r.created >= limit]
            if not due:
                continue
            kept = [r for r in requests if now - r.created < limit]
            if kept:
                self.stale[queue] = kept
            else:
                del self.stale[queue]
            self.waiting.extend(due)

    def _deliver(self, session: Session, r: rec.Deliver) -> None:
        state = self.by_tag.get(r.tag)
        message = Message(r.exchange, r.routing_key, r.props, r.body)
        if r.delivery:
            message.ref = (session, r.delivery)
        if state is None or not state.attached or state.session is not session:
            if r.delivery:  # cancelled meanwhile: back to the queue
                self.transport.batch(session.out).reject([r.delivery], True)
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
            queue.inner.stats_out += 1
            consumer.deliver(queue, message, redelivered)
            delivered += 1
        if delivered and state.windowed:
            state.owed += delivered
            self._owing.add(state)
            self.transport.schedule()

    def pay_credit(self, out: Outbound) -> None:
        """At a flush: tell an owner how many deliveries windowed consumers took."""
        session = self.sessions.get(out.spid)
        if not self._owing or session is None or out is not session.out:
            return
        paid = []
        for state in self._owing:
            if state.session is session:
                if state.owed:
                    out.batch.credit(state.tag, state.owed)
                    state.owed = 0
                paid.append(state)
        self._owing.difference_update(paid)

    def settle(self, messages: Any, outcome: str) -> None:
        """The channel settled deliveries of current sessions: tell their owners."""
        by_session: dict[Session, list[int]] = {}
        for m in messages:
            ref = m.ref
            if ref is None:
                continue
            session = ref[0]
            if session is not None and self.sessions.get(session.peer) is session:
                by_session.setdefault(session, []).append(ref[1])
        for session, ids in by_session.items():
            batch = self.transport.batch(session.out)
            if outcome == "ack":
                batch.ack(ids)
            else:
                batch.reject(ids, outcome == "requeue")
