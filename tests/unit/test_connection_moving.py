"""A connection moving to a sibling worker (``brokerd/protocol/moving.py``), sans-IO:
the client cannot tell. Whatever it pipelines, however it splits its writes, the
bytes it hears from the machine that gave the connection away and then from the
one that took it are the bytes one machine would have said, and the broker holds
the same messages."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, frame

from brokerd.model.auth import Permission, User, UserDatabase, hash_password
from brokerd.model.broker import Broker
from brokerd.protocol.connection import Connection
from brokerd.protocol.moving import MoveError
from brokerd.wire.codec import PROTOCOL_HEADER
from tests.unit.test_connection_machine import (
    LOOPBACK,
    FakeClock,
    parse,
    publish_frames,
    start_ok,
)

#: guest's password, hashed cheaply: every example logs in twice
_GUEST = hash_password("guest", iterations=1000)


def make_broker() -> Broker:
    users = UserDatabase()
    users.add_user(User("guest", _GUEST, ("administrator",), loopback_only=True))
    users.set_permission("guest", "/", Permission())
    return Broker(users, ["/"])


class Always:
    """A mover that sends every quiet connection to ``"sibling"`` (at ``only`` that
    method, if named)."""

    def __init__(self, only: str | None = None) -> None:
        self.only = only
        self.asked: list[tuple[int, str]] = []

    def destination(self, conn: Connection, channel: int, method: Any) -> str | None:
        name = type(method).__name__
        self.asked.append((channel, name))
        return "sibling" if self.only in (None, name) else None


def handshake(confirm: bool, prefetch: int) -> bytes:
    methods: list[tuple[int, Any]] = [
        (0, start_ok()),
        (0, commands.Connection.TuneOk(2047, 131072, 0)),
        (0, commands.Connection.Open("/")),
        (1, commands.Channel.Open()),
        (1, commands.Queue.Declare(queue="q")),
        (2, commands.Channel.Open()),
    ]
    if confirm:
        methods.append((1, commands.Confirm.Select()))
    if prefetch:
        methods.append((2, commands.Basic.Qos(prefetch_count=prefetch)))
    return PROTOCOL_HEADER + b"".join(frame.marshal(m, ch) for ch, m in methods)


def session(
    confirm: bool, prefetch: int, bodies: list[bytes], consume_first: bool, before: int = 0
) -> bytes:
    """Everything a client sends: the handshake, ``before`` publishes, a consume or
    not, publishes, a get."""
    out = handshake(confirm, prefetch)
    for n in range(before):
        out += publish_frames(1, "", "q", b"before-%d" % n)
    if consume_first:
        out += frame.marshal(commands.Basic.Consume(queue="q", consumer_tag="c1"), 2)
    for body in bodies:
        out += publish_frames(1, "", "q", body)
    out += frame.marshal(commands.Basic.Get(queue="q", no_ack=True), 1)
    return out


def run(data: bytes, cuts: list[int], broker: Broker, mover: Always | None) -> tuple[bytes, Any]:
    """Feed ``data`` in pieces; when the machine wants to move, restore its snapshot
    into a second machine (on the same broker) and feed the rest there."""
    clock = FakeClock()
    conn = Connection(broker, LOOPBACK, clock=clock, mover=mover)
    said = b""
    edges = [*sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    start = 0
    moved = None
    for edge in edges:
        target = moved or conn
        target.receive_data(data[start:edge])
        start = edge
        said += target.data_to_send()
        if moved is None and conn.moving_to is not None:
            state = json.loads(json.dumps(conn.snapshot()))  # as it crosses the socket
            conn.left()
            moved = Connection(broker, LOOPBACK, clock=clock)
            moved.receive_data(moved.restore(state))  # its waiting frames, then the rest
            said += moved.data_to_send()
    return said, moved


@settings(max_examples=80, deadline=None)
@given(
    confirm=st.booleans(),
    prefetch=st.sampled_from([0, 1, 10]),
    bodies=st.lists(st.binary(min_size=0, max_size=300), min_size=1, max_size=6),
    consume_first=st.booleans(),
    cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=6),
)
def test_a_moved_connection_says_what_one_that_stayed_says(
    confirm: bool, prefetch: int, bodies: list[bytes], consume_first: bool, cuts: list[int]
) -> None:
    data = session(confirm, prefetch, bodies, consume_first)
    stayed_broker, moved_broker = make_broker(), make_broker()
    stayed, _ = run(data, cuts, stayed_broker, None)
    mover = Always()
    moved, taker = run(data, cuts, moved_broker, mover)
    assert taker is not None, "the connection never moved"
    assert mover.asked == [(2 if consume_first else 1, "Consume" if consume_first else "Publish")]
    assert moved == stayed, (parse(moved), parse(stayed))
    for broker in (stayed_broker, moved_broker):
        assert broker.connection_count == 1  # the giver's count went, the taker's came
    left = [m.body for m, _ in moved_broker.vhosts["/"].queues["q"].ready()]
    assert left == [m.body for m, _ in stayed_broker.vhosts["/"].queues["q"].ready()]


@settings(max_examples=40, deadline=None)
@given(
    before=st.integers(min_value=1, max_value=4),
    bodies=st.lists(st.binary(max_size=100), min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=1, max_value=3000), max_size=4),
)
def test_confirms_go_on_counting_where_the_connection_moved(
    before: int, bodies: list[bytes], cuts: list[int]
) -> None:
    """Publishes confirmed where it was, then its consume moves it: the next confirm's
    delivery tag follows on, as one machine's would."""
    data = session(True, 0, bodies, True, before)
    # the consume comes in a read of its own: the publishes before it are confirmed
    consume_at = len(session(True, 0, [], False, before)) - len(
        frame.marshal(commands.Basic.Get(queue="q", no_ack=True), 1)
    )
    cuts = [consume_at, *(c for c in cuts if c > consume_at)]
    stayed, _ = run(data, cuts, make_broker(), None)
    mover = Always(only="Consume")
    moved, taker = run(data, cuts, make_broker(), mover)
    assert taker is not None and mover.asked == [(1, "Publish"), (2, "Consume")]
    assert taker.channels[1].publish_seq == before + len(bodies)
    assert moved == stayed, (parse(moved), parse(stayed))


