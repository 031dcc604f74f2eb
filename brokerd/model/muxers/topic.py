"""WILD DESTINATION muxer: ``topic`` exchanges match dotted keys against ``*``/``#`` patterns.

Bindings are held in a trie of words. Routing runs the trie as an NFA: the
set of trie nodes a key prefix can be at advances one word at a time, and a
node reached through ``#`` stays in the set while it eats words. Each node
enters the set at most once per word, so a key of ``k`` words costs at most
``k x`` (trie size) node visits, whatever the patterns: ``#.#.#.#.#.#.#.#``
against a 100-word key costs about 800 visits where a backtracking matcher
tries ~10^11 splits. Results are cached per routing key; any binding change
drops the cache. Semantics are RabbitMQ's: ``*`` is exactly one word, ``#``
zero or more, words may be empty (``a..b``) and the empty key has none.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brokerd.model.message import Message
from brokerd.model.muxers.base import Binding, Muxer, register

_CACHE_LIMIT = 4096


class _Node:
    __slots__ = ("children", "destinations", "hash_child", "is_hash")

    def __init__(self, is_hash: bool = False) -> None:
        #: reached through a '#' edge: it may eat any number of words
        self.is_hash = is_hash
        self.children: dict[str, _Node] = {}
        self.destinations: dict[Any, int] = {}
        #: children["#"], kept apart because every step looks for it
        self.hash_child: _Node | None = None


def words(key: str) -> list[str]:
    """A key's dot-separated words; as in RabbitMQ the empty key has none."""
    return key.split(".") if key else []


def pattern_words(pattern: str) -> list[str]:
    """A binding pattern's words with runs of '#' folded into one ('#.#' means '#')."""
    out: list[str] = []
    for word in words(pattern):
        if word != "#" or not out or out[-1] != "#":
            out.append(word)
    return out


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Reference matcher (used by tests): does ``pattern`` match ``routing_key``?

    Dynamic programming over (pattern words, key words): O(p x k), and simple
    enough to trust as the oracle for the trie."""
    pat, key = words(pattern), words(routing_key)
    # ok[j]: the pattern prefix seen so far matches the first j key words
    ok = [True] + [False] * len(key)
    for p in pat:
        if p == "#":
            for j in range(1, len(key) + 1):
                ok[j] = ok[j] or ok[j - 1]
        else:
            ok = [False] + [
                ok[j - 1] and (p == "*" or p == key[j - 1]) for j in range(1, len(key) + 1)
            ]
    return ok[len(key)]


@register
class TopicMuxer(Muxer):
    type_name = "topic"

    def __init__(self, arguments: dict[str, Any]) -> None:
        super().__init__(arguments)
        self.root = _Node()
        self._cache: dict[str, tuple[Any, ...]] = {}
        #: trie nodes visited by uncached routes since creation (a bound on work, for tests)
        self.visits = 0

    def bind(self, binding: Binding) -> None:
        node = self.root
        for word in pattern_words(binding.routing_key):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node(word == "#")
                if word == "#":
                    node.hash_child = child
            node = child
        dest = binding.destination
        node.destinations[dest] = node.destinations.get(dest, 0) + 1
        self._cache.clear()

    def unbind(self, binding: Binding) -> None:
        path = [self.root]
        path_words = pattern_words(binding.routing_key)
        for word in path_words:
            nxt = path[-1].children.get(word)
            if nxt is None:
                return
            path.append(nxt)
        node = path[-1]
        dest = binding.destination
        if dest not in node.destinations:
            return
        node.destinations[dest] -= 1
        if node.destinations[dest] <= 0:
            del node.destinations[dest]
        # prune empty branches
        for depth in range(len(path_words), 0, -1):
            child = path[depth]
            if child.children or child.destinations:
                break
            parent, word = path[depth - 1], path_words[depth - 1]
            del parent.children[word]
            if word == "#":
                parent.hash_child = None
        self._cache.clear()

    def route(self, message: Message) -> Collection[Any]:
        key = message.routing_key
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        result = self.match(key)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = result
        return result

    def match(self, key: str) -> tuple[Any, ...]:
        """The destinations whose patterns match ``key``, each once (uncached)."""
        active = _closure({self.root: None})
        visits = len(active)
        for word in words(key):
            step: dict[_Node, None] = {}
            for node in active:
                children = node.children
                child = children.get(word)
                if child is not None:
                    step[child] = None
                if word != "*":  # a literal '*' word already took the '*' edge above
                    child = children.get("*")
                    if child is not None:
                        step[child] = None
                if node.is_hash:  # '#' eats this word and may eat more: stay
                    step[node] = None
            if not step:
                self.visits += visits
                return ()
            active = _closure(step)
            visits += len(active)
        self.visits += visits
        found: dict[Any, None] = {}
        for node in active:
            if node.destinations:
                found.update(dict.fromkeys(node.destinations))
        return tuple(found)


def _closure(nodes: dict[_Node, None]) -> dict[_Node, None]:
    """Add the nodes reachable through '#' edges that match zero words."""
    pending = [n for n in nodes if n.hash_child is not None]
    while pending:
        child = pending.pop().hash_child
        if child is not None and child not in nodes:
            nodes[child] = None
            if child.hash_child is not None:
                pending.append(child)
    return nodes
