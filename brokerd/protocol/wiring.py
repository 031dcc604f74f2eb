"""The exchange and queue classes on a channel: declare, delete, bind, unbind, purge.

In a cluster, wiring is global (DESIGN.md section 5). Two hooks let the
cluster take part without this module knowing how:

- ``delegate``: before anything is applied here, the cluster may take the
  change (a shared one, on a server that is not the root): the root orders
  and applies it first, then every server, this one included, applies it
  from the ordered stream; the client's -Ok carries the root's counts.
- ``replicate``: after a change was applied here, the cluster orders it (on
  the root) or forwards what other servers must know (a private queue's
  meta-bindings).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.model.errors import NOT_ALLOWED, AMQPError, ConnectionError_
from brokerd.model.limits import check_not_internal
from brokerd.wire import codec

if TYPE_CHECKING:
    from brokerd.protocol.connection import Connection

#: builds a method's -Ok from the result the root sent (counts), or from local values
ReplyBuilder = Callable[[Any], Method]


class Wiring:
    """The exchange and queue classes (a mixin of ``Channel``)."""

    connection: Connection
    number: int
    last_queue: str | None

    if TYPE_CHECKING:

        def _permit(self, kind: str, resource_type: str, name: str) -> None: ...
        def _suspend(self, method: Any) -> None: ...
        def _unsuspend(self) -> None: ...
        def resume(self, action: Callable[[], None] | None) -> None: ...
        def hold_cancels(self) -> None: ...
        def release_cancels(self) -> None: ...

    # -- the cluster's part ----------------------------------------------------------

    def _delegated(
        self, m: Method, reply: ReplyBuilder, after: Callable[[], None] | None = None
    ) -> bool:
        """Offer the change to the cluster before applying it; True if it took it
        (the channel then waits for the root, holding later frames). ``after`` runs
        once the answer is sent (or the change failed)."""
        hooks = self.connection.hooks
        if hooks is None:
            return False

        def done(error: AMQPError | None, result: Any) -> None:
            def act() -> None:
                try:
                    if error is not None:
                        raise error
                    if not getattr(m, "nowait", False):
                        self.connection.send_method(self.number, reply(result))
                finally:
                    if after is not None:
                        after()

            self.resume(act)

        self._suspend(m)
        if hooks.delegate(self.connection, m, done):
            return True
        self._unsuspend()
        return False

    def _applied(self, m: Method, reply: Method, *, changed: bool) -> None:
        """A change was applied here: let the cluster order or forward it, then -Ok."""
        hooks = self.connection.hooks
        if changed and hooks is not None:
            hooks.replicate(self.connection, m)
        if not getattr(m, "nowait", False):
            self.connection.send_method(self.number, reply)

    def _queue_name(self, name: str) -> str:
        """AMQP: an empty queue name means the last queue declared on this channel."""
        if name:
            return name
        if self.last_queue is None:
            raise ConnectionError_(NOT_ALLOWED, "no previously declared queue")
        return self.last_queue

    # -- exchange class ----------------------------------------------------------

    def _on_exchange_declare(self, m: commands.Exchange.Declare) -> None:
        vhost = self.connection.vhost
        check_not_internal("exchange", m.exchange)  # a passive declare checks no permission
        if not m.passive:
            self._permit("configure", "exchange", m.exchange)
            if m.exchange not in vhost.exchanges and not _reserved(m.exchange):
                self.connection.broker.check_new_exchange(vhost, m.exchange)  # 406 over a limit
            if self._delegated(m, lambda _: commands.Exchange.DeclareOk()):
                return
        _exchange, created = vhost.declare_exchange(
            m.exchange,
            m.exchange_type or "direct",
            passive=m.passive,
            durable=m.durable,
            auto_delete=m.auto_delete,
            internal=m.internal,
            arguments=m.arguments or {},
        )
        self._applied(m, commands.Exchange.DeclareOk(), changed=created)

    def _on_exchange_delete(self, m: commands.Exchange.Delete) -> None:
        self._permit("configure", "exchange", m.exchange)
        if self._delegated(m, lambda _: commands.Exchange.DeleteOk()):
            return
        deleted = self.connection.vhost.delete_exchange(m.exchange, if_unused=m.if_unused)
        self._applied(m, commands.Exchange.DeleteOk(), changed=deleted is not None)

    def _on_exchange_bind(self, m: commands.Exchange.Bind) -> None:
        vhost = self.connection.vhost
        self._permit("write", "exchange", m.destination)
        self._permit("read", "exchange", m.source)
        if self._delegated(m, lambda _: commands.Exchange.BindOk()):
            return
        source = vhost.exchange(m.source)
        before = len(source.bindings)
        vhost.bind(source, vhost.exchange(m.destination), m.routing_key, m.arguments or {})
        self._applied(m, commands.Exchange.BindOk(), changed=len(source.bindings) != before)

    def _on_exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        vhost = self.connection.vhost
        self._permit("write", "exchange", m.destination)
        self._permit("read", "exchange", m.source)
        source = vhost.exchanges.get(m.source)
        destination = vhost.exchanges.get(m.destination)
        if source is None or destination is None:
            # RabbitMQ: the binding went with its exchange, so unbinding succeeds
            self._applied(m, commands.Exchange.UnbindOk(), changed=False)
            return
        if self._delegated(m, lambda _: commands.Exchange.UnbindOk()):
            return
        before = len(source.bindings)
        vhost.unbind(source, destination, m.routing_key, m.arguments or {})
        self._applied(m, commands.Exchange.UnbindOk(), changed=len(source.bindings) != before)

    # -- queue class ---------------------------------------------------------------

    def _on_queue_declare(self, m: commands.Queue.Declare) -> None:
        conn = self.connection
        vhost = conn.vhost
        if m.passive:
            check_not_internal("queue", m.queue)  # a passive declare checks no permission
            queue, _ = vhost.declare_queue(m.queue, connection_id=conn.id, passive=True)
            self.last_queue = queue.name

            def counted(counts: Any) -> None:
                self.resume(lambda: self._declare_ok(queue.name, counts))

            self._suspend(m)
            queue.stat(counted)
            return
        if not m.queue:
            _rename(m, vhost.server_named_queue())  # named here: it replicates under its name
        # RabbitMQ checks configure on a server-named queue's generated name too
        self._permit("configure", "queue", m.queue)
        self.last_queue = m.queue
        name = m.queue
        if name not in vhost.queues and not _reserved(name):
            conn.broker.check_new_queue(vhost, name)  # 406 over a limit
        if self._delegated(m, lambda counts: self._declare_ok_method(name, counts)):
            return
        queue, created = vhost.declare_queue(
            m.queue,
            connection_id=conn.id,
            durable=m.durable,
            exclusive=m.exclusive,
            auto_delete=m.auto_delete,
            arguments=m.arguments or {},
            reserved_ok=m.queue.startswith("amq.gen-"),
        )
        hooks = conn.hooks
        if created and hooks is not None:
            hooks.replicate(conn, m)

        def counted(counts: Any) -> None:  # the counts of a queue held elsewhere come later
            def act() -> None:
                if isinstance(counts, AMQPError) and queue.deleted and not created:
                    # the queue this declare found went before its counts came (its
                    # owner in a cluster dropped it): declare it anew
                    self._on_queue_declare(m)
                    return
                if isinstance(counts, AMQPError):
                    raise counts
                if not m.nowait:
                    conn.send_method(self.number, self._declare_ok_method(queue.name, counts))

            self.resume(act)

        self._suspend(m)
        queue.stat(counted)

    @staticmethod
    def _declare_ok_method(name: str, counts: Any) -> Method:
        messages, consumers = counts if counts else (0, 0)
        return commands.Queue.DeclareOk(name, messages, consumers)

    def _declare_ok(self, name: str, counts: Any) -> None:
        if isinstance(counts, AMQPError):
            raise counts
        self.connection.send_method(self.number, self._declare_ok_method(name, counts))

    def _on_queue_bind(self, m: commands.Queue.Bind) -> None:
        conn = self.connection
        name = _rename(m, self._queue_name(m.queue))
        self._permit("write", "queue", name)
        self._permit("read", "exchange", m.exchange)
        if self._delegated(m, lambda _: commands.Queue.BindOk()):
            return
        queue = conn.vhost.queue(name, conn.id)
        before = len(queue.bindings)
        conn.vhost.bind(conn.vhost.exchange(m.exchange), queue, m.routing_key, m.arguments or {})
        self._applied(m, commands.Queue.BindOk(), changed=len(queue.bindings) != before)

    def _on_queue_unbind(self, m: commands.Queue.Unbind) -> None:
        conn = self.connection
        name = _rename(m, self._queue_name(m.queue))
        self._permit("write", "queue", name)
        self._permit("read", "exchange", m.exchange)
        exchange = conn.vhost.exchanges.get(m.exchange)
        if name not in conn.vhost.queues or exchange is None:
            # RabbitMQ: the binding went with its queue or exchange, so unbind-ok
            # (aio-pika's RPC.close() unbinds after its auto-delete queue went)
            self._applied(m, commands.Queue.UnbindOk(), changed=False)
            return
        if self._delegated(m, lambda _: commands.Queue.UnbindOk()):
            return
        queue = conn.vhost.queue(name, conn.id)
        before = len(queue.bindings)
        conn.vhost.unbind(exchange, queue, m.routing_key, m.arguments or {})
        self._applied(m, commands.Queue.UnbindOk(), changed=len(queue.bindings) != before)

    def _on_queue_purge(self, m: commands.Queue.Purge) -> None:
        conn = self.connection
        name = self._queue_name(m.queue)
        self._permit("read", "queue", name)
        queue = conn.vhost.queue(name, conn.id)

        def purged(count: Any) -> None:
            def act() -> None:
                if isinstance(count, AMQPError):
                    raise count
                if not m.nowait:
                    conn.send_method(self.number, commands.Queue.PurgeOk(count))

            self.resume(act)

        self._suspend(m)
        queue.purge(purged)

    def _on_queue_delete(self, m: commands.Queue.Delete) -> None:
        """Its own consumers' basic.cancel follow the delete-ok (RabbitMQ's order)."""
        conn = self.connection
        name = _rename(m, self._queue_name(m.queue))
        self._permit("configure", "queue", name)
        self.hold_cancels()
        if self._delegated(
            m,
            lambda counts: commands.Queue.DeleteOk(counts[0] if counts else 0),
            after=self.release_cancels,
        ):
            return
        try:
            existed = conn.vhost.queues.get(name)
            count = conn.vhost.delete_queue(
                name, connection_id=conn.id, if_unused=m.if_unused, if_empty=m.if_empty
            )
            shared = existed is not None and not existed.exclusive
            self._applied(m, commands.Queue.DeleteOk(count), changed=shared)
        finally:
            self.release_cancels()


def _reserved(name: str) -> bool:
    """A name the declare refuses anyway (403): not a limit's business."""
    return not name or (name.startswith("amq.") and not name.startswith("amq.gen-"))


def _rename(m: Any, name: str) -> str:
    """Set a queue method's queue name, in its decoded fields and in the raw bytes
    a replicated change carries."""
    if m.queue != name:
        m.queue = name
        raw = getattr(m, "raw_payload", None)
        if raw is not None:
            m.raw_payload = codec.renamed_queue(raw, name)
    return name
