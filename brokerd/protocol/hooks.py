"""What a connection asks of the world around it (the cluster, the server).

A standalone broker passes no hooks. A clustered one lets the cluster
controller decide at ``connection.open`` whether a connection may start
now, must wait for a root, or is refused (by raising ConnectionError_).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pamqp.base import Frame as Method

    from brokerd.protocol.channel import Channel
    from brokerd.protocol.connection import Connection


@dataclass(frozen=True)
class Wait:
    """Hold connection.open-ok until admitted again, at most ``timeout`` seconds,
    then refuse with 541 and ``reason``."""

    reason: str
    timeout: float


class ConnectionHooks(Protocol):
    def admit(self, conn: Connection) -> Wait | None:
        """None admits now; Wait holds the open; raising ConnectionError_ refuses."""

    def login_refused(self, conn: Connection, reason: str) -> None:
        """A login failed (links with a wrong secret raise an alarm)."""

    def closed(self, conn: Connection) -> None:
        """The connection is gone, whatever the cause."""

    def replicate(self, conn: Connection, channel: Channel, method: Method) -> bool:
        """A wiring method changed local state. True: the cluster takes it and will
        call ``channel.replicated(error)`` once the root has ordered it."""
