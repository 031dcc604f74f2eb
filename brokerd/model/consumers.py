"""A queue's consumers (``Queue`` mixes this in): exclusivity, attach and detach,
and what a queue that lost its last consumer does (auto-delete, x-expires).

Delivery to them is the queue's own (``Queue.dispatch``): this half only keeps
the list it round-robins over."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from brokerd.model.errors import ACCESS_REFUSED, ChannelError
from brokerd.model.interfaces import ConsumerSink, PublishWaiter, Reply
from brokerd.model.message import Message


class QueueConsumers:
    """The consumers half of ``Queue``."""

    __slots__ = ()

    name: str
    vhost: str
    consumers: list[Any]
    had_consumers: bool
    auto_delete: bool
    deleted: bool
    expires: int | None
    on_unused: Callable[[Any], None] | None

    if TYPE_CHECKING:

        def dispatch(self) -> None: ...
        def push(self, message: Message, waiter: PublishWaiter | None = None) -> bool: ...
        def restore(self, message: Message, waiter: PublishWaiter | None = None) -> None: ...
        def touch(self) -> None: ...
        def _arm_unused(self) -> None: ...

    def check_consumer(self, consumer: ConsumerSink) -> None:
        """Refuse a consumer that exclusivity rules out (403, RabbitMQ's texts)."""
        if self.consumers and (consumer.exclusive or any(c.exclusive for c in self.consumers)):
            raise ChannelError(
                ACCESS_REFUSED,
                f"queue '{self.name}' in vhost '{self.vhost}' in exclusive use"
                if not consumer.exclusive
                else f"queue '{self.name}' in vhost '{self.vhost}' has consumers, "
                "cannot become exclusive",
            )

    def add_consumer(self, consumer: ConsumerSink, reply: Reply | None = None) -> None:
        """Attach a consumer; ``reply(None)`` (consume-ok) goes before any delivery,
        ``reply(error)`` refuses it. Without ``reply`` an error is raised."""
        try:
            self.check_consumer(consumer)
        except ChannelError as exc:
            if reply is None:
                raise
            reply(exc)
            return
        self.consumers.append(consumer)
        self.had_consumers = True
        if reply is not None:
            reply(None)
        self.dispatch()

    def push_held(
        self, message: Message, waiter: PublishWaiter | None = None, *, redelivered: bool = False
    ) -> bool:
        """``push`` (``restore`` if ``redelivered``) without offering the message to a
        consumer: a queue being handed to another server delivers nothing."""
        consumers, self.consumers = self.consumers, []
        try:
            if redelivered:
                self.restore(message, waiter)
                return True
            return self.push(message, waiter)
        finally:
            self.consumers = consumers

    def attach(self, consumer: ConsumerSink) -> None:
        """List a consumer that was checked and accepted elsewhere (a queue type that
        holds this one proxies it to the server that owns its messages): no
        exclusivity check, nothing dispatched from here."""
        self.consumers.append(consumer)
        self.had_consumers = True

    def detach(self, consumer: ConsumerSink) -> bool:
        """Take a consumer off without consequence (no auto-delete, no x-expires
        count): it is attached elsewhere now, or comes back at once (a cluster
        session that ended). False if it was not attached."""
        if consumer not in self.consumers:
            return False
        self.consumers.remove(consumer)
        return True

    def remove_consumer(self, consumer: ConsumerSink) -> None:
        """Detach a consumer (cancel, channel gone); an auto-delete queue that has
        lost its last consumer goes (``on_unused``), an x-expires one starts counting."""
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        self.check_unused()

    def check_unused(self) -> None:
        """The queue may have lost its last consumer (also to a session the cluster
        released): an auto-delete queue goes, an x-expires one starts counting."""
        if self.consumers or self.deleted:
            return
        if self.unused_auto_delete and self.on_unused is not None:
            self.on_unused(self)
        elif self.expires is not None:
            self.touch()
            self._arm_unused()

    @property
    def unused_auto_delete(self) -> bool:
        """An auto-delete queue goes once it had consumers and the last one left."""
        return self.auto_delete and self.had_consumers and not self.consumers
