"""A shovel's transfer over any interleaving of deliveries, confirms, nacks and
lost connections: with ``on-confirm`` nothing is lost, a source message is
acknowledged only once the destination holds it, and every duplicate comes from
a delivery the source flagged redelivered, and carries ``x-redelivered`` to the
destination's consumers."""

from __future__ import annotations

from collections import deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from pamqp import commands

from brokerd.bridges.definitions import parse_shovel
from brokerd.bridges.transfer import (
    REDELIVERED,
    SHOVELLED,
    Ack,
    Cancel,
    Delivery,
    Nack,
    Publish,
    Transfer,
)
from brokerd.wire import codec
from tests.support.examples import examples

MESSAGES = 12


def _shovel(**extra: object) -> Transfer:
    definition = parse_shovel(
        "s",
        {
            "src-uri": "amqp://",
            "src-queue": "in",
            "dest-uri": "amqp://u:pw@remote",
            "dest-queue": "out",
            "src-prefetch-count": 3,
            **extra,
        },
    )
    return Transfer(definition, node="rookery@n1", clock=lambda: 1700000000.0)


class OnConfirm(RuleBasedStateMachine):
    """The source queue, its unacknowledged deliveries, and the destination, modelled
    as the brokers keep them; the transfer under test decides what moves."""

    def __init__(self) -> None:
        super().__init__()
        self.transfer = _shovel()
        self.ready: deque[tuple[int, bool]] = deque((i, False) for i in range(MESSAGES))
        self.unacked: dict[int, tuple[int, bool]] = {}
        self.next_tag = 1
        self.consuming = True
        #: destination: publishes not confirmed yet (seq -> id, redelivered), and held copies
        self.pending: dict[int, tuple[int, bool]] = {}
        self.held: list[tuple[int, bool]] = []
        self.last_seq = 0

    def _apply(self, actions: list[object], delivery: tuple[int, bool] | None = None) -> None:
        for action in actions:
            if isinstance(action, Publish):
                assert action.seq == self.last_seq + 1, "publish sequence numbers go one by one"
                self.last_seq = action.seq
                assert delivery is not None and int(action.body) == delivery[0]
                assert (action.exchange, action.routing_key) == ("", "out")
                # what the destination's consumer sees: the x-redelivered header
                headers = codec.decode_properties(action.properties).headers or {}
                assert headers.get(REDELIVERED, False) == delivery[1]
                self.pending[action.seq] = (delivery[0], bool(headers.get(REDELIVERED)))
            elif isinstance(action, Ack):
                tags = (
                    [t for t in self.unacked if t <= action.tag]
                    if action.multiple
                    else [action.tag]
                )
                assert tags and all(t in self.unacked for t in tags), "ack of an unknown tag"
                for tag in tags:
                    ident, _ = self.unacked.pop(tag)
                    assert any(h[0] == ident for h in self.held), (
                        f"message {ident} acknowledged at the source before the destination held it"
                    )
            elif isinstance(action, Nack):
                ident, _ = self.unacked.pop(action.tag)
                self.ready.append((ident, True))
            elif isinstance(action, Cancel):
                self.consuming = False

    @precondition(lambda self: self.consuming and self.ready)
    @rule()
    def deliver(self) -> None:
        if len(self.unacked) >= self.transfer.prefetch:
            return
        ident, redelivered = self.ready.popleft()
        tag, self.next_tag = self.next_tag, self.next_tag + 1
        self.unacked[tag] = (ident, redelivered)
        delivery = Delivery(tag, "", "in", str(ident).encode(), redelivered=redelivered)
        self._apply(self.transfer.delivered(delivery), (ident, redelivered))

    @precondition(lambda self: self.pending)
    @rule(data=st.data(), multiple=st.booleans(), ok=st.booleans())
    def confirm(self, data: st.DataObject, multiple: bool, ok: bool) -> None:
        seq = data.draw(st.sampled_from(sorted(self.pending)))
        settled = [s for s in self.pending if s <= seq] if multiple else [seq]
        for s in settled:
            copy = self.pending.pop(s)
            if ok:
                self.held.append(copy)
        self._apply(self.transfer.confirmed(seq, multiple, ok))

    @rule(data=st.data())
    def lose_the_connection(self, data: st.DataObject) -> None:
        # copies in flight may or may not have reached the destination's queue
        for copy in self.pending.values():
            if data.draw(st.booleans()):
                self.held.append(copy)
        self.pending.clear()
        for _tag, (ident, _r) in sorted(self.unacked.items()):
            self.ready.appendleft((ident, True))  # requeued, flagged, as a broker does
        self.unacked.clear()
        self.next_tag, self.last_seq = 1, 0
        self.transfer.reset()
        self.consuming = True
        self._apply(self.transfer.start())

    @invariant()
    def nothing_is_lost(self) -> None:
        where = (
            {i for i, _ in self.ready}
            | {i for i, _ in self.unacked.values()}
            | {i for i, _ in self.held}
        )
        assert where == set(range(MESSAGES)), f"lost: {set(range(MESSAGES)) - where}"

    @invariant()
    def duplicates_are_flagged(self) -> None:
        seen: set[int] = set()
        for ident, redelivered in self.held:
            if ident in seen:
                assert redelivered, f"message {ident} held twice, the second copy not flagged"
            seen.add(ident)

    def teardown(self) -> None:
        # drain: deliver and confirm everything left; the destination then holds it all
        self.lose_the_connection_quietly()
        for _ in range(4 * MESSAGES):
            if not self.ready:
                break
            self.deliver()
            if self.pending:
                seq = max(self.pending)
                for s in sorted(self.pending):
                    self.held.append(self.pending.pop(s))
                self._apply(self.transfer.confirmed(seq, True, True))
        assert {i for i, _ in self.held} == set(range(MESSAGES))
        assert not self.unacked and not self.transfer.outstanding

    def lose_the_connection_quietly(self) -> None:
        self.pending.clear()
        for _tag, (ident, _r) in sorted(self.unacked.items()):
            self.ready.appendleft((ident, True))
        self.unacked.clear()
        self.next_tag, self.last_seq = 1, 0
        self.transfer.reset()
        self.consuming = True


