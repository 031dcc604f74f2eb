"""Stand-ins for what cluster membership asks of a server, for unit tests of one
module: a clock the test moves, and a connection with a user and a vhost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Clock:
    """A monotonic clock that moves only when the test sets ``now``."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class User:
    name: str


@dataclass
class VHost:
    name: str = "/"


@dataclass
class Conn:
    """What membership reads of a client or link connection."""

    id: int
    user: User
    vhost: VHost = field(default_factory=VHost)
    client_properties: dict[str, Any] = field(default_factory=dict)
    name: str = "127.0.0.1:9"
    peer: tuple[str, int] = ("127.0.0.1", 9)
