"""Wiring replication: the cluster state, ordered by the root (seed 000).

Exchanges, shared queues, their bindings and the meta-bindings of private
queues are global. A change made on the root is applied there and ordered
at once. A change asked of another server is *delegated*: it goes to the
root untouched (``cluster.change``), the root validates it by applying it,
numbers it and broadcasts it (``cluster.state``), and every server, the
asking one included, applies it from that ordered stream; the client gets
its -Ok with the root's result (counts) only then. A change the root
refuses comes back as ``cluster.refuse`` with the AMQP error; one that
changes nothing (declaring what exists) as ``cluster.result``. A server that
joins, or finds a gap in the stream, takes the root's compacted log
(``cluster.sync``) before it serves clients.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.cluster.wiring import entries as rep
from brokerd.cluster.wiring import local
from brokerd.cluster.wiring import statelog as sl
from brokerd.cluster.wiring.applied import Acknowledgements
from brokerd.cluster.wiring.catchup import SYNC, SYNC_REQUEST, StateSync
from brokerd.cluster.wiring.statelog import Entry, compact, freeze
from brokerd.model.errors import (
    INTERNAL_ERROR,
    NOT_FOUND,
    PRECONDITION_FAILED,
    AMQPError,
    ChannelError,
    ConnectionError_,
)

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership
    from brokerd.model.broker import Broker
    from brokerd.model.queue import Queue
    from brokerd.model.vhost import VirtualHost
    from brokerd.protocol.connection import Connection
    from brokerd.protocol.hooks import WiringDone

log = logging.getLogger("brokerd.cluster")

CHANGE = "cluster.change"
STATE = "cluster.state"
REFUSE = "cluster.refuse"
RESULT = "cluster.result"
#: a follower applied the stream up to a change the root holds an answer for
APPLIED = "cluster.applied"
KINDS = (CHANGE, STATE, REFUSE, RESULT, SYNC_REQUEST, SYNC, APPLIED)


@dataclass
class PendingChange:
    """A change sent to the root, waiting to be ordered (``done`` answers the client)."""

    entry: Entry
    done: WiringDone | None
    created: float
    sent_to: str | None = None


class WiringReplication(StateSync):
    """The ordered wiring of the cluster vhost, as this server knows and changes it."""

    def __init__(
        self, members: Membership, broker: Broker | None, remote: rep.RemoteQueues | None
    ) -> None:
        self.members = members
        self.broker = broker
        self.remote = remote
        self.log: list[Entry] = []
        self.last_seq = 0
        self.synced_root: str | None = None
        #: the root's term when this server synced with it (``terms.py``): entries of
        #: another term are not its log's, and its log ranks by this term
        self.synced_term = 0
        self._sync_asked: tuple[str, int, float] | None = None
        self.pending: dict[str, PendingChange] = {}
        self._request_seq = 0
        self._compacted_size = 0
        #: the state sequence the root's previous status claimed
        self._claimed = 0
        #: gives a shared queue's declare its owner before the root orders it
        #: (``placing.Placer.place_declare``)
        self.placer: Callable[[Entry], Entry | AMQPError] | None = None
        #: a recovered queue's declare the root seeds its log with: where it goes
        #: (``Placer.recovered``)
        self.seed_placer: Callable[[Entry], Entry] | None = None
        #: fences a server's replication stream at a generation (``MessagePlane.
        #: fence``), says whether one is fenced and its queues not all placed
        #: elsewhere yet, and how many times one was fenced
        self.on_fence: Callable[[str, int, int], None] | None = None
        #: a bridge placement applied here (``ownership.bridges.BridgePlacements``)
        self.on_bridge_place: Callable[[Entry], None] | None = None
        #: root only: the members entry a join or forget request leads to, or why not
        #: (``members.MemberChanges.change``)
        self.member_change: Callable[[Entry], Entry | AMQPError] | None = None
        #: a members entry ordered or applied here
        self.on_members: Callable[[Entry], None] | None = None
        self.is_fenced: Callable[[str], bool] = lambda _spid: False
        self.fences: Callable[[str], int] = lambda _spid: 0
        #: root only: answers held until every follower applied their change
        self.acks = Acknowledgements(members.clock, lambda: self.members.config.heartbeat_timeout)

    @property
    def spid(self) -> str:
        return self.members.spid

    def _vhost(self) -> VirtualHost | None:
        if self.broker is None:
            return None
        return self.broker.vhosts.get(self.members.config.vhost)

    # -- the channel's hooks ----------------------------------------------------------

    def delegate(self, conn: Connection, method: Method, done: WiringDone) -> bool:
        """Take a shared wiring change that would alter this server's state to the
        root, unless this server is the root (it applies, then ``replicate`` orders)."""
        vhost = conn.vhost
        if vhost is None or vhost.name != self.members.config.vhost:
            return False
        if type(method) not in rep.OPERATIONS or not local.would_change(vhost, method):
            return False
        if isinstance(method, commands.Queue.Delete) and self._owned_elsewhere(vhost, method, done):
            return True
        if self.members.root_now() and not self.acks.wanted:
            return False  # applied here, then ordered (``replicate``): nobody to wait for
        entry = rep.entry_for(method, vhost.name, origin=self.spid)
        self._request(entry, done)
        return True

    def _owned_elsewhere(
        self, vhost: VirtualHost, method: commands.Queue.Delete, done: WiringDone
    ) -> bool:
        """A delete of a shared queue its owner holds, asked on another server (the
        root too) or on the owner when it is not root: only the owner knows the counts
        that ``if-empty``/``if-unused`` and the delete-ok's message count need. They
        are taken there (the proxy asks), then the root orders the delete."""
        queue = vhost.queues.get(method.queue)
        if getattr(queue, "owner_spid", None) is None:
            return False
        if queue.local and self.members.root_now():
            return False  # the owner is root: the channel applies and orders it here
        name = f"queue '{method.queue}' in vhost '{vhost.name}'"

        def counted(counts: Any) -> None:
            if isinstance(counts, AMQPError) and counts.reply_code == NOT_FOUND:
                if queue.deleted:  # its owner dropped it and the root ordered that
                    done(None, [0])  # deleting what is not there succeeds (RabbitMQ)
                    return
                counts = (0, 0)  # gone at its owner but still here: the root orders it
            if isinstance(counts, AMQPError):
                done(counts, None)
                return
            messages, consumers = counts
            if method.if_unused and consumers:
                done(ChannelError(PRECONDITION_FAILED, f"{name} in use"), None)
            elif method.if_empty and messages:
                done(ChannelError(PRECONDITION_FAILED, f"{name} not empty"), None)
            else:
                entry = rep.entry_for(method, vhost.name, origin=self.spid)
                self._request(entry, lambda error, _r: done(error, None if error else [messages]))

        if queue.local:
            counted((queue.message_count, queue.consumer_count))
        else:
            queue.stat(counted)
        return True

    def catch_up(self, conn: Connection, resume: Callable[[], None]) -> bool:
        """A method named an exchange or queue of the cluster vhost that this server
        does not have: it may be one the root ordered and this server has not applied
        yet (declared through another server an instant ago; RabbitMQ's nodes would
        all know it). True: the root is asked where its state stands (``barrier``),
        and ``resume`` runs once it answered; the caller then tries the method once
        more. False: what this server has is all there is."""
        vhost = conn.vhost
        if vhost is None or vhost.name != self.members.config.vhost:
            return False
        return self.barrier(resume)

    def barrier(self, resume: Callable[[], None]) -> bool:
        """Ask the root for a barrier: ``resume`` runs once this server applied
        everything the root ordered before it, or once the question failed. False
        (nothing asked): this server is the root, or follows none in sync, so what
        it has is all there is. The message plane asks too (``queues.catchup``)."""
        if self.members.root_now():
            return False
        root = self.members.root()
        if root is None or not self.in_sync(root, self.members.term_of(root)):
            return False
        barrier = Entry(0, sl.BARRIER, self.members.config.vhost, origin=self.spid)
        self._request(barrier, lambda _error, _result: resume())
        return True

    def replicate(self, conn: Connection, method: Method) -> None:
        """A wiring change was applied here: the root orders it; any other server
        only tells the root of a private queue's bindings (meta-bindings)."""
        vhost = conn.vhost
        if vhost is None or vhost.name != self.members.config.vhost:
            return
        if type(method) not in rep.OPERATIONS:
            return
        if isinstance(method, commands.Queue.Declare) and method.exclusive:
            # a private queue stays on its server; the others learn its name, so a
            # publish to it through the default exchange reaches it from anywhere
            method = local.default_binding(commands.Queue.Bind, method.queue)
        meta = ""
        if isinstance(method, commands.Queue.Bind | commands.Queue.Unbind):
            queue = vhost.queues.get(method.queue)
            if queue is not None and queue.exclusive:
                meta = self.spid  # other servers forward matches here
        entry = rep.entry_for(method, vhost.name, origin=self.spid, meta_spid=meta)
        if self.members.root_now():
            self._order(entry, None, applied=not meta)
        elif meta:
            self._request(entry, None)  # meta-bindings never hold the client
        else:
            log.warning("wiring applied on a non-root server op=%s name=%s", entry.op, entry.name)

    def private_queue_removed(self, queue: Queue) -> None:
        """VirtualHost hook: a private queue went; withdraw its meta-bindings."""
        if not queue.exclusive or queue.vhost != self.members.config.vhost:
            return
        methods = [local.default_binding(commands.Queue.Unbind, queue.name)]
        methods += [
            commands.Queue.Unbind(
                queue=queue.name,
                exchange=binding.source.name,
                routing_key=binding.routing_key,
                arguments=binding.arguments,
            )
            for binding in list(queue.bindings.values())
        ]
        for method in methods:
            entry = rep.entry_for(method, queue.vhost, origin=self.spid, meta_spid=self.spid)
            if self.members.root_now():
                self._order(entry, None)
            else:
                self._request(entry, None)

    def order_delete(self, queue: Queue) -> None:
        """The root removes a shared queue by itself (auto-delete: its last consumer
        anywhere left) and tells every server."""
        method = commands.Queue.Delete(queue=queue.name)
        self._order(rep.entry_for(method, queue.vhost, origin=self.spid), None)

    def order(self, entry: Entry) -> None:
        """Root only: order an entry the cluster itself decided (a placement)."""
        self._order(entry, None)

    def request_delete(self, queue: Queue) -> None:
        """An owner that is not root asks the root to remove a queue (auto-delete or
        x-expires: its timers and consumer counts live on the owner)."""
        method = commands.Queue.Delete(queue=queue.name)
        self._request(rep.entry_for(method, queue.vhost, origin=self.spid), None)

    def request(self, entry: Entry, done: WiringDone | None) -> None:
        """Ask the root to order ``entry`` (a move request): ``done`` gets the refusal or
        the result, as for a client's change."""
        self._request(entry, done)

    def server_gone(self, spid: str) -> None:
        """The root withdraws the meta-bindings of a server that went away."""
        if not any(e.op == sl.META_BIND and e.spid == spid for e in self.log):
            return
        self._order(Entry(0, sl.SERVER_GONE, self.members.config.vhost, spid=spid), None)

    # -- requests to the root -------------------------------------------------------------

    def _request(self, entry: Entry, done: WiringDone | None) -> None:
        self._request_seq += 1
        request = f"{self.spid}/{self._request_seq}"
        self.pending[request] = PendingChange(entry, done, self.members.clock())
        self._send_change(request)

    def _send_change(self, request: str) -> None:
        change = self.pending[request]
        if self.members.root_now():
            # this server became root while the change was in flight: order it here
            del self.pending[request]
            wanted = self.acks.wanted
            outcome = self._order(change.entry, request, ack=wanted)
            done = change.done
            if done is None:
                return
            if isinstance(outcome, AMQPError):
                done(outcome, None)
            elif outcome[0] and wanted:
                result = outcome[1]
                self.acks.expect(self.last_seq, lambda: done(None, result))
            else:
                done(None, outcome[1])
            return
        root = self.members.root()
        if root is None:
            return  # sent when a root is known (see tick)
        header = {**rep.entry_header(change.entry), "request": request}
        if self.members.post(root, CHANGE, rep.encode_bucket(header, [change.entry.frame])):
            change.sent_to = root

    def tick(self) -> None:
        """Resend changes to a new root; give up on those nobody ordered in time;
        answer changes whose followers did not all acknowledge them in time."""
        self.acks.expire()
        now = self.members.clock()
        root = self.members.root()
        for request, change in list(self.pending.items()):
            if now - change.created > 3 * self.members.config.open_timeout:
                del self.pending[request]
                if change.done is not None:
                    change.done(
                        ConnectionError_(
                            INTERNAL_ERROR, "cluster did not order the change in time"
                        ),
                        None,
                    )
            elif root is not None and change.sent_to != root and request in self.pending:
                self._send_change(request)

    # -- ordering (root) ---------------------------------------------------------------------

    def _order(
        self, entry: Entry, request: str | None, *, applied: bool = False, ack: bool = False
    ) -> AMQPError | tuple[bool, list[int] | None]:
        """Root only: validate by applying (unless already applied here), give the
        next sequence number, broadcast. Returns the error, or whether it was
        ordered and the result for the requester's -Ok. With ``ack`` the followers
        acknowledge applying it, and the requester waits for the root's answer
        (``applied.Acknowledgements``)."""
        if entry.op == sl.BARRIER:
            return False, None  # answered at once, after everything ordered before it
        result = None
        if entry.op == sl.MEMBER_CHANGE:
            if self.member_change is None:
                return ChannelError(PRECONDITION_FAILED, "this server orders no member changes")
            changed = self.member_change(entry)
            if isinstance(changed, AMQPError):
                return changed
            entry = changed
        if self.placer is not None and entry.op != sl.MEMBERS:
            placed = self.placer(entry)
            if isinstance(placed, AMQPError):
                return placed
            entry = placed
        # numbered before it is applied: placements and fences compare their numbers
        entry = dataclasses.replace(entry, seq=self.last_seq + 1)
        if entry.op == sl.SERVER_FENCE:
            if self.is_fenced(entry.spid):
                return False, None  # fenced already, its failover under way
            self._fence(entry)
        elif entry.op == sl.BRIDGE_PLACE:
            self._bridge_place(entry)
        elif entry.op == sl.MEMBERS:
            self._members(entry)
        elif not applied and self.broker is not None:
            outcome = rep.try_apply(self.broker, entry, own_spid=self.spid, remote=self.remote)
            if isinstance(outcome, AMQPError):
                return outcome
            changed, result = outcome
            if not changed and entry.op not in (sl.META_BIND, sl.META_UNBIND):
                return False, result  # nothing to order: declaring what exists
        self.last_seq += 1
        ordered = Entry(
            self.last_seq,
            entry.op,
            entry.vhost,
            entry.name,
            entry.source,
            entry.routing_key,
            entry.arguments,
            entry.props,
            entry.spid,
            entry.frame,
            entry.origin,
        )
        self._append(ordered)
        if applied and ordered.op == sl.QUEUE_DECLARE and rep.placed_by(ordered):
            vhost = self._vhost()
            if vhost is not None:  # the channel declared it here first: its owner now
                rep.apply_placement(vhost, ordered)
        header = {
            **rep.entry_header(ordered),
            "request": request,
            "result": result,
            "term": self._term(),
        }
        if ack:
            header["ack"] = True
        self.members._send_all(STATE, rep.encode_bucket(header, [ordered.frame]))
        log.info(
            "state ordered seq=%d op=%s name=%s origin=%s",
            ordered.seq,
            ordered.op,
            ordered.name,
            ordered.origin,
        )
        return True, result

    def _append(self, entry: Entry) -> None:
        self.log.append(entry)
        if len(self.log) > 256 and len(self.log) > 2 * self._compacted_size:
            self.log = compact(self.log)
            self._compacted_size = len(self.log)

    # -- messages from peers -----------------------------------------------------------------

    def receive(self, spid: str, kind: str, body: bytes) -> None:
        try:
            header, frames = rep.decode_bucket(body)
            if kind == CHANGE:
                self._on_change(spid, header, frames)
            elif kind == STATE:
                self._on_state(spid, header, frames)
            elif kind == REFUSE:
                self._on_refuse(header)
            elif kind == RESULT:
                self._on_result(header)
            elif kind == SYNC_REQUEST:
                self._on_sync_request(spid)
            elif kind == SYNC:
                self._on_sync(spid, header, frames)
            elif kind == APPLIED:
                self.acks.applied(spid, int(header["seq"]))
        except (rep.BucketError, ValueError, TypeError, KeyError) as exc:
            # a malformed header field (a seq that is not a number) costs this message only
            log.warning("replication message refused from=%s kind=%s: %s", spid, kind, exc)

    def _on_change(self, spid: str, header: dict[str, Any], frames: list[bytes]) -> None:
        request = header.get("request")
        if not self.members.root_now():
            log.info("change from=%s ignored: not root (it will resend)", spid)
            return
        entry = rep.entry_from_header(header, frames[0] if frames else b"")
        wanted = self.acks.wanted
        outcome = self._order(entry, request, ack=wanted)
        if isinstance(outcome, AMQPError):
            refusal = {
                "request": request,
                "code": outcome.reply_code,
                "text": outcome.text,
                "connection_level": outcome.connection_level,
            }
            self.members.post(spid, REFUSE, rep.encode_bucket(refusal, []))
        elif not outcome[0] or wanted:
            # nothing ordered: answered at once; ordered with followers: once all of
            # them applied it (else its state broadcast answers it)
            reply = rep.encode_bucket({"request": request, "result": outcome[1]}, [])
            answer = functools.partial(self.members.post, spid, RESULT, reply)
            if outcome[0]:
                self.acks.expect(self.last_seq, answer)
            else:
                answer()

    def _on_state(self, spid: str, header: dict[str, Any], frames: list[bytes]) -> None:
        if spid != self.members.root() or self.synced_root != spid:
            return  # only the root's stream counts, once synced with it
        term = int(header.get("term", self.synced_term))
        if term != self.synced_term:
            if term > self.synced_term:  # the root acts in a later term: its log anew
                log.warning("state of term=%d, synced in term=%d: resync", term, self.synced_term)
                self.synced_root = None
                self._sync_asked = None
                self.members.evaluate()
            return
        entry = rep.entry_from_header(header, frames[0] if frames else b"")
        if entry.seq <= self.last_seq:
            return
        if entry.seq != self.last_seq + 1:
            log.warning("state gap at=%d got=%d: resync", self.last_seq, entry.seq)
            self.synced_root = None
            self._sync_asked = None
            self.members.evaluate()
            return
        self._apply(entry)
        self.last_seq = entry.seq
        self._append(entry)
        if header.get("ack"):
            # the root answers the change once every follower applied it: say so, and
            # (its requester) wait for that answer
            self.members.post(spid, APPLIED, rep.encode_bucket({"seq": entry.seq}, []))
            return
        change = self.pending.pop(str(header.get("request")), None)
        if change is not None and change.done is not None:
            change.done(None, header.get("result"))

    def _fence(self, entry: Entry) -> None:
        if self.on_fence is not None:
            self.on_fence(entry.spid, int(dict(entry.props).get("generation", 1)), entry.seq)

    def fence(self, spid: str) -> None:
        """Root only: fence ``spid``'s replication stream (its queues then fail over).
        The entry numbers the fence: a server syncing the log again applies it once."""
        props = freeze({"generation": self.fences(spid) + 1})
        entry = Entry(0, sl.SERVER_FENCE, self.members.config.vhost, props=props, spid=spid)
        self._order(entry, None)

    def _bridge_place(self, entry: Entry) -> None:
        if self.on_bridge_place is not None:
            self.on_bridge_place(entry)

    def _members(self, entry: Entry) -> None:
        if self.on_members is not None:
            self.on_members(entry)

    def _apply(self, entry: Entry) -> None:
        if entry.op == sl.SERVER_FENCE:
            self._fence(entry)
            return
        if entry.op == sl.MEMBERS:
            self._members(entry)
            return
        if entry.op == sl.BRIDGE_PLACE:
            self._bridge_place(entry)
            return
        if self.broker is None:
            return
        outcome = rep.try_apply(self.broker, entry, own_spid=self.spid, remote=self.remote)
        if isinstance(outcome, AMQPError):
            log.warning(
                "state seq=%d op=%s name=%s not applied: %s",
                entry.seq,
                entry.op,
                entry.name,
                outcome.text,
            )

    def _on_refuse(self, header: dict[str, Any]) -> None:
        change = self.pending.pop(str(header.get("request")), None)
        if change is None or change.done is None:
            return
        cls = ConnectionError_ if header.get("connection_level") else ChannelError
        change.done(cls(int(header.get("code", 541)), str(header.get("text", ""))), None)

    def _on_result(self, header: dict[str, Any]) -> None:
        change = self.pending.pop(str(header.get("request")), None)
        if change is not None and change.done is not None:
            change.done(None, header.get("result"))

    # -- synchronisation -------------------------------------------------------------------------


__all__ = ["KINDS", "WiringReplication"]
