"""Exchanges: a name, flags, and the muxer that routes for them."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brokerd.model.message import Message
from brokerd.model.muxers import Binding, Muxer, lookup


class DefaultMuxer(Muxer):
    """The nameless direct exchange: every queue is implicitly bound by its name.

    ``elsewhere`` names queues that live on another server of a cluster and are
    not known here as queues (another server's private queues): a name missing
    from ``queues`` is looked up there, so a reply to an exclusive reply queue
    reaches it whichever server the reply is published on."""

    type_name = "direct"

    def __init__(self, queues: dict[str, Any], elsewhere: dict[str, Any] | None = None) -> None:
        super().__init__({})
        self.queues = queues
        self.elsewhere: dict[str, Any] = {} if elsewhere is None else elsewhere

    def route(self, message: Message) -> Collection[Any]:
        queue = self.queues.get(message.routing_key)
        if queue is None:
            queue = self.elsewhere.get(message.routing_key)
        return (queue,) if queue is not None else ()


class Exchange:
    def __init__(
        self,
        name: str,
        type_name: str,
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: dict[str, Any] | None = None,
        muxer: Muxer | None = None,
    ) -> None:
        self.name = name
        self.type_name = type_name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.muxer = muxer if muxer is not None else lookup(type_name)(self.arguments)
        #: bindings where this exchange is the source
        self.bindings: dict[tuple[Any, ...], Binding] = {}
        #: bindings where this exchange is the destination (exchange-to-exchange)
        self.inbound: dict[tuple[Any, ...], Binding] = {}
        #: how many of ``bindings`` lead to another exchange: 0 keeps routing on the fast path
        self.exchange_destinations = 0
        self.stats_in = 0
        #: bumped by every binding added or removed (a federation link that mirrors
        #: the binding keys upstream reads them again only when it moved)
        self.bindings_version = 0

    @property
    def is_default(self) -> bool:
        return self.name == ""

    def add_binding(self, binding: Binding) -> bool:
        if binding.key in self.bindings:
            return False
        self.muxer.validate(binding.routing_key, binding.arguments)
        self.muxer.bind(binding)
        self.bindings[binding.key] = binding
        self.bindings_version += 1
        if isinstance(binding.destination, Exchange):
            self.exchange_destinations += 1
        return True

    def remove_binding(self, binding: Binding) -> None:
        if self.bindings.pop(binding.key, None) is None:
            return
        self.bindings_version += 1
        self.muxer.unbind(binding)
        if isinstance(binding.destination, Exchange):
            self.exchange_destinations -= 1

    def __repr__(self) -> str:
        return f"<Exchange {self.name!r} {self.type_name}>"
