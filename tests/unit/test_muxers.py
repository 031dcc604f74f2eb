"""Muxers (exchange types) and the exchange-to-exchange routing walk, without sockets."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from brokerd.model.errors import PRECONDITION_FAILED, AMQPError, ChannelError
from brokerd.model.exchange import Exchange
from brokerd.model.message import Message
from brokerd.model.muxers import MUXERS, Binding, lookup
from brokerd.model.muxers.direct import DirectMuxer
from brokerd.model.muxers.fanout import FanoutMuxer
from brokerd.model.muxers.headers import HeadersMuxer, header_match
from brokerd.model.muxers.topic import TopicMuxer, topic_matches
from brokerd.model.queue import Queue
from brokerd.model.vhost import VirtualHost
from tests.support.examples import examples


class Dest:
    """A stand-in destination: muxers only need it hashable and named."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Dest({self.name})"


SOURCE = Dest("src")


def msg(routing_key: str = "", headers: dict | None = None) -> Message:
    props = commands.Basic.Properties(headers=headers) if headers is not None else None
    return Message.build("src", routing_key, b"body", props)


def bind(muxer, dest, key: str = "", args: dict | None = None) -> Binding:
    binding = Binding(SOURCE, dest, key, args or {})
    muxer.validate(binding.routing_key, binding.arguments)
    muxer.bind(binding)
    return binding


def routed(muxer, message: Message) -> list:
    result = list(muxer.route(message))
    assert len(result) == len(set(result)), f"duplicate destinations {result}"
    return result


def test_registry_has_the_standard_types():
    for name in ("direct", "fanout", "topic", "headers"):
        assert name in MUXERS
        assert lookup(name) is MUXERS[name]
    with pytest.raises(AMQPError) as info:
        lookup("x-no-such-type")
    assert info.value.connection_level and info.value.reply_code == 503


# -- topic -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a.c", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#", "", True),
        ("#", "a.b", True),
        ("#.c", "c", True),
        ("#.c", "a.b.c", True),
        ("#.c", "a.b.c.d", False),
        ("a.#.c", "a.c", True),
        ("a.#.c", "a.x.y.c", True),
        ("*.#", "a", True),
        ("*.#", "", False),  # as RabbitMQ: the empty key has no words
        ("*", "", False),
        ("", "", True),
        ("", "a", False),
        ("#.#", "a.b", True),
        ("*", "a.b", False),
        ("a.*", "a.", True),  # an empty word is still a word
    ],
)
def test_topic_reference_examples(pattern, key, expected):
    assert topic_matches(pattern, key) is expected
    muxer = TopicMuxer({})
    dest = Dest("q")
    bind(muxer, dest, pattern)
    assert (routed(muxer, msg(key)) == [dest]) is expected


WORDS = st.sampled_from(["a", "b", "c", "*", "#", ""])
KEY_WORDS = st.sampled_from(["a", "b", "c", ""])
patterns = st.lists(WORDS, min_size=1, max_size=5).map(".".join)
keys = st.lists(KEY_WORDS, min_size=1, max_size=6).map(".".join)


@settings(max_examples=examples(300))
@given(
    bindings=st.lists(st.tuples(patterns, st.integers(0, 4)), max_size=12),
    routing_keys=st.lists(keys, min_size=1, max_size=8),
    unbind_mask=st.lists(st.booleans(), max_size=12),
)
def test_topic_trie_agrees_with_reference(bindings, routing_keys, unbind_mask):
    dests = [Dest(f"q{i}") for i in range(5)]
    muxer = TopicMuxer({})
    live: list[tuple[str, Dest]] = []
    made = []
    for pattern, d in bindings:
        made.append(bind(muxer, dests[d], pattern))
        live.append((pattern, dests[d]))

    def check() -> None:
        for key in routing_keys:
            expected = {d for p, d in live if topic_matches(p, key)}
            got = routed(muxer, msg(key))
            assert set(got) == expected, (key, live)
            # twice: the second answer comes from the cache
            assert set(routed(muxer, msg(key))) == expected

    check()
    # unbinding (each binding counted separately) keeps trie, counts and cache right
    for binding, drop in zip(made, unbind_mask, strict=False):
        if drop:
            muxer.unbind(binding)
            live.remove((binding.routing_key, binding.destination))
    check()
    for binding in made[len(unbind_mask) :]:
        muxer.unbind(binding)
        live.remove((binding.routing_key, binding.destination))
    for binding, drop in zip(made, unbind_mask, strict=False):
        if not drop:
            muxer.unbind(binding)
            live.remove((binding.routing_key, binding.destination))
    assert not live
    check()
    assert not muxer.root.children, "empty branches must be pruned"


