"""What a connection asks of the world around it (the cluster, the server).

A standalone broker passes no hooks. A clustered one lets the cluster
controller decide at ``connection.open`` whether a connection may start
now, must wait for a root, or is refused (by raising ConnectionError_), take
part in wiring changes (``delegate`` before, ``replicate`` after), and take
the records its links publish (``link_records``) before any routing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pamqp.base import Frame as Method

    from brokerd.model.errors import AMQPError
    from brokerd.protocol.connection import Connection


@dataclass(frozen=True)
class Wait:
    """Hold connection.open-ok until admitted again, at most ``timeout`` seconds,
    then refuse with 541 and ``reason``."""

    reason: str
    timeout: float


#: how a delegated wiring change ends: the error to raise, or the root's result
WiringDone = Callable[["AMQPError | None", Any], None]


class ConnectionHooks(Protocol):
    #: the exchange cluster links publish their records to (``link_records``)
    link_exchange: str

    def admit(self, conn: Connection) -> Wait | None:
        """None admits now; Wait holds the open; raising ConnectionError_ refuses."""

    def login_refused(self, conn: Connection, reason: str) -> None:
        """A login failed (links with a wrong secret raise an alarm)."""

    def closed(self, conn: Connection) -> None:
        """The connection is gone, whatever the cause."""

    def known_hosts(self) -> str:
        """The servers a client may reconnect to (connection.open-ok's known-hosts)."""

    def delegate(self, conn: Connection, method: Method, done: WiringDone) -> bool:
        """Before a wiring method is applied here: True if the cluster takes it
        (it is applied when the root has ordered it, then ``done`` is called)."""

    def replicate(self, conn: Connection, method: Method) -> None:
        """A wiring method changed local state: order it, or tell the others."""

    def catch_up(self, conn: Connection, resume: Callable[[], None]) -> bool:
        """A method found no such exchange or queue here: True if this server may
        not have applied everything ordered yet; ``resume`` runs once it has (the
        method is then tried once more)."""

    def link_records(self, conn: Connection, kind: str, body: bytes) -> None:
        """What an admitted cluster link published to ``link_exchange``: the
        cluster's own messages, taken as they are (never routed, never counted as
        traffic); raising an AMQPError refuses them like a failed publish."""
