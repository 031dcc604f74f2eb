"""Seed 004's muxers that no other broker has (x-wild-headers, x-selector, x-lossy),
and the topic trie's bound on work, without sockets."""

from __future__ import annotations

import decimal

import pytest
from pamqp import commands

from brokerd.model.errors import PRECONDITION_FAILED, ChannelError
from brokerd.model.message import Message
from brokerd.model.muxers import MUXERS, Binding
from brokerd.model.muxers.lossy import LossyMuxer
from brokerd.model.muxers.topic import TopicMuxer, topic_matches
from brokerd.model.muxers.wildheaders import WildHeadersMuxer
from brokerd.model.muxers.xselector import SelectorMuxer
from brokerd.model.vhost import VirtualHost


class Dest:
    def __init__(self, name: str) -> None:
        self.name = name


SOURCE = Dest("src")


def msg(routing_key: str = "", headers: dict | None = None, **props) -> Message:
    properties = commands.Basic.Properties(headers=headers, **props)
    return Message.build("src", routing_key, b"body", properties)


def bind(muxer, dest, key: str = "", args: dict | None = None) -> Binding:
    binding = Binding(SOURCE, dest, key, args or {})
    muxer.validate(binding.routing_key, binding.arguments)
    muxer.bind(binding)
    return binding


def test_registered():
    for name in ("x-wild-headers", "x-selector", "x-lossy"):
        assert name in MUXERS


# -- x-wild-headers ------------------------------------------------------------------


def test_wild_headers_all_and_any():
    muxer = WildHeadersMuxer({})
    fx, both, anyq = Dest("fx"), Dest("both"), Dest("any")
    bind(muxer, fx, "", {"topic": "FOREX.*"})
    bind(muxer, both, "", {"topic": "FOREX.*", "desk": "L?N", "x-match": "all"})
    bind(muxer, anyq, "", {"topic": "BOND.*", "desk": "NY*", "x-match": "any"})
    assert set(muxer.route(msg(headers={"topic": "FOREX.EUR.USD"}))) == {fx}
    assert set(muxer.route(msg(headers={"topic": "FOREX.EUR", "desk": "LDN"}))) == {fx, both}
    assert set(muxer.route(msg(headers={"topic": "FOREX.EUR", "desk": "NYC"}))) == {fx, anyq}
    assert set(muxer.route(msg(headers={"topic": "BOND.UST"}))) == {anyq}
    assert list(muxer.route(msg(headers={"topic": "FOREXEUR"}))) == []
    assert list(muxer.route(msg(headers={"topic": 12}))) == []  # a pattern needs a string
    assert list(muxer.route(msg())) == []


def test_wild_headers_non_string_values_and_presence():
    muxer = WildHeadersMuxer({})
    num, present = Dest("num"), Dest("present")
    bind(muxer, num, "", {"level": 3})
    bind(muxer, present, "", {"flag": None})
    assert list(muxer.route(msg(headers={"level": 3}))) == [num]
    assert list(muxer.route(msg(headers={"level": "3"}))) == []
    assert list(muxer.route(msg(headers={"flag": "anything"}))) == [present]


def test_wild_headers_refuses_bad_x_match():
    with pytest.raises(ChannelError) as info:
        bind(WildHeadersMuxer({}), Dest("q"), "", {"x-match": "some"})
    assert info.value.reply_code == PRECONDITION_FAILED


def test_wild_headers_unbind():
    muxer = WildHeadersMuxer({})
    q = Dest("q")
    b = bind(muxer, q, "", {"t": "A*"})
    assert list(muxer.route(msg(headers={"t": "AB"}))) == [q]
    muxer.unbind(b)
    assert list(muxer.route(msg(headers={"t": "AB"}))) == []


# -- x-selector ----------------------------------------------------------------------


def test_selector_routes_on_headers_and_properties():
    muxer = SelectorMuxer({})
    urgent, uk, everything = Dest("urgent"), Dest("uk"), Dest("all")
    bind(muxer, urgent, "", {"x-selector": "JMSPriority >= 7 OR urgent = TRUE"})
    bind(muxer, uk, "", {"x-selector": "country IN ('UK', 'IE') AND amount > 100"})
    bind(muxer, everything, "")
    assert set(muxer.route(msg(priority=9))) == {urgent, everything}
    assert set(muxer.route(msg(headers={"country": "UK", "amount": 150}))) == {uk, everything}
    assert set(muxer.route(msg(headers={"country": "UK"}))) == {everything}  # UNKNOWN: no
    assert set(muxer.route(msg(headers={"urgent": True, "country": "IE", "amount": 101.5}))) == {
        urgent,
        uk,
        everything,
    }


def test_selector_one_destination_once():
    muxer = SelectorMuxer({})
    q = Dest("q")
    bind(muxer, q, "", {"x-selector": "a = 1"})
    bind(muxer, q, "", {"x-selector": "a > 0"})
    assert list(muxer.route(msg(headers={"a": 1}))) == [q]


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        ("a = ", "invalid x-selector: syntax error at the end"),
        ("a === 1", "column 4"),
        (5, "expected a string"),
    ],
)
def test_selector_bad_binding_is_406_with_position(selector, fragment):
    with pytest.raises(ChannelError) as info:
        bind(SelectorMuxer({}), Dest("q"), "", {"x-selector": selector})
    assert info.value.reply_code == PRECONDITION_FAILED
    assert fragment in info.value.text


# -- x-lossy -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rate", [0.25, decimal.Decimal("0.25"), "0.25", " 0.25 ", b"0.25", 0, 1, "1e-1"]
)
def test_lossy_accepts_rates(rate):
    assert 0.0 <= LossyMuxer({"x-loss-rate": rate}).rate <= 1.0


