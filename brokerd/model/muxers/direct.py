"""DESTINATION muxer: ``direct`` exchanges route on routing-key equality."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brokerd.model.message import Message
from brokerd.model.muxers.base import Binding, Muxer, register


class KeyIndex:
    """routing key -> destinations, counting how many bindings back each pair."""

    __slots__ = ("_counts", "_routes")

    def __init__(self) -> None:
        self._counts: dict[str, dict[Any, int]] = {}
        self._routes: dict[str, tuple[Any, ...]] = {}

    def add(self, key: str, destination: Any) -> None:
        dests = self._counts.setdefault(key, {})
        dests[destination] = dests.get(destination, 0) + 1
        self._routes[key] = tuple(dests)

    def remove(self, key: str, destination: Any) -> None:
        dests = self._counts.get(key)
        if not dests or destination not in dests:
            return
        dests[destination] -= 1
        if dests[destination] <= 0:
            del dests[destination]
        if dests:
            self._routes[key] = tuple(dests)
        else:
            del self._counts[key]
            del self._routes[key]

    def get(self, key: str) -> tuple[Any, ...]:
        return self._routes.get(key, ())


@register
class DirectMuxer(Muxer):
    type_name = "direct"

    def __init__(self, arguments: dict[str, Any]) -> None:
        super().__init__(arguments)
        self.index = KeyIndex()

    def bind(self, binding: Binding) -> None:
        self.index.add(binding.routing_key, binding.destination)

    def unbind(self, binding: Binding) -> None:
        self.index.remove(binding.routing_key, binding.destination)

    def route(self, message: Message) -> Collection[Any]:
        return self.index.get(message.routing_key)
