"""A virtual host: its exchanges, queues and bindings, and the routing walk.

Every wiring change goes through here so the rules RabbitMQ users rely on
(reserved names, equivalence on redeclare, exclusivity, auto-delete) live
in one place.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from brokerd.model.arguments import amqp_type_name, validate_queue_arguments
from brokerd.model.deadletter import DeadLetters
from brokerd.model.errors import (
    ACCESS_REFUSED,
    ChannelError,
    access_refused,
    not_found,
    precondition_failed,
    resource_locked,
)
from brokerd.model.exchange import DefaultMuxer, Exchange
from brokerd.model.interfaces import Destination
from brokerd.model.message import Message
from brokerd.model.muxers import Binding, lookup
from brokerd.model.queue import Queue
from brokerd.model.queuetypes import check_queue_type
from brokerd.model.storage import MessageStore

PREDECLARED = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)

#: the x-arguments RabbitMQ compares when a queue is redeclared; it ignores all others
EQUIVALENT_QUEUE_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-single-active-consumer",
    "x-queue-type",
    "x-queue-master-locator",
    "x-dead-letter-strategy",
    "x-quorum-initial-group-size",
    "x-queue-leader-locator",
)


def _flag(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _described(value: Any) -> str:
    """An argument in RabbitMQ's words, for when only one side of a comparison has it."""
    if value is None:
        return "none"
    return f"the value '{_flag(value)}' of type '{amqp_type_name(value)}'"


