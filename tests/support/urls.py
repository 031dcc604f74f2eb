"""Every URL the console serves, filled in: for tests that walk them all (hostile
requests, secrets that must not leak)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from django.urls import URLPattern, URLResolver, get_resolver

#: (pattern, argument name, converter or regex) -> the value to put there
Filler = Callable[[str, str, str], str]

#: ``<converter:name>`` or ``<name>``
_CONVERTER = re.compile(r"<(?:(\w+):)?(\w+)>")
#: ``(?P<name>regex)``, regexes without parentheses of their own (the console's)
_GROUP = re.compile(r"\(\?P<(\w+)>([^()]*)\)")


def patterns() -> Iterator[str]:
    """The full pattern of every view (resolvers' prefixes joined)."""

    def walk(found: list, prefix: str) -> Iterator[str]:
        for entry in found:
            if isinstance(entry, URLResolver):
                yield from walk(entry.url_patterns, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern):
                yield prefix + str(entry.pattern)

    yield from walk(get_resolver().url_patterns, "")


def sample(pattern: str, name: str, kind: str) -> str:
    """A value each argument accepts: a number, a UUID, a word, the first alternative."""
    if kind in ("int", "path") or re.fullmatch(r"\\d\+|\[0-9\]\+", kind):
        return "1"
    if kind == "uuid" or "0-9a-fA-F" in kind:
        return "0" * 32
    if "|" in kind:
        return kind.split("|", 1)[0]
    return "x"


def concrete(pattern: str, fill: Filler = sample) -> str:
    """A path ``pattern`` matches, its arguments given by ``fill``."""
    path = _GROUP.sub(lambda m: fill(pattern, m.group(1), m.group(2)), pattern)
    path = _CONVERTER.sub(lambda m: fill(pattern, m.group(2), m.group(1) or "str"), path)
    return "/" + path.replace("^", "").replace("$", "").replace("\\.", ".")


def every_path(fill: Filler = sample) -> list[str]:
    """Every view's path, once; the websocket paths are not views (``console.asgi``)."""
    paths = sorted({concrete(p, fill) for p in patterns()})
    unfilled = [p for p in paths if "(" in p or "<" in p]
    assert not unfilled, unfilled
    return paths
