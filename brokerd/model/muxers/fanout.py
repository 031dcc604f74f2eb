"""SIMPLE muxer: ``fanout`` exchanges copy every message to every bound destination."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brokerd.model.message import Message
from brokerd.model.muxers.base import Binding, Muxer, register


@register
class FanoutMuxer(Muxer):
    type_name = "fanout"

    def __init__(self, arguments: dict[str, Any]) -> None:
        super().__init__(arguments)
        self._counts: dict[Any, int] = {}
        self._routes: tuple[Any, ...] = ()

    def bind(self, binding: Binding) -> None:
        dest = binding.destination
        self._counts[dest] = self._counts.get(dest, 0) + 1
        self._routes = tuple(self._counts)

    def unbind(self, binding: Binding) -> None:
        dest = binding.destination
        if dest in self._counts:
            self._counts[dest] -= 1
            if self._counts[dest] <= 0:
                del self._counts[dest]
            self._routes = tuple(self._counts)

    def route(self, message: Message) -> Collection[Any]:
        return self._routes