def test_topic_overlapping_patterns_deliver_once():
    muxer = TopicMuxer({})
    q = Dest("q")
    for pattern in ("a.*", "#", "a.#", "*.b", "a.b"):
        bind(muxer, q, pattern)
    assert routed(muxer, msg("a.b")) == [q]


def test_topic_unbind_unknown_is_a_noop():
    muxer = TopicMuxer({})
    q = Dest("q")
    b = bind(muxer, q, "a.b")
    muxer.unbind(Binding(SOURCE, q, "a.c", {}))
    muxer.unbind(Binding(SOURCE, Dest("other"), "a.b", {}))
    assert routed(muxer, msg("a.b")) == [q]
    muxer.unbind(b)
    assert routed(muxer, msg("a.b")) == []


# -- headers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "headers", "expected"),
    [
        # all (the default)
        ({"a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
        ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
        ({"x-match": "all", "a": 1}, {"a": 2}, False),
        ({"x-match": "all"}, {}, True),
        # any
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 1}, True),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 2, "b": 1}, False),
        ({"x-match": "any"}, {"a": 1}, False),
        # x- arguments are ignored by all/any ...
        ({"x-match": "all", "x-tag": "t", "a": 1}, {"a": 1}, True),
        ({"x-match": "any", "x-tag": "t"}, {"x-tag": "t"}, False),
        # ... and compared by all-with-x / any-with-x
        ({"x-match": "all-with-x", "x-tag": "t", "a": 1}, {"a": 1}, False),
        ({"x-match": "all-with-x", "x-tag": "t", "a": 1}, {"a": 1, "x-tag": "t"}, True),
        ({"x-match": "any-with-x", "x-tag": "t", "a": 1}, {"x-tag": "t"}, True),
        ({"x-match": "any-with-x", "x-tag": "t", "a": 1}, {"x-tag": "u", "a": 2}, False),
        # a void binding value matches on presence alone
        ({"x-match": "all", "a": None}, {"a": "anything"}, True),
        ({"x-match": "all", "a": None}, {"b": 1}, False),
        ({"x-match": "any", "a": None, "b": 5}, {"a": 0}, True),
        # booleans are not integers
        ({"a": True}, {"a": 1}, False),
        ({"a": 1}, {"a": True}, False),
        ({"a": True}, {"a": True}, True),
        # nested tables compare by value
        ({"a": {"k": [1, 2]}}, {"a": {"k": [1, 2]}}, True),
    ],
)
def test_header_match(args, headers, expected):
    assert header_match(args, headers) is expected
    muxer = HeadersMuxer({})
    q = Dest("q")
    bind(muxer, q, "ignored-key", args)
    assert (routed(muxer, msg("whatever", headers)) == [q]) is expected


def test_headers_message_without_headers():
    muxer = HeadersMuxer({})
    q, r = Dest("q"), Dest("r")
    bind(muxer, q, "", {"x-match": "all"})
    bind(muxer, r, "", {"x-match": "any", "a": 1})
    assert routed(muxer, msg("k")) == [q]


def test_headers_bad_x_match_is_refused_with_406():
    muxer = HeadersMuxer({})
    with pytest.raises(ChannelError) as info:
        muxer.validate("", {"x-match": "some"})
    assert info.value.reply_code == PRECONDITION_FAILED
    assert "x-match" in info.value.text


def test_headers_several_bindings_to_one_queue_deliver_once():
    muxer = HeadersMuxer({})
    q = Dest("q")
    b1 = bind(muxer, q, "", {"x-match": "any", "a": 1})
    bind(muxer, q, "", {"x-match": "any", "b": 2})
    assert routed(muxer, msg("", {"a": 1, "b": 2})) == [q]
    muxer.unbind(b1)
    assert routed(muxer, msg("", {"a": 1})) == []
    assert routed(muxer, msg("", {"b": 2})) == [q]


