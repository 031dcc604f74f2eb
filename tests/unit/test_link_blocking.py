"""A cluster link is never held by the publisher block (its lanes carry what
unblocks everyone), even when the block reached it while it was still opening and
looked like any client: the soaks' data lanes that stopped being read for good
(``reading=stopped(blocked)`` on a link in a state dump) were such links."""

from __future__ import annotations

from typing import Any

from pamqp import commands

from brokerd.protocol import ConnectionState
from brokerd.protocol.connection import Connection
from tests.unit.test_connection_machine import PROTOCOL_HEADER, Client, publish_frames, start_ok

LINK_EXCHANGE = "amq.rookery.cluster"


class LinkHooks:
    """The cluster's side of a connection, as far as a link's publishes need it."""

    link_exchange = LINK_EXCHANGE

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes]] = []

    def admit(self, conn: Connection) -> None:
        return None

    def login_refused(self, conn: Connection, reason: str) -> None:
        return None

    def closed(self, conn: Connection) -> None:
        return None

    def known_hosts(self) -> str:
        return ""

    def link_records(self, conn: Connection, kind: str, body: bytes) -> None:
        self.records.append((kind, body))

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


def _link(blocked_while_opening: str | None) -> tuple[Client, LinkHooks]:
    client = Client()
    hooks = LinkHooks()
    client.conn.hooks = hooks  # type: ignore[assignment]
    client.feed(PROTOCOL_HEADER)
    claim = start_ok(caps={"connection.blocked": True})
    claim.client_properties["rookery_link"] = {"spid": "peer"}
    client.send(0, claim)
    client.send(0, commands.Connection.TuneOk(2047, 131072, 0))
    if blocked_while_opening is not None:
        client.conn.set_blocked(blocked_while_opening)  # the server blocked every client
    client.send(0, commands.Connection.Open("/"))
    assert client.conn.state is ConnectionState.OPEN and client.conn.cluster_link
    client.open_channel()
    return client, hooks


def test_a_link_blocked_while_it_was_opening_still_has_its_publishes_read() -> None:
    client, hooks = _link("cluster not ready: no root")
    out = client.feed(publish_frames(1, LINK_EXCHANGE, "cluster.data", b"records"))
    assert not client.conn.read_paused, "the link's lane would never be read again"
    assert hooks.records == [("cluster.data", b"records")]
    assert not [m for _, m in out if isinstance(m, commands.Connection.Blocked)]


def test_a_link_never_blocked_reads_as_before() -> None:
    client, hooks = _link(None)
    client.feed(publish_frames(1, LINK_EXCHANGE, "cluster.data", b"records"))
    assert hooks.records == [("cluster.data", b"records")] and not client.conn.read_paused