class VirtualHost:
    def __init__(self, name: str, store: MessageStore | None = None) -> None:
        self.name = name
        #: where durable wiring is kept and queues get their part of the store
        self.store = store
        self.queues: dict[str, Queue] = {}
        self.exchanges: dict[str, Exchange] = {}
        #: queues of other servers the default exchange reaches by name (the cluster's
        #: stand-ins for their private queues); never a queue of this server
        self.elsewhere: dict[str, Destination] = {}
        self.exchanges[""] = Exchange(
            "", "direct", durable=True, muxer=DefaultMuxer(self.queues, self.elsewhere)
        )
        for xname, xtype in PREDECLARED:
            self.exchanges[xname] = Exchange(xname, xtype, durable=True)
        #: called with each queue being removed, bindings still attached (the cluster
        #: withdraws a private queue's meta-bindings, a store drops its files)
        self.on_queue_deleted: list[Callable[[Queue], None]] = []
        #: makes the queue object for a declare: the local queue type, unless the
        #: cluster installs its own (shared queues) for the clustered vhost
        self.queue_factory: Callable[..., Queue] = Queue
        #: republishes what its queues dead-letter, through this vhost's routing
        self.dead_letters = DeadLetters(self)

    # -- lookups -------------------------------------------------------------

    def exchange(self, name: str) -> Exchange:
        try:
            return self.exchanges[name]
        except KeyError:
            raise not_found(f"no exchange '{name}' in vhost '{self.name}'") from None

    def queue(self, name: str, connection_id: int | None = None) -> Queue:
        """Look a queue up, enforcing exclusivity when ``connection_id`` is given."""
        queue = self.queues.get(name)
        if queue is None:
            if connection_id is not None and name in self.elsewhere:
                raise self._locked(name)  # another server's private queue
            raise not_found(f"no queue '{name}' in vhost '{self.name}'")
        if (
            connection_id is not None
            and queue.exclusive_owner is not None
            and queue.exclusive_owner != connection_id
        ):
            raise self._locked(name)
        return queue

    def _locked(self, name: str) -> ChannelError:
        return resource_locked(
            f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.name}'. "
            "It could be originally declared on another connection or the exclusive "
            "property value does not match that of the original declaration."
        )

    # -- exchanges -----------------------------------------------------------

    def declare_exchange(
        self,
        name: str,
        type_name: str,
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> tuple[Exchange, bool]:
        """Declare (or check) an exchange; returns it and whether it was created."""
        arguments = arguments or {}
        existing = self.exchanges.get(name)
        if name == "":  # even passively, as RabbitMQ
            raise access_refused("operation not permitted on the default exchange")
        if passive:
            if existing is None:
                raise not_found(f"no exchange '{name}' in vhost '{self.name}'")
            return existing, False
        if name.startswith("amq.") and existing is None:
            raise access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        if existing is not None:
            self._check_equivalent(
                "exchange",
                name,
                (
                    ("type", type_name, existing.type_name),
                    ("durable", durable, existing.durable),
                    ("auto_delete", auto_delete, existing.auto_delete),
                    ("internal", internal, existing.internal),
                ),
            )
            return existing, False
        lookup(type_name)  # 503 for an unknown type before anything is created
        exchange = Exchange(
            name,
            type_name,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )
        self.exchanges[name] = exchange
        if durable and self.store is not None:
            self.store.exchange_declared(self.name, exchange)
        return exchange, True

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> Exchange | None:
        if name == "":
            raise access_refused("operation not permitted on the default exchange")
        if name.startswith("amq."):
            raise access_refused(
                f"deletion of system exchange '{name}' in vhost '{self.name}' not allowed"
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            return None  # deleting what is not there succeeds, as in RabbitMQ
        if if_unused and exchange.bindings:
            raise precondition_failed(f"exchange '{name}' in vhost '{self.name}' in use")
        for binding in list(exchange.bindings.values()) + list(exchange.inbound.values()):
            self._drop_binding(binding)
        # dropping its last binding may already have auto-deleted an auto-delete exchange
        if self.exchanges.pop(name, None) is not None and exchange.durable and self.store:
            self.store.exchange_deleted(self.name, name)
        return exchange

    # -- queues --------------------------------------------------------------

    def declare_queue(
        self,
        name: str,
        *,
        connection_id: int,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        reserved_ok: bool = False,
    ) -> tuple[Queue, bool]:
        """Declare (or check) a queue; returns it and whether it was created.

        ``reserved_ok``: the name was made by a server (``server_named_queue``),
        so its ``amq.`` prefix is not a client's trespass."""
        arguments = arguments or {}
        if passive:
            queue = self.queue(name, connection_id)
            queue.touch()  # a declare is a use (x-expires)
            return queue, False
        if not name:
            name = self.server_named_queue()
        elif name.startswith("amq.") and not reserved_ok:
            raise access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        existing = self.queues.get(name)
        if existing is None and name in self.elsewhere:
            raise self._locked(name)  # another server's private queue holds the name
        if existing is not None:
            self.queue(name, connection_id)  # 405 if another connection owns it
            if exclusive != existing.exclusive:
                raise self._locked(name)  # RabbitMQ: 405, not an inequivalent-arg 406
            self._check_equivalent(
                "queue",
                name,
                (
                    ("durable", durable, existing.durable),
                    ("auto_delete", auto_delete, existing.auto_delete),
                    *(
                        (key, arguments.get(key), existing.arguments.get(key))
                        for key in EQUIVALENT_QUEUE_ARGUMENTS
                        if not (  # an absent x-queue-type means classic
                            key == "x-queue-type"
                            and arguments.get(key, "classic")
                            == existing.arguments.get(key, "classic")
                        )
                    ),
                ),
            )
            existing.touch()
            return existing, False
        validate_queue_arguments(name, self.name, arguments)
        check_queue_type(
            name,
            self.name,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        queue = self.queue_factory(
            name,
            self.name,
            durable=durable,
            exclusive_owner=connection_id if exclusive else None,
            auto_delete=auto_delete,
            arguments=arguments,
        )
        if queue.on_unused is None:
            queue.on_unused = self.remove_queue
        queue.dead_letters = self.dead_letters
        store = self.store
        if store is not None:
            queue.store = store.queue_store(self.name, queue)
            queue.page_limit = store.page_limit
            if durable and not exclusive:
                store.queue_declared(self.name, queue)
        self.queues[name] = queue
        return queue, True

    @staticmethod
    def server_named_queue() -> str:
        """A fresh server-generated queue name, as RabbitMQ makes them."""
        return "amq.gen-" + secrets.token_urlsafe(16)

    def delete_queue(
        self,
        name: str,
        *,
        connection_id: int | None = None,
        if_unused: bool = False,
        if_empty: bool = False,
    ) -> int:
        """Delete a queue; returns the number of messages it held."""
        queue = self.queues.get(name)
        if queue is None:
            return 0
        self.queue(name, connection_id)
        if if_unused and queue.consumer_count:
            raise precondition_failed(f"queue '{name}' in vhost '{self.name}' in use")
        if if_empty and queue.message_count:
            raise precondition_failed(f"queue '{name}' in vhost '{self.name}' not empty")
        return self.remove_queue(queue)

    def remove_queue(self, queue: Queue) -> int:
        """Remove a queue unconditionally: bindings, consumers (cancelled), messages."""
        if self.queues.get(queue.name) is not queue:
            return 0
        count = queue.message_count
        del self.queues[queue.name]
        queue.deleted = True
        queue.stop_timers()
        for hook in self.on_queue_deleted:  # before the bindings go: hooks may need them
            hook(queue)
        for binding in list(queue.bindings.values()):
            self._drop_binding(binding)
        if queue.store is not None:
            queue.store.deleted()  # its journal goes whole: no record per message
            queue.store = None
            if queue.durable and not queue.exclusive and self.store is not None:
                self.store.queue_deleted(self.name, queue.name)
        queue.drop_all()
        for consumer in list(queue.consumers):
            queue.remove_consumer(consumer)
            consumer.cancelled(queue)
        return count

    # -- bindings ------------------------------------------------------------

    def bind(
        self,
        source: Exchange,
        destination: Destination | Exchange,
        routing_key: str,
        arguments: dict[str, Any] | None = None,
    ) -> Binding:
        if source.is_default or (isinstance(destination, Exchange) and destination.is_default):
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        binding = Binding(source, destination, routing_key, arguments or {})
        if source.add_binding(binding):
            target = (
                destination.inbound if isinstance(destination, Exchange) else destination.bindings
            )
            target[(id(source), *binding.key[1:])] = binding
            if self.store is not None and _durable_binding(binding):
                self.store.bound(self.name, binding)
        return binding

    def unbind(
        self,
        source: Exchange,
        destination: Destination | Exchange,
        routing_key: str,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        if source.is_default or (isinstance(destination, Exchange) and destination.is_default):
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        probe = Binding(source, destination, routing_key, arguments or {})
        binding = source.bindings.get(probe.key)
        if binding is not None:
            self._drop_binding(binding)

    def _drop_binding(self, binding: Binding) -> None:
        source: Exchange = binding.source
        destination = binding.destination
        source.remove_binding(binding)
        target = destination.inbound if isinstance(destination, Exchange) else destination.bindings
        target.pop((id(source), *binding.key[1:]), None)
        if self.store is not None and _durable_binding(binding):
            self.store.unbound(self.name, binding)
        if source.auto_delete and not source.bindings and source.name in self.exchanges:
            self.delete_exchange(source.name)

    def binding_list(self) -> list[Binding]:
        return [b for x in self.exchanges.values() for b in x.bindings.values()]

    # -- routing -------------------------------------------------------------

    def route(self, exchange: Exchange, message: Message) -> tuple[Destination, ...]:
        """All queues a message reaches, each once, following exchange-to-exchange
        bindings and stopping on cycles. A destination is a queue of any type,
        or the cluster's stand-in for a private queue on another server."""
        exchange.stats_in += 1
        destinations = exchange.muxer.route(message)
        if not exchange.exchange_destinations:
            return tuple(destinations)
        queues: dict[Destination, None] = {}
        seen = {exchange}
        stack = list(destinations)
        while stack:
            dest = stack.pop()
            if not isinstance(dest, Exchange):
                queues[dest] = None
            elif dest not in seen:
                seen.add(dest)
                dest.stats_in += 1
                stack.extend(dest.muxer.route(message))
        return tuple(queues)

    # -- connection lifecycle -------------------------------------------------

    def drop_exclusive(self, connection_id: int) -> None:
        """The owner connection closed: its exclusive queues go."""
        for queue in [q for q in self.queues.values() if q.exclusive_owner == connection_id]:
            self.remove_queue(queue)

    def _check_equivalent(self, kind: str, name: str, fields: Any) -> None:
        for field, received, current in fields:
            if received != current:
                if received is None or current is None:
                    detail = f"received {_described(received)} but current is {_described(current)}"
                else:
                    detail = f"received '{_flag(received)}' but current is '{_flag(current)}'"
                raise precondition_failed(
                    f"inequivalent arg '{field}' for {kind} '{name}' "
                    f"in vhost '{self.name}': {detail}"
                )


def _durable_binding(binding: Binding) -> bool:
    """RabbitMQ keeps a binding across restarts when both its ends are durable (a
    private queue never is: it goes with its connection)."""
    source, destination = binding.source, binding.destination
    return (
        bool(source.name)
        and source.durable
        and getattr(destination, "durable", False)
        and not getattr(destination, "exclusive", False)
    )
