"""SELECTOR muxer: ``x-selector`` exchanges route on an SQL-92 condition per binding.

The binding argument ``x-selector`` holds a JMS selector (see ``selector``);
it is compiled when the binding is made, and a bad one is refused there with
406 naming the position and the reason. A binding without ``x-selector``
takes every message. The routing key plays no part.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brokerd.model.errors import precondition_failed
from brokerd.model.message import Message
from brokerd.model.muxers.base import Binding, Muxer, register
from brokerd.model.muxers.selector import Evaluator, Fields, SelectorError, compile_selector

SELECTOR_ARGUMENT = "x-selector"


def binding_selector(arguments: dict[str, Any]) -> Evaluator | None:
    """The compiled selector of a binding (None: match all); 406 when it is bad."""
    text = arguments.get(SELECTOR_ARGUMENT)
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise precondition_failed(
            f"invalid {SELECTOR_ARGUMENT}: expected a string, got {type(text).__name__}"
        )
    try:
        return compile_selector(text)
    except SelectorError as exc:
        raise precondition_failed(f"invalid {SELECTOR_ARGUMENT}: {exc}") from None


@register
class SelectorMuxer(Muxer):
    type_name = "x-selector"

    def __init__(self, arguments: dict[str, Any]) -> None:
        super().__init__(arguments)
        self.bindings: dict[tuple[Any, ...], tuple[Any, Evaluator | None]] = {}

    def validate(self, routing_key: str, arguments: dict[str, Any]) -> None:
        binding_selector(arguments)

    def bind(self, binding: Binding) -> None:
        # compile_selector caches by text, so this is the compile validate() did
        self.bindings[binding.key] = (binding.destination, binding_selector(binding.arguments))

    def unbind(self, binding: Binding) -> None:
        self.bindings.pop(binding.key, None)

    def route(self, message: Message) -> Collection[Any]:
        if not self.bindings:
            return ()
        fields = Fields(message.headers, message.properties)
        found: dict[Any, None] = {}
        for destination, selector in self.bindings.values():
            if destination in found:
                continue
            if selector is None or selector(fields) is True:
                found[destination] = None
        return tuple(found)
