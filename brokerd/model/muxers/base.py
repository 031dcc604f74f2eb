"""The muxer interface and the registry of exchange types."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, ClassVar

from brokerd.model.errors import COMMAND_INVALID, ConnectionError_

if TYPE_CHECKING:
    from brokerd.model.message import Message


class Binding:
    """A binding from a source exchange to a destination (queue or exchange)."""

    __slots__ = ("arguments", "destination", "key", "routing_key", "source")

    def __init__(
        self, source: Any, destination: Any, routing_key: str, arguments: dict[str, Any]
    ) -> None:
        self.source = source
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = arguments
        #: identity of the binding: the same destination may be bound with several keys
        self.key = (id(destination), routing_key, _freeze(arguments))

    def __repr__(self) -> str:
        return f"<Binding {self.source.name!r} -> {self.destination.name!r} {self.routing_key!r}>"


def _freeze(value: Any) -> Any:
    """A hashable equal-when-equal form of a decoded field value (tables, arrays, byte arrays)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


class Muxer:
    """Routing state of one exchange.

    Subclasses keep their own index of bindings and answer ``route`` with the
    destinations a message goes to (each at most once). ``validate`` refuses
    a bad binding before it is stored (raise a 406 ChannelError).
    """

    type_name: ClassVar[str] = ""
    #: publishes to it are client traffic (counted in the published totals and rates);
    #: false for the cluster's own control exchange
    client_traffic: ClassVar[bool] = True

    def __init__(self, arguments: dict[str, Any]) -> None:
        self.arguments = arguments

    def validate(self, routing_key: str, arguments: dict[str, Any]) -> None:
        """Refuse a binding this muxer cannot evaluate."""

    def bind(self, binding: Binding) -> None:
        raise NotImplementedError

    def unbind(self, binding: Binding) -> None:
        raise NotImplementedError

    def route(self, message: Message) -> Collection[Any]:
        raise NotImplementedError


MUXERS: dict[str, type[Muxer]] = {}


def register(cls: type[Muxer]) -> type[Muxer]:
    """Class decorator: make ``cls`` available as exchange type ``cls.type_name``."""
    MUXERS[cls.type_name] = cls
    return cls


def lookup(type_name: str) -> type[Muxer]:
    """The muxer class for an exchange type; an unknown type is a 503 connection error."""
    try:
        return MUXERS[type_name]
    except KeyError:
        raise ConnectionError_(COMMAND_INVALID, f"unknown exchange type '{type_name}'") from None