# -- direct and fanout ------------------------------------------------------------------


def test_direct_bind_unbind_counting():
    muxer = DirectMuxer({})
    q, r = Dest("q"), Dest("r")
    b1 = bind(muxer, q, "k", {"n": 1})
    b2 = bind(muxer, q, "k", {"n": 2})  # same queue and key, other arguments: a second binding
    bind(muxer, r, "k")
    bind(muxer, r, "other")
    assert Counter(routed(muxer, msg("k"))) == Counter({q: 1, r: 1})
    muxer.unbind(b1)
    assert set(routed(muxer, msg("k"))) == {q, r}
    muxer.unbind(b2)
    assert routed(muxer, msg("k")) == [r]
    assert routed(muxer, msg("other")) == [r]
    assert routed(muxer, msg("nothing")) == []
    muxer.unbind(Binding(SOURCE, q, "never-bound", {}))


def test_fanout_bind_unbind_counting():
    muxer = FanoutMuxer({})
    q, r = Dest("q"), Dest("r")
    b1 = bind(muxer, q, "a")
    b2 = bind(muxer, q, "b")
    bind(muxer, r, "")
    assert set(routed(muxer, msg("anything"))) == {q, r}
    muxer.unbind(b1)
    assert set(routed(muxer, msg(""))) == {q, r}
    muxer.unbind(b2)
    assert routed(muxer, msg("")) == [r]
    muxer.unbind(Binding(SOURCE, Dest("stranger"), "", {}))
    assert routed(muxer, msg("")) == [r]


@pytest.mark.parametrize("type_name", ["direct", "fanout", "topic", "headers"])
def test_exchange_bindings_are_idempotent(type_name):
    """The exchange keeps muxers from counting one binding twice (bind or unbind)."""
    ex = Exchange("x", type_name)
    q = Queue("q", "/")
    b1 = Binding(ex, q, "k", {"n": 1})
    b2 = Binding(ex, q, "k", {"n": 2})
    assert ex.add_binding(b1)
    assert ex.add_binding(b2)
    assert not ex.add_binding(Binding(ex, q, "k", {"n": 1}))  # same identity
    assert list(ex.muxer.route(msg("k", {"n": 1}))) == [q]
    ex.remove_binding(b1)
    ex.remove_binding(b1)  # unbinding twice must not take b2's count
    ex.remove_binding(Binding(ex, q, "k", {"n": 1}))
    assert list(ex.muxer.route(msg("k", {"n": 2}))) == [q]
    ex.remove_binding(b2)
    assert list(ex.muxer.route(msg("k", {"n": 2}))) == []
    assert ex.exchange_destinations == 0


def test_exchange_refuses_invalid_binding_before_storing_it():
    ex = Exchange("h", "headers")
    q = Queue("q", "/")
    with pytest.raises(ChannelError):
        ex.add_binding(Binding(ex, q, "", {"x-match": "nope"}))
    assert not ex.bindings


# -- exchange-to-exchange routing through VirtualHost.route --------------------------


@pytest.fixture
def vhost() -> VirtualHost:
    return VirtualHost("/")


def declare_queue(vhost: VirtualHost, name: str) -> Queue:
    return vhost.declare_queue(name, connection_id=1)[0]


def test_e2e_cycle_terminates_and_delivers_once(vhost):
    x1 = vhost.declare_exchange("x1", "direct")[0]
    x2 = vhost.declare_exchange("x2", "fanout")[0]
    x3 = vhost.declare_exchange("x3", "topic")[0]
    q = declare_queue(vhost, "q")
    r = declare_queue(vhost, "r")
    vhost.bind(x1, x2, "k")
    vhost.bind(x2, x3, "")
    vhost.bind(x3, x1, "#")  # cycle x1 -> x2 -> x3 -> x1
    vhost.bind(x3, x3, "#")  # and a self loop
    vhost.bind(x2, q, "")
    vhost.bind(x3, q, "k")
    vhost.bind(x1, q, "k")
    vhost.bind(x3, r, "*")
    result = vhost.route(x1, msg("k"))
    assert Counter(result) == Counter({q: 1, r: 1})
    assert vhost.route(x1, msg("other")) == ()
    # from the middle of the cycle
    assert Counter(vhost.route(x3, msg("k"))) == Counter({q: 1, r: 1})


