"""WILD PROPERTY muxer: ``x-wild-headers`` matches header values against glob patterns.

Like ``headers`` (``x-match`` all or any, ``x-`` arguments ignored, a void
value tests presence), but a string binding value is a pattern: ``*`` any
run of characters (dots included), ``?`` one character, ``\\`` quotes the
next one. So ``FOREX.*`` takes ``FOREX.EUR.USD``. A pattern matches string
(and UTF-8 byte) header values only; other binding values compare equal as
in ``headers``. Patterns are compiled at bind time and match in linear time.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brokerd.model.errors import precondition_failed
from brokerd.model.message import Message
from brokerd.model.muxers.base import Binding, Muxer, register
from brokerd.model.muxers.glob import Glob, wild_pattern
from brokerd.model.muxers.headers import _same

WILD_MATCH_MODES = ("all", "any")


class _Rule:
    """One binding compiled: (header name, glob, or the value to equal, or None for presence)."""

    __slots__ = ("destination", "tests", "want_all")

    def __init__(self, destination: Any, arguments: dict[str, Any]) -> None:
        self.destination = destination
        self.want_all = arguments.get("x-match", "all") == "all"
        self.tests: list[tuple[str, Glob | None, Any]] = []
        for name, expected in arguments.items():
            if name.startswith("x-"):
                continue
            if isinstance(expected, bytes):
                expected = expected.decode("utf-8", "replace")
            glob = wild_pattern(expected) if isinstance(expected, str) else None
            self.tests.append((name, glob, expected))

    def matches(self, headers: dict[str, Any]) -> bool:
        for name, glob, expected in self.tests:
            ok = name in headers and _test(headers[name], glob, expected)
            if ok and not self.want_all:
                return True
            if not ok and self.want_all:
                return False
        return self.want_all


def _test(actual: Any, glob: Glob | None, expected: Any) -> bool:
    if glob is not None:
        if isinstance(actual, bytes):
            try:
                actual = actual.decode()
            except UnicodeDecodeError:
                return False
        return isinstance(actual, str) and glob.match(actual)
    return expected is None or _same(actual, expected)


@register
class WildHeadersMuxer(Muxer):
    type_name = "x-wild-headers"

    def __init__(self, arguments: dict[str, Any]) -> None:
        super().__init__(arguments)
        self.rules: dict[tuple[Any, ...], _Rule] = {}

    def validate(self, routing_key: str, arguments: dict[str, Any]) -> None:
        mode = arguments.get("x-match", "all")
        if mode not in WILD_MATCH_MODES:
            raise precondition_failed(
                f"invalid x-match field value {mode!r}; expected one of "
                f"{', '.join(WILD_MATCH_MODES)}"
            )

    def bind(self, binding: Binding) -> None:
        self.rules[binding.key] = _Rule(binding.destination, binding.arguments)

    def unbind(self, binding: Binding) -> None:
        self.rules.pop(binding.key, None)

    def route(self, message: Message) -> Collection[Any]:
        if not self.rules:
            return ()
        headers = message.headers
        found: dict[Any, None] = {}
        for rule in self.rules.values():
            if rule.destination not in found and rule.matches(headers):
                found[rule.destination] = None
        return tuple(found)