OnConfirm.TestCase.settings = settings(max_examples=examples(200), stateful_step_count=40)
test_on_confirm_loses_nothing_and_flags_every_duplicate = OnConfirm.TestCase


def test_a_run_of_confirms_with_nothing_earlier_outstanding_is_one_multiple_ack() -> None:
    transfer = _shovel(**{"src-prefetch-count": 10})
    for tag in range(1, 5):
        transfer.delivered(Delivery(tag, "", "in", b"m"))
    assert transfer.confirmed(3, True, True) == [Ack(3, multiple=True)]
    assert transfer.confirmed(4, False, True) == [Ack(4)]
    # out of order: seq 2 confirmed while 1 is outstanding: acked alone
    transfer = _shovel(**{"src-prefetch-count": 10})
    for tag in range(1, 4):
        transfer.delivered(Delivery(tag, "", "in", b"m"))
    assert transfer.confirmed(2, False, True) == [Ack(2)]
    # then 1 and 3 together: nothing earlier is left, one multiple ack (2 is done already)
    assert transfer.confirmed(3, True, True) == [Ack(3, multiple=True)]
    transfer = _shovel(**{"src-prefetch-count": 10})
    for tag in range(1, 4):
        transfer.delivered(Delivery(tag, "", "in", b"m"))
    assert transfer.confirmed(3, False, True) == [Ack(3)]  # 1 and 2 still outstanding
    assert transfer.confirmed(9, False, True) == []  # unknown: ignored


def test_on_publish_acks_at_once_and_no_ack_never() -> None:
    on_publish = _shovel(**{"ack-mode": "on-publish"})
    actions = on_publish.delivered(Delivery(7, "", "in", b"m"))
    assert isinstance(actions[0], Publish) and actions[1:] == [Ack(7)]
    assert on_publish.confirmed(1, False, True) == []
    no_ack = _shovel(**{"ack-mode": "no-ack"})
    assert [type(a) for a in no_ack.delivered(Delivery(1, "", "in", b"m"))] == [Publish]


