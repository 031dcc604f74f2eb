"""WILD DESTINATION muxer: ``topic`` exchanges match dotted keys against ``*``/``#`` patterns.

Bindings are held in a trie of words; results are cached per routing key
and the cache is dropped whenever a binding changes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from brokerd.model.message import Message
from brokerd.model.muxers.base import Binding, Muxer, register

_CACHE_LIMIT = 4096


class _Node:
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.destinations: dict[Any, int] = {}


def words(key: str) -> list[str]:
    """A key's dot-separated words; as in RabbitMQ the empty key has none."""
    return key.split(".") if key else []


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Reference matcher (used by tests): does ``pattern`` match ``routing_key``?"""
    return _match(words(pattern), words(routing_key))


def _match(pat: list[str], key: list[str]) -> bool:
    if not pat:
        return not key
    head, rest = pat[0], pat[1:]
    if head == "#":
        return any(_match(rest, key[i:]) for i in range(len(key) + 1))
    if not key:
        return False
    if head == "*" or head == key[0]:
        return _match(rest, key[1:])
    return False


@register
class TopicMuxer(Muxer):
    type_name = "topic"

    def __init__(self, arguments: dict[str, Any]) -> None:
        super().__init__(arguments)
        self.root = _Node()
        self._cache: dict[str, tuple[Any, ...]] = {}

    def bind(self, binding: Binding) -> None:
        node = self.root
        for word in words(binding.routing_key):
            node = node.children.setdefault(word, _Node())
        dest = binding.destination
        node.destinations[dest] = node.destinations.get(dest, 0) + 1
        self._cache.clear()

    def unbind(self, binding: Binding) -> None:
        path = [self.root]
        path_words = words(binding.routing_key)
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
            del path[depth - 1].children[path_words[depth - 1]]
        self._cache.clear()

    def route(self, message: Message) -> Collection[Any]:
        key = message.routing_key
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        found: dict[Any, None] = {}
        self._walk(self.root, words(key), 0, found)
        result = tuple(found)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = result
        return result

    def _walk(self, node: _Node, key_words: list[str], i: int, found: dict[Any, None]) -> None:
        children = node.children
        if i == len(key_words):
            found.update(dict.fromkeys(node.destinations))
            hash_node = children.get("#")
            if hash_node is not None:  # '#' also matches zero words
                self._walk(hash_node, key_words, i, found)
            return
        child = children.get(key_words[i])
        if child is not None:
            self._walk(child, key_words, i + 1, found)
        child = children.get("*")
        if child is not None:
            self._walk(child, key_words, i + 1, found)
        child = children.get("#")
        if child is not None:
            for j in range(i, len(key_words) + 1):
                self._walk(child, key_words, j, found)