def test_a_busy_connection_does_not_move() -> None:
    """Unconfirmed publishes, a consumer or a transaction keep it where it is."""
    broker = make_broker()
    mover = Always()
    conn = Connection(broker, LOOPBACK, clock=FakeClock(), mover=mover)
    conn.receive_data(handshake(confirm=False, prefetch=0))
    conn.receive_data(frame.marshal(commands.Tx.Select(), 1))
    conn.receive_data(publish_frames(1, "", "q", b"x"))
    assert conn.moving_to is None and mover.asked == []
    conn.receive_data(frame.marshal(commands.Basic.Consume(queue="q", consumer_tag="t"), 2))
    assert conn.moving_to is None  # tx still open on channel 1


def test_each_moment_is_looked_at_once() -> None:
    broker = make_broker()

    class Never(Always):
        def destination(self, conn: Connection, channel: int, method: Any) -> None:  # type: ignore[override]
            super().destination(conn, channel, method)
            return None

    mover = Never()
    conn = Connection(broker, LOOPBACK, clock=FakeClock(), mover=mover)
    conn.receive_data(handshake(confirm=False, prefetch=0))
    for _ in range(3):
        conn.receive_data(publish_frames(1, "", "q", b"x"))
    conn.receive_data(frame.marshal(commands.Basic.Consume(queue="q", consumer_tag="t"), 2))
    assert mover.asked == [(1, "Publish"), (2, "Consume")]
    assert not conn._move_watch


def test_a_snapshot_naming_an_unknown_user_is_refused() -> None:
    broker = make_broker()
    conn = Connection(broker, LOOPBACK, clock=FakeClock(), mover=Always())
    conn.receive_data(handshake(confirm=True, prefetch=0) + publish_frames(1, "", "q", b"x"))
    state = conn.snapshot()
    state["user"] = "nobody"
    with pytest.raises(MoveError):
        Connection(make_broker(), LOOPBACK, clock=FakeClock()).restore(state)
