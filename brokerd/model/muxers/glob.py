"""Wildcard matching without backtracking, for LIKE (x-selector) and x-wild-headers.

A pattern is a sequence of literal characters, "any one character" and
"any run of characters". It is split at the runs into segments; the first
segment must match at the start, the last at the end, and each middle one
is taken at its leftmost place (taking it further right never helps). That
costs at most (value length x pattern length), where a regular expression
such as ``.*a.*a.*a.*b`` may try every combination of splits.
"""

from __future__ import annotations

from collections.abc import Iterable

#: pattern elements: a one-character literal string, ONE or MANY
ONE = object()
MANY = object()

Element = str | object


class Glob:
    """A compiled pattern; ``match(value)`` answers for the whole value."""

    __slots__ = ("_exact", "_segments")

    def __init__(self, elements: Iterable[Element]) -> None:
        segments: list[list[Element]] = [[]]
        for element in elements:
            if element is MANY:
                if segments[-1] or len(segments) == 1:
                    segments.append([])
            else:
                segments[-1].append(element)
        #: ``[[...]]`` (no MANY): the value must match the single segment exactly
        self._exact = len(segments) == 1
        self._segments = [tuple(seg) for seg in segments]

    def match(self, value: str) -> bool:
        segs = self._segments
        if self._exact:
            return len(value) == len(segs[0]) and _fits(segs[0], value, 0)
        first, last, middle = segs[0], segs[-1], segs[1:-1]
        if len(value) < len(first) + len(last) or not _fits(first, value, 0):
            return False
        end = len(value) - len(last)
        if not _fits(last, value, end):
            return False
        pos = len(first)
        for seg in middle:
            pos = _find(seg, value, pos, end)
            if pos < 0:
                return False
            pos += len(seg)
        return True


def _fits(seg: tuple[Element, ...], value: str, at: int) -> bool:
    """Does ``seg`` match ``value`` at offset ``at`` (length already checked)?"""
    for i, element in enumerate(seg):
        if element is not ONE and element != value[at + i]:
            return False
    return True


def _find(seg: tuple[Element, ...], value: str, start: int, end: int) -> int:
    """Leftmost offset in [start, end - len(seg)] where ``seg`` fits, or -1."""
    if not seg:
        return start
    if ONE not in seg:  # plain text: str.find is linear
        return value.find("".join(seg), start, end)  # type: ignore[arg-type]
    for at in range(start, end - len(seg) + 1):
        if _fits(seg, value, at):
            return at
    return -1


def like_pattern(pattern: str, escape: str | None = None) -> Glob:
    """SQL LIKE: ``%`` any run, ``_`` any one character, ``escape`` quotes the next one.

    Raises ValueError for a dangling escape character."""
    elements: list[Element] = []
    chars = iter(pattern)
    for ch in chars:
        if escape is not None and ch == escape:
            nxt = next(chars, None)
            if nxt is None:
                raise ValueError(f"LIKE pattern ends with its escape character {escape!r}")
            elements.append(nxt)
        elif ch == "%":
            elements.append(MANY)
        elif ch == "_":
            elements.append(ONE)
        else:
            elements.append(ch)
    return Glob(elements)


def wild_pattern(pattern: str) -> Glob:
    """x-wild-headers: ``*`` any run (dots included), ``?`` one character, ``\\`` quotes."""
    elements: list[Element] = []
    chars = iter(pattern)
    for ch in chars:
        if ch == "\\":
            nxt = next(chars, None)
            elements.append("\\" if nxt is None else nxt)
        elif ch == "*":
            elements.append(MANY)
        elif ch == "?":
            elements.append(ONE)
        else:
            elements.append(ch)
    return Glob(elements)
