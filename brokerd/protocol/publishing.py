"""basic.publish on a channel: content assembly, routing, returns, confirms, tx.

A publish reaches its queues at once, but a queue may *defer* it (the
``PublishWaiter`` protocol): a shared queue mastered on another server takes
it only when that server has. The channel then keeps the publish's
``PublishCompletion`` and sends its confirm (and its basic.return if it was
mandatory and nothing took it) when the last deferring queue answers.
Confirms still go out in publish order, folded into ``multiple`` acks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from pamqp import commands

from brokerd.model.auth import IMPERSONATOR
from brokerd.model.completion import Completion
from brokerd.model.errors import NO_ROUTE, ChannelError, access_refused, precondition_failed
from brokerd.model.exchange import Exchange
from brokerd.model.expiry import check_expiration
from brokerd.model.message import Body, Message
from brokerd.wire import codec, tables
from brokerd.wire.codec import INLINE_BODY

if TYPE_CHECKING:
    from brokerd.protocol.connection import Connection


class PublishCompletion(Completion):
    """A client's publish that some queue completes later: its confirm (and its
    basic.return, if mandatory and nothing took it) waits for the answers."""

    __slots__ = ("channel", "message", "seq")

    def __init__(self, channel: Publishing) -> None:
        super().__init__()
        self.channel = channel
        #: confirm sequence number (0: the channel is not in confirm mode)
        self.seq = 0
        #: the message, kept only while a mandatory return may still be owed
        self.message: Message | None = None

    def complete(self) -> None:
        self.channel.publish_completed(self)


class Publishing:
    """The publishing half of a channel (a mixin of ``Channel``)."""

    connection: Connection
    number: int
    open: bool
    confirm: bool
    tx: bool
    publish_seq: int
    _confirms: list[tuple[int, bool]]
    _tx_ops: list[Callable[[], None]]
    _publish: tuple[str, str, bool] | None
    _props: bytes
    _parts: list[bytes]
    _size: int
    _received: int
    _write_allowed: dict[str, bool]

    if TYPE_CHECKING:

        def _permit(self, kind: str, resource_type: str, name: str) -> None: ...

    def _init_publishing(self) -> None:
        #: the publish being routed now, once a queue deferred it
        self._deferring: PublishCompletion | None = None
        #: confirms in publish order while any is deferred: seq ints are ready, a
        #: Completion is still waiting (empty whenever nothing is deferred)
        self._inflight: deque[PublishCompletion | tuple[int, bool]] = deque()

    # -- content complete -----------------------------------------------------------

    def _content_complete(self, body: Body) -> None:
        exchange_name, routing_key, mandatory = self._publish  # type: ignore[misc]
        props = self._props
        self._publish = None
        self._props = b""
        conn = self.connection
        if self.confirm:
            self.publish_seq += 1
        if conn.cluster_link and not self.tx and exchange_name == conn.hooks.link_exchange:
            # a cluster link's records: handed to the cluster as they came, never routed
            conn.hooks.link_records(conn, routing_key, body if type(body) is bytes else bytes(body))
            if self.confirm:
                self._confirm(True)
            return
        message = Message(exchange_name, routing_key, props, body, conn.id, self.number)
        if self.tx:
            self._check_publish(exchange_name)
            if len(props) > 1 and props[0] & 0x01:  # the expiration flag
                check_expiration(props)
            self._tx_ops.append(lambda: self._route(message, mandatory))
            return
        try:
            self._route(message, mandatory)
        except ChannelError as exc:
            exc.method_id = (60, 40)  # type: ignore[attr-defined]
            raise

    # -- routing ------------------------------------------------------------------

    def _check_publish(self, exchange_name: str) -> Exchange:
        vhost = self.connection.vhost
        exchange = vhost.exchange(exchange_name)
        allowed = self._write_allowed.get(exchange_name)
        if allowed is None:
            try:
                self._permit("write", "exchange", exchange_name)
                allowed = True
            except ChannelError:
                allowed = False
            self._write_allowed[exchange_name] = allowed
        if not allowed:
            self._permit("write", "exchange", exchange_name)
        if exchange.internal:
            raise access_refused(
                f"cannot publish to internal exchange '{exchange_name}' in vhost '{vhost.name}'"
            )
        return exchange

    def defer(self) -> Callable[[bool, int], None]:
        """PublishWaiter: a queue will answer for the publish being routed later."""
        completion = self._deferring
        if completion is None:
            completion = self._deferring = PublishCompletion(self)
        return completion.defer()

    def _route(self, message: Message, mandatory: bool) -> None:
        conn = self.connection
        exchange = self._check_publish(message.exchange)
        if message.expiring:  # a TTL, or a 406
            check_expiration(message.props_raw)
        claimed = tables.user_id(message.props_raw)
        if claimed is not None:
            self._check_user_id(claimed)
        if exchange.muxer.client_traffic:
            conn.messages_in += 1
            conn.broker.messages_in += 1
        queues = conn.vhost.route(exchange, message)
        accepted = True
        if queues:
            waiter = self if (self.confirm or mandatory) else None
            routed = len(queues)
            conn.broker.messages_routed += routed
            for queue in queues:
                if not queue.push(message, waiter):
                    accepted = False
                    routed -= 1
                    conn.broker.messages_routed -= 1
            completion = self._deferring
            if completion is not None:
                self._deferring = None
                self._arm(completion, message, mandatory, accepted, routed)
                return
        elif mandatory:
            self.send_return(NO_ROUTE, "NO_ROUTE", message)
        if self.confirm:
            self._confirm(accepted)

    def _check_user_id(self, claimed: bytes) -> None:
        """A ``user-id`` must name the user logged in (RabbitMQ's rule and 406 text):
        consumers may trust it. A user tagged ``impersonator`` may set any, as a
        local bridge republishing what it moved does."""
        user = self.connection.user
        name = getattr(user, "name", "")
        if claimed == name.encode() or IMPERSONATOR in getattr(user, "tags", ()):
            return
        raise precondition_failed(
            f"user_id property set to '{claimed.decode(errors='replace')}' "
            f"but authenticated user was '{name}'"
        )

    def _confirm(self, accepted: bool) -> None:
        """The publish just read is settled now: its confirm follows those still
        deferred, in publish order."""
        if self._inflight:
            self._inflight.append((self.publish_seq, accepted))
        else:
            self._confirms.append((self.publish_seq, accepted))
            self.connection._confirm_dirty.add(self)

    def _arm(
        self,
        completion: PublishCompletion,
        message: Message,
        mandatory: bool,
        ok: bool,
        routed: int,
    ) -> None:
        """Routing is over and some queue deferred: the publish completes when they answer.

        ``routed`` counted the deferring queues as taking the message; their answers
        say how many of their queues really did."""
        if mandatory and completion.routed + routed - completion.deferred == 0:
            completion.message = message
        if self.confirm:
            completion.seq = self.publish_seq
            self._inflight.append(completion)
        completion.arm(ok, routed)

    def publish_completed(self, completion: PublishCompletion) -> None:
        """The last deferring queue answered: return if owed, then confirm in order."""
        if not self.open:
            return
        message = completion.message
        if message is not None and completion.routed == 0 and completion.ok:
            # nothing took it because nothing matched (a queue that refused it, by
            # overflow, makes it a nack instead, as on a single broker)
            completion.message = None
            self.send_return(NO_ROUTE, "NO_ROUTE", message)
        if completion.seq:
            inflight = self._inflight
            while inflight:
                head = inflight[0]
                if isinstance(head, PublishCompletion):
                    if not head.finished:
                        break
                    head = (head.seq, head.ok)
                inflight.popleft()
                self._confirms.append(head)
            # sent with the connection's next output: the settlements of one batch
            # from the root fold into one multiple ack
            self.connection.confirm_later(self)

    def send_return(self, code: int, text: str, message: Message) -> None:
        conn = self.connection
        if not conn.may_return():
            return
        conn.broker.messages_returned += 1
        conn.send_method(
            self.number,
            commands.Basic.Return(code, text, message.exchange, message.routing_key),
        )
        if len(message.body) <= INLINE_BODY:
            conn.write(message.content(self.number, conn.frame_max))
        else:
            conn.write_parts(message.content_parts(self.number, conn.frame_max))

    def flush_confirms(self) -> None:
        """Send pending confirms, folding runs of acks into one ``multiple`` ack."""
        confirms = self._confirms
        if not confirms or not self.open:
            confirms.clear()
            return
        write = self.connection.write
        number = self.number
        run_end = 0
        for seq, ok in confirms:
            if ok:
                run_end = seq
                continue
            if run_end:
                write(codec.confirm_frame(number, run_end, True))
                run_end = 0
            write(codec.confirm_frame(number, seq, False, ack=False))
        if run_end:
            write(codec.confirm_frame(number, run_end, True))
        confirms.clear()

    # -- confirm and tx classes ------------------------------------------------------

    def _on_confirm_select(self, m: commands.Confirm.Select) -> None:
        if self.tx:
            raise precondition_failed("cannot switch from tx to confirm mode")
        self.confirm = True
        if not m.nowait:
            self.connection.send_method(self.number, commands.Confirm.SelectOk())

    def _on_tx_select(self, m: commands.Tx.Select) -> None:
        if self.confirm:
            raise precondition_failed("cannot switch from confirm to tx mode")
        self.tx = True
        self.connection.send_method(self.number, commands.Tx.SelectOk())

    def _on_tx_commit(self, m: commands.Tx.Commit) -> None:
        if not self.tx:
            raise precondition_failed("channel is not transactional")
        ops, self._tx_ops = self._tx_ops, []
        for op in ops:
            op()
        self.connection.send_method(self.number, commands.Tx.CommitOk())

    def _on_tx_rollback(self, m: commands.Tx.Rollback) -> None:
        if not self.tx:
            raise precondition_failed("channel is not transactional")
        self._tx_ops = []
        self.connection.send_method(self.number, commands.Tx.RollbackOk())