def test_delete_after_a_count_takes_that_many_then_cancels_and_is_done_when_settled() -> None:
    transfer = _shovel(**{"src-delete-after": 2, "src-prefetch-count": 10})
    assert transfer.prefetch == 2
    transfer.delivered(Delivery(1, "", "in", b"a"))
    actions = transfer.delivered(Delivery(2, "", "in", b"b"))
    assert Cancel() in actions and not transfer.done
    assert transfer.delivered(Delivery(3, "", "in", b"c")) == [Nack(3, requeue=True)]
    transfer.confirmed(2, True, True)
    assert transfer.done and transfer.acknowledged == 2
    # a nack gives the count back: the message is taken again later
    again = _shovel(**{"src-delete-after": 1})
    again.delivered(Delivery(1, "", "in", b"a"))
    assert again.confirmed(1, False, False) == [Nack(1, requeue=True)]
    assert not again.finished_taking


def test_queue_length_takes_the_depth_seen_at_the_first_start() -> None:
    transfer = _shovel(**{"src-delete-after": "queue-length"})
    assert transfer.start(queue_length=0) == [Cancel()] and transfer.done
    deep = _shovel(**{"src-delete-after": "queue-length"})
    assert deep.start(queue_length=5) == [] and deep.remaining == 5
    deep.reset()
    deep.start(queue_length=50)  # a reconnect does not read the depth again
    assert deep.remaining == 5


def test_properties_pass_through_as_they_came_unless_the_definition_changes_them() -> None:
    raw = codec.encode_properties(
        commands.Basic.Properties(content_type="text/plain", headers={"k": "v"}, priority=3)
    )
    (publish,) = _shovel().delivered(Delivery(1, "x", "k", b"m", raw))
    assert isinstance(publish, Publish) and publish.properties is raw  # byte for byte
    (bare,) = _shovel().delivered(Delivery(1, "x", "k", b"m"))
    assert isinstance(bare, Publish) and bare.properties == b"\x00\x00"
    changed = _shovel(**{"dest-publish-properties": {"delivery_mode": 2, "app_id": "bridge"}})
    (publish,) = changed.delivered(Delivery(1, "x", "k", b"m", raw))
    assert isinstance(publish, Publish)
    props = codec.decode_properties(publish.properties)
    assert (props.delivery_mode, props.app_id, props.content_type) == (2, "bridge", "text/plain")
    assert props.headers == {"k": "v"} and props.message_id is None


def test_forward_headers_say_where_from_and_never_the_password() -> None:
    transfer = _shovel(**{"dest-add-forward-headers": True, "dest-add-timestamp-header": True})
    earlier = [{"shovel-name": "upstream-one"}]
    raw = codec.encode_properties(
        commands.Basic.Properties(headers={SHOVELLED: earlier, "app": 1}, delivery_mode=2)
    )
    (publish,) = transfer.delivered(Delivery(1, "x", "k", b"m", raw))
    assert isinstance(publish, Publish)
    props = codec.decode_properties(publish.properties)
    headers = props.headers
    assert headers["app"] == 1 and props.delivery_mode == 2
    assert headers[SHOVELLED][1:] == earlier  # the newest first, the trail kept
    entry = headers[SHOVELLED][0]
    assert entry["shovel-name"] == "s" and entry["shovelled-by"] == "rookery@n1"
    assert entry["src-queue"] == "in" and entry["dest-queue"] == "out"
    assert entry["dest-uri"] == "amqp://u:***@remote" and "pw" not in repr(entry)
    assert headers["x-shovelled-timestamp"] == 1700000000


def test_an_exchange_destination_keeps_or_replaces_the_routing_key() -> None:
    keep = Transfer(
        parse_shovel("s", {"src-uri": "amqp://", "src-queue": "q", "dest-uri": "amqp://"}), "n"
    )
    (publish,) = keep.delivered(Delivery(1, "orders", "eu.new", b"m"))
    assert isinstance(publish, Publish) and (publish.exchange, publish.routing_key) == (
        "orders",
        "eu.new",
    )
    swap = Transfer(
        parse_shovel(
            "s",
            {
                "src-uri": "amqp://",
                "src-queue": "q",
                "dest-uri": "amqp://",
                "dest-exchange": "archive",
                "dest-exchange-key": "all",
            },
        ),
        "n",
    )
    (publish,) = swap.delivered(Delivery(1, "orders", "eu.new", b"m"))
    assert isinstance(publish, Publish) and (publish.exchange, publish.routing_key) == (
        "archive",
        "all",
    )
