"""PROPERTY muxer: ``headers`` exchanges match message headers against binding arguments.

As RabbitMQ: ``x-match`` is ``all`` (default), ``any``, ``all-with-x`` or
``any-with-x``; binding arguments starting with ``x-`` are ignored by the
first two; an argument of type void matches on the header's presence.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brokerd.model.errors import precondition_failed
from brokerd.model.message import Message
from brokerd.model.muxers.base import Binding, Muxer, register

X_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")


def header_match(binding_args: dict[str, Any], headers: dict[str, Any]) -> bool:
    """Does a message with ``headers`` match a binding with ``binding_args``?"""
    mode = binding_args.get("x-match", "all")
    with_x = mode.endswith("-with-x")
    want_all = mode.startswith("all")
    for name, expected in binding_args.items():
        if name == "x-match" or (not with_x and name.startswith("x-")):
            continue
        if name in headers and (expected is None or _same(headers[name], expected)):
            if not want_all:
                return True
        elif want_all:
            return False
    return want_all


def _same(actual: Any, expected: Any) -> bool:
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is type(expected) and actual == expected
    return bool(actual == expected)


@register
class HeadersMuxer(Muxer):
    type_name = "headers"

    def __init__(self, arguments: dict[str, Any]) -> None:
        super().__init__(arguments)
        self.bindings: dict[tuple[Any, ...], Binding] = {}

    def validate(self, routing_key: str, arguments: dict[str, Any]) -> None:
        mode = arguments.get("x-match", "all")
        if mode not in X_MATCH_MODES:
            raise precondition_failed(
                f"invalid x-match field value {mode!r}; expected one of {', '.join(X_MATCH_MODES)}"
            )

    def bind(self, binding: Binding) -> None:
        self.bindings[binding.key] = binding

    def unbind(self, binding: Binding) -> None:
        self.bindings.pop(binding.key, None)

    def route(self, message: Message) -> Collection[Any]:
        if not self.bindings:
            return ()
        headers = message.headers
        found: dict[Any, None] = {}
        for binding in self.bindings.values():
            if binding.destination not in found and header_match(binding.arguments, headers):
                found[binding.destination] = None
        return tuple(found)