@pytest.mark.parametrize("rate", [-0.1, 1.5, "abc", "", True, "nan", float("nan"), [0.5], "\u0661"])
def test_lossy_refuses_bad_rates(rate):
    with pytest.raises(ChannelError) as info:
        LossyMuxer({"x-loss-rate": rate})
    assert info.value.reply_code == PRECONDITION_FAILED
    assert "x-loss-rate" in info.value.text


def test_lossy_needs_a_rate_and_an_integer_seed():
    with pytest.raises(ChannelError, match="needs the argument"):
        LossyMuxer({})
    with pytest.raises(ChannelError, match="x-loss-seed"):
        LossyMuxer({"x-loss-rate": 0.5, "x-loss-seed": "x"})


def _survivors(seed, n: int = 2000, rate: float = 0.3) -> list[int]:
    muxer = LossyMuxer({"x-loss-rate": rate, "x-loss-seed": seed})
    q = Dest("q")
    bind(muxer, q)
    return [i for i in range(n) if list(muxer.route(msg())) == [q]]


def test_lossy_drops_about_the_rate_and_a_seed_reproduces():
    first = _survivors(4)
    assert first == _survivors("4")  # a numeric string seed is the same seed
    assert first != _survivors(5)
    assert 0.65 < len(first) / 2000 < 0.75
    assert _survivors(1, rate=0.0) == list(range(2000))
    assert _survivors(1, rate=1.0) == []


def test_lossy_drops_for_every_binding_at_once():
    muxer = LossyMuxer({"x-loss-rate": 0.5, "x-loss-seed": 7})
    a, b = Dest("a"), Dest("b")
    bind(muxer, a)
    bind(muxer, b)
    outcomes = {tuple(sorted(d.name for d in muxer.route(msg()))) for _ in range(200)}
    assert outcomes == {(), ("a", "b")}


def test_lossy_declare_refused_before_the_exchange_exists():
    vhost = VirtualHost("/")
    with pytest.raises(ChannelError) as info:
        vhost.declare_exchange("lossy", "x-lossy", arguments={"x-loss-rate": 2})
    assert info.value.reply_code == PRECONDITION_FAILED
    assert "lossy" not in vhost.exchanges


def test_seed_004_chain_destination_property_lossy_queue():
    """A queue behind LOSSY behind PROPERTY behind DESTINATION (seed 004's drawing)."""
    vhost = VirtualHost("/")
    dest = vhost.declare_exchange("DESTINATION", "direct")[0]
    prop = vhost.declare_exchange("PROPERTY", "headers")[0]
    lossy = vhost.declare_exchange(
        "LOSSY", "x-lossy", arguments={"x-loss-rate": "0.5", "x-loss-seed": 4}
    )[0]
    queue = vhost.declare_queue("q", connection_id=1)[0]
    for key in ("X", "Y", "Z"):
        vhost.bind(dest, prop, key)
    vhost.bind(prop, lossy, "", {"ABC": "yes"})
    vhost.bind(lossy, queue, "")
    reached = [vhost.route(dest, msg(k, {"ABC": "yes"})) for k in "XYZXYZXYZX" * 20]
    assert {r for r in reached if r} == {(queue,)}
    assert 60 < sum(1 for r in reached if r) < 140
    assert vhost.route(dest, msg("W", {"ABC": "yes"})) == ()  # DESTINATION filters
    assert all(vhost.route(dest, msg("X", {"ABC": "no"})) == () for _ in range(20))


# -- topic: a bound on work ----------------------------------------------------------


def test_hostile_topic_pattern_is_bounded_work():
    """'#.#.#.#.#.#.#.#' and a 100-word key: a backtracking matcher explores ~C(107,7)
    splits; the trie visits at most (words + 1) x (trie nodes)."""
    muxer = TopicMuxer({})
    q = Dest("q")
    bind(muxer, q, "#.#.#.#.#.#.#.#")
    bind(muxer, Dest("r"), "#.a.#.a.#.a.#.a.#.b")  # runs of '#' that do not fold
    key = ".".join(["a"] * 100)
    assert list(muxer.match(key)) == [q]
    trie_nodes = 1 + 1 + 10  # root, the folded '#', and the second pattern's words
    assert muxer.visits <= (100 + 1) * trie_nodes
    assert topic_matches("#.#.#.#.#.#.#.#", key)
    assert not topic_matches("#.a.#.a.#.a.#.a.#.b", key)


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        ("#", "", True),
        ("#.#", "", True),
        ("*", "", False),
        ("a.#", "a", True),
        ("#.a", "a", True),
        ("a.*.#", "a", False),
        ("a.*.#", "a.b", True),
        ("*.*", "a.", True),  # empty words count
        ("a..b", "a..b", True),
        ("#.*.#", "x", True),
        ("*", "*", True),  # a literal '*' word
        ("b", "*", False),
        ("#", "#.#", True),
        ("a.#.b", "a.#", False),
    ],
)
def test_topic_semantics_match_rabbitmq(pattern, key, expected):
    assert topic_matches(pattern, key) is expected
    muxer = TopicMuxer({})
    q = Dest("q")
    bind(muxer, q, pattern)
    assert (list(muxer.route(msg(key))) == [q]) is expected


def test_folded_hash_patterns_unbind_separately():
    muxer = TopicMuxer({})
    q = Dest("q")
    b1 = bind(muxer, q, "a.#")
    b2 = bind(muxer, q, "a.#.#")
    muxer.unbind(b1)
    assert list(muxer.route(msg("a.b.c"))) == [q]
    muxer.unbind(b2)
    assert list(muxer.route(msg("a.b.c"))) == []
    assert not muxer.root.children