def test_e2e_diamond_delivers_once(vhost):
    top = vhost.declare_exchange("top", "fanout")[0]
    left = vhost.declare_exchange("left", "fanout")[0]
    right = vhost.declare_exchange("right", "direct")[0]
    q = declare_queue(vhost, "q")
    vhost.bind(top, left, "")
    vhost.bind(top, right, "")
    vhost.bind(left, q, "")
    vhost.bind(right, q, "rk")
    vhost.bind(top, q, "")
    assert vhost.route(top, msg("rk")) == (q,)
    assert vhost.route(top, msg("no")) == (q,)


def test_e2e_unbind_and_delete_stop_routing(vhost):
    a = vhost.declare_exchange("a", "fanout")[0]
    b = vhost.declare_exchange("b", "fanout")[0]
    q = declare_queue(vhost, "q")
    vhost.bind(a, b, "")
    vhost.bind(b, q, "")
    assert vhost.route(a, msg()) == (q,)
    vhost.unbind(a, b, "")
    assert vhost.route(a, msg()) == ()
    assert a.exchange_destinations == 0
    vhost.bind(a, b, "")
    vhost.delete_exchange("b")
    assert vhost.route(a, msg()) == ()
    assert not a.bindings


GRAPH_EXCHANGES = [
    ("e0", "fanout"),
    ("e1", "direct"),
    ("e2", "topic"),
    ("e3", "fanout"),
    ("e4", "direct"),
]


@settings(max_examples=examples(200))
@given(
    edges=st.lists(
        st.tuples(st.integers(0, 4), st.integers(0, 8), st.sampled_from(["k", "j", "#", "*"])),
        max_size=25,
    ),
    start=st.integers(0, 4),
    key=st.sampled_from(["k", "j", "z"]),
)
def test_e2e_routing_equals_reachability(edges, start, key):
    """Random exchange graphs (cycles included): each reachable queue exactly once."""
    vhost = VirtualHost("/")
    exchanges = [vhost.declare_exchange(n, t)[0] for n, t in GRAPH_EXCHANGES]
    queues = [declare_queue(vhost, f"q{i}") for i in range(4)]
    nodes: list = [*exchanges, *queues]
    for src, dst, binding_key in edges:
        vhost.bind(exchanges[src], nodes[dst], binding_key)

    def follows(exchange: Exchange, binding: Binding) -> bool:
        if exchange.type_name == "fanout":
            return True
        if exchange.type_name == "direct":
            return binding.routing_key == key
        return topic_matches(binding.routing_key, key)

    expected: set[Queue] = set()
    seen = {exchanges[start]}
    todo = [exchanges[start]]
    while todo:
        ex = todo.pop()
        for binding in ex.bindings.values():
            if not follows(ex, binding):
                continue
            dest = binding.destination
            if isinstance(dest, Queue):
                expected.add(dest)
            elif dest not in seen:
                seen.add(dest)
                todo.append(dest)
    result = vhost.route(exchanges[start], msg(key))
    assert len(result) == len(set(result))
    assert set(result) == expected


def test_binding_identity_takes_any_decoded_argument_value():
    """Byte arrays, nested tables and arrays are legal binding arguments (the fuzz found a 541)."""
    q = Dest("q")
    args = {"x": bytearray(b"\x00\xff"), "t": {"a": [bytearray(b"1"), {"b": 2}]}, "n": None}
    same = {"n": None, "t": {"a": [bytearray(b"1"), {"b": 2}]}, "x": bytearray(b"\x00\xff")}
    assert Binding(SOURCE, q, "k", args).key == Binding(SOURCE, q, "k", same).key
    assert hash(Binding(SOURCE, q, "k", args).key)
    other = dict(args, x=bytearray(b"\x00"))
    assert Binding(SOURCE, q, "k", args).key != Binding(SOURCE, q, "k", other).key
    ex = Exchange("h", "headers")
    assert ex.add_binding(Binding(ex, q, "", args))
    assert not ex.add_binding(Binding(ex, q, "", same)), "an identical binding is not added twice"
