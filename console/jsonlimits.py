"""Reading JSON from clients without recursion errors or absurd numbers.

Python's ``json`` recurses once per nesting level, so about 2 KB of ``[`` is
enough for a ``RecursionError``, which no caller expects from a parser (it is
not a ValueError). :func:`json_depth` measures the nesting first, with a linear
scan that skips string literals and never recurses; :func:`load_json` is the
one reader for client JSON (the API's parser, the dashboard's configuration
editor): depth-checked, and refusing the numbers that would otherwise fail
later and further from their cause. No Django or DRF imports beyond the
settings, so the API's parser can use it while DRF is still loading.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from itertools import accumulate
from typing import Any

from django.conf import settings

#: Python converts longer decimal integers only when told to (ValueError otherwise,
#: and the conversion is quadratic): the same bound, with a message of our own
MAX_INTEGER_DIGITS = 4300

# A JSON string literal, escapes included; the closing quote is optional so that an
# unterminated string ends the scan at once instead of being retried at every quote.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# only a \u escape can put a surrogate into text decoded from UTF-8
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# openers -> 1, closers -> -1 (0xff as a signed byte), for a running sum in C
_STEPS = str.maketrans({"[": "\x01", "{": "\x01", "]": "\xff", "}": "\xff"})


class JsonRefused(ValueError):
    """Client JSON that :func:`load_json` will not read; the message says why."""


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text``, without parsing it.

    Brackets inside string literals do not count. Linear in ``len(text)`` and
    computed in C (two regex passes and a running sum). For invalid JSON the answer
    is never below what a parser reaches before it fails: up to the first error the
    text is valid, so the count there is exact, and the maximum over all of the text
    is at least the maximum over that part."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    steps = array("b", brackets.translate(_STEPS).encode("latin-1"))
    return max(0, max(accumulate(steps)))


def check_json_depth(text: str, limit: int | None = None) -> None:
    """JsonRefused if ``text`` nests deeper than ``limit`` (default ``MAX_JSON_DEPTH``)."""
    limit = settings.MAX_JSON_DEPTH if limit is None else limit
    if json_depth(text) > limit:
        raise JsonRefused(f"JSON nested deeper than {limit} levels (arrays and objects)")


def load_json(text: str) -> Any:
    """``json.loads`` for client text: depth-checked first, then parsed with numbers
    refused that would fail later and further from their cause (``1e999`` is an
    infinity that no JSON response can carry; NaN and Infinity are not JSON).
    Every refusal is a ValueError: :class:`JsonRefused` for these limits,
    ``json.JSONDecodeError`` (with its line and column) for a syntax error; never
    RecursionError."""
    check_json_depth(text)
    try:
        value = json.loads(
            text, parse_float=_finite_float, parse_int=_bounded_int, parse_constant=_no_constant
        )
    except RecursionError:  # unreachable after the depth check; the last line of defence
        raise JsonRefused("JSON nested too deeply") from None
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(value)
    return value


def _refuse_lone_surrogates(value: Any) -> None:
    """JsonRefused for a string holding half a surrogate pair (``"\\ud800"``): JSON
    can spell one, UTF-8 cannot encode it, so it would fail wherever the value is
    next written (a database, a response, a log line)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise JsonRefused("a string holds an unpaired UTF-16 surrogate (\\ud800-\\udfff)")
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise JsonRefused(f"number {_shorten(literal)} is out of range (finite numbers only)")
    return value


def _bounded_int(literal: str) -> int:
    digits = len(literal) - literal.startswith("-")
    if digits > MAX_INTEGER_DIGITS:
        raise JsonRefused(f"an integer of {digits} digits (at most {MAX_INTEGER_DIGITS})")
    return int(literal)


def _no_constant(literal: str) -> Any:
    raise JsonRefused(f"{literal} is not a JSON number")


def _shorten(literal: str, keep: int = 24) -> str:
    return literal if len(literal) <= keep else f"{literal[:keep]}... ({len(literal)} characters)"
