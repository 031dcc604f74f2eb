"""Publishes that a queue completes later (a queue on another server, a disk write):
confirms wait for them and still go out in publish order, folded; a mandatory
message nobody took is returned first; blocked publishers stop being read.

Driven through the sans-IO connection with a queue type that defers every push
and lets the test answer for it, as the cluster's proxies answer when the root
has settled a forward."""

from __future__ import annotations

from collections.abc import Callable

from pamqp import commands

from brokerd.model.interfaces import PublishWaiter
from brokerd.model.message import Message
from brokerd.model.queue import Queue
from tests.unit.test_connection_machine import Client, publish_frames, start_ok


class DeferringQueue(Queue):
    """Takes nothing itself: every push waits for the test's answer."""

    answers: list[Callable[[bool, int], None]]

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.answers = []

    def push(self, message: Message, waiter: PublishWaiter | None = None) -> bool:
        if waiter is not None:
            self.answers.append(waiter.defer())
        return True


def deferring_client(*names: str) -> tuple[Client, dict[str, DeferringQueue]]:
    client = Client()
    vhost = client.broker.vhosts["/"]
    vhost.queue_factory = DeferringQueue
    queues = {}
    for name in names:
        queue, _ = vhost.declare_queue(name, connection_id=0)
        queues[name] = queue  # type: ignore[assignment]
    client.handshake()
    client.open_channel()
    return client, queues  # type: ignore[return-value]


def confirms(out: list[tuple[int, object]]) -> list[tuple[str, int, bool]]:
    return [
        (type(m).__name__, m.delivery_tag, m.multiple)
        for _, m in out
        if isinstance(m, commands.Basic.Ack | commands.Basic.Nack)
    ]


def test_confirms_wait_for_deferred_queues_and_keep_publish_order() -> None:
    c, queues = deferring_client("remote")
    c.conn.broker.vhosts["/"].declare_queue("local", connection_id=0)  # a deferring type too
    c.send(1, commands.Confirm.Select())
    out = c.feed(
        publish_frames(1, "", "remote", b"1")
        + publish_frames(1, "", "remote", b"2")
        + publish_frames(1, "", "nowhere", b"3")  # routed nowhere: confirmable at once
    )
    assert confirms(out) == []  # 3 must not overtake 1 and 2
    answers = queues["remote"].answers
    answers[1](True, 1)  # the second answers first
    assert confirms(c.replies()) == []
    answers[0](True, 1)
    assert confirms(c.replies()) == [("Ack", 3, True)]  # one multiple ack for 1..3


def test_a_refused_deferred_publish_is_nacked_alone() -> None:
    c, queues = deferring_client("remote")
    c.send(1, commands.Confirm.Select())
    c.feed(b"".join(publish_frames(1, "", "remote", b"%d" % i) for i in range(3)))
    answers = queues["remote"].answers
    answers[0](True, 1)
    answers[1](False, 0)  # refused (a full queue on the root)
    answers[2](True, 1)
    assert confirms(c.replies()) == [("Ack", 1, True), ("Nack", 2, False), ("Ack", 3, True)]


def test_mandatory_return_when_no_queue_anywhere_took_it() -> None:
    c, queues = deferring_client("remote")
    c.send(1, commands.Confirm.Select())
    c.feed(
        commands_frames(
            1, commands.Basic.Publish(exchange="", routing_key="remote", mandatory=True)
        )
        + publish_body(1, b"lost")
    )
    queues["remote"].answers[0](True, 0)  # the queue was gone on the root
    out = c.replies()
    kinds = [type(m).__name__ for _, m in out if not isinstance(m, bytes)]
    assert kinds[:2] == ["Return", "ContentHeader"]  # the return precedes its confirm
    assert confirms(out) == [("Ack", 1, True)]


def test_no_return_for_a_message_a_queue_refused() -> None:
    c, queues = deferring_client("remote")
    c.send(1, commands.Confirm.Select())
    c.feed(
        commands_frames(
            1, commands.Basic.Publish(exchange="", routing_key="remote", mandatory=True)
        )
        + publish_body(1, b"full")
    )
    queues["remote"].answers[0](False, 0)
    out = c.replies()
    assert not [m for _, m in out if isinstance(m, commands.Basic.Return)]
    assert confirms(out) == [("Nack", 1, False)]


def test_a_blocked_connection_stops_reading_at_its_next_publish() -> None:
    c = Client()
    c.feed(b"AMQP\x00\x00\x09\x01")
    caps = {"authentication_failure_close": True, "connection.blocked": True}
    c.send(0, start_ok(caps=caps))
    c.send(0, commands.Connection.TuneOk(2047, 131072, 0))
    c.send(0, commands.Connection.Open("/"))
    c.open_channel()
    c.send(1, commands.Queue.Declare(queue="q"))
    c.send(1, commands.Confirm.Select())
    c.conn.set_blocked("cluster not ready: no root")
    assert [type(m).__name__ for _, m in c.replies()] == ["Blocked"]
    out = c.feed(publish_frames(1, "", "q", b"held") + commands_frames(1, commands.Basic.Qos(0, 5)))
    assert c.conn.read_paused
    assert confirms(out) == [] and not [m for _, m in out if isinstance(m, commands.Basic.QosOk)]
    assert c.broker.vhosts["/"].queues["q"].message_count == 0
    c.conn.set_blocked(None)  # unblocked: what waited is read, in order
    out = c.replies()
    assert not c.conn.read_paused
    assert [type(m).__name__ for _, m in out] == ["Unblocked", "QosOk", "Ack"]
    assert c.broker.vhosts["/"].queues["q"].message_count == 1


def commands_frames(channel: int, method: object) -> bytes:
    from pamqp import frame

    return frame.marshal(method, channel)


def publish_body(channel: int, body: bytes) -> bytes:
    from pamqp import body as pbody
    from pamqp import frame
    from pamqp import header as pheader

    return frame.marshal(
        pheader.ContentHeader(0, len(body), commands.Basic.Properties()), channel
    ) + frame.marshal(pbody.ContentBody(body), channel)
