"""x-selector's JMS/SQL-92 selectors and the backtracking-free glob, without sockets."""

from __future__ import annotations

import datetime
import decimal
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from brokerd.model.muxers.glob import like_pattern, wild_pattern
from brokerd.model.muxers.selector import (
    MAX_DEPTH,
    MAX_SELECTOR_BYTES,
    Fields,
    SelectorError,
    compile_selector,
)
from tests.support.examples import examples


def run(selector: str, headers: dict | None = None, **props) -> object:
    return compile_selector(selector)(Fields(headers or {}, commands.Basic.Properties(**props)))


@pytest.mark.parametrize(
    ("selector", "headers", "expected"),
    [
        ("a = 1", {"a": 1}, True),
        ("a = 1", {"a": 2}, False),
        ("a = 1", {}, None),  # NULL compares UNKNOWN
        ("a <> 'x'", {"a": "y"}, True),
        ("a > 2.5", {"a": 3}, True),
        ("a >= 3 AND a <= 3", {"a": 3}, True),
        ("a = '1'", {"a": 1}, None),  # mixed types: UNKNOWN, not an error
        ("a = TRUE", {"a": True}, True),
        ("a = 1", {"a": True}, None),  # a boolean is not the number 1
        ("a + b * 2 = 7", {"a": 1, "b": 3}, True),
        ("(a + b) * 2 = 8", {"a": 1, "b": 3}, True),
        ("-a = -5", {"a": 5}, True),
        ("a / 2 = 3", {"a": 7}, True),  # integer division truncates, as in Java
        ("a / 2.0 = 3.5", {"a": 7}, True),
        ("a / 0 = 1", {"a": 7}, None),
        ("a BETWEEN 1 AND 5", {"a": 5}, True),
        ("a NOT BETWEEN 1 AND 5", {"a": 6}, True),
        ("a BETWEEN 1 AND 5", {}, None),
        ("c IN ('UK', 'US')", {"c": "US"}, True),
        ("c NOT IN ('UK', 'US')", {"c": "FR"}, True),
        ("c IN ('UK')", {}, None),
        ("n IN (1, 2.5)", {"n": 2.5}, True),
        ("s LIKE 'FX%'", {"s": "FX.EUR"}, True),
        ("s LIKE 'F_'", {"s": "FXY"}, False),
        ("s NOT LIKE '%USD'", {"s": "EURGBP"}, True),
        ("s LIKE 'a!%b' ESCAPE '!'", {"s": "a%b"}, True),
        ("s LIKE 'a!%b' ESCAPE '!'", {"s": "axb"}, False),
        ("s LIKE 'it''s%'", {"s": "it's here"}, True),
        ("s IS NULL", {}, True),
        ("s IS NOT NULL", {"s": ""}, True),
        ("flag", {"flag": True}, True),
        ("NOT flag", {"flag": False}, True),
        ("flag", {"flag": "yes"}, None),
        ('"x-rate" > 1', {"x-rate": 2}, True),
        ("d = 1.5", {"d": decimal.Decimal("1.5")}, True),
        ("b = 'hi'", {"b": b"hi"}, True),
        ("t IS NULL", {"t": datetime.datetime(2024, 1, 1)}, True),  # not comparable: NULL
        ("and_more = 1 OR ORDER = 2", {"and_more": 0, "ORDER": 2}, True),  # keywords as prefixes
        ("a = 1 and b = 2 or not c = 3", {"a": 1, "b": 2}, True),  # case-insensitive keywords
    ],
)
def test_evaluation(selector, headers, expected):
    assert run(selector, headers) is expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        # three-valued logic: UNKNOWN is neither TRUE nor FALSE
        ("u = 1 AND FALSE", False),
        ("u = 1 AND TRUE", None),
        ("u = 1 OR TRUE", True),
        ("u = 1 OR FALSE", None),
        ("NOT (u = 1)", None),
        ("NOT (u = 1) OR k = 1", True),
    ],
)
def test_three_valued_logic(selector, expected):
    assert run(selector, {"k": 1}) is expected


def test_jms_names_read_amqp_properties():
    ts = datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)
    props = dict(
        priority=7,
        correlation_id="c-1",
        message_id="m-1",
        message_type="order",
        reply_to="r",
        delivery_mode=2,
        timestamp=ts,
    )
    selector = (
        "JMSPriority > 5 AND JMSCorrelationID = 'c-1' AND JMSMessageID = 'm-1' "
        "AND JMSType = 'order' AND JMSReplyTo = 'r' AND JMSDeliveryMode = 'PERSISTENT' "
        f"AND JMSTimestamp = {int(ts.timestamp() * 1000)}"
    )
    assert run(selector, **props) is True
    assert run("JMSDeliveryMode = 'NON_PERSISTENT'", delivery_mode=1) is True
    assert run("JMSPriority IS NULL") is True
    # a header called like a JMS name does not shadow the property
    assert run("JMSPriority = 1", {"JMSPriority": 9}, priority=1) is True


@pytest.mark.parametrize(
    ("selector", "reason"),
    [
        ("a = ", "at the end"),
        ("a == 1", "column 4: unexpected '='"),
        ("a ^ 2", "column 3: unexpected character '^'"),
        ("a LIKE 5", "column 8"),
        ("a IN (b)", "column 7"),
        ("1 + 'x' > 2", "arithmetic needs numbers"),
        ("'abc'", "not a condition"),
        ("a + 1", "not a condition"),
        ("'a' > 'b'", "only = and <>"),
        ("1 = 'x'", "cannot compare a numeric with a string"),
        ("a LIKE 'x' ESCAPE 'ab'", "one character"),
        ("a LIKE 'x!' ESCAPE '!'", "ends with its escape"),
        ("   ", "empty"),
        ("NOT " * (MAX_DEPTH + 5) + "a", "levels deep"),
        ("-" * (MAX_DEPTH + 5) + "a = 1", "levels deep"),
        ("a = 1 OR " * 500 + "a = 1", "bytes, longer than"),
    ],
)
def test_bad_selectors_say_where_and_why(selector, reason):
    with pytest.raises(SelectorError) as info:
        compile_selector(selector)
    assert reason in str(info.value)


def test_selector_size_bound_is_bytes():
    ok = "a = '" + "x" * (MAX_SELECTOR_BYTES - 6) + "'"
    assert len(ok.encode()) == MAX_SELECTOR_BYTES
    compile_selector(ok)
    with pytest.raises(SelectorError):
        compile_selector("a = '" + "é" * (MAX_SELECTOR_BYTES // 2) + "'")


def test_wide_selectors_compile_and_evaluate_linearly():
    """A long OR chain is flat, not deep: it compiles, and one evaluation visits
    each term once (counted through a header mapping that records lookups)."""
    terms = [f"h{i} = {i}" for i in range(300)]
    selector = " OR ".join(terms)
    assert len(selector.encode()) <= MAX_SELECTOR_BYTES
    evaluator = compile_selector(selector)

    class Counting(dict):
        lookups = 0

        def get(self, key, default=None):
            Counting.lookups += 1
            return super().get(key, default)

    headers = Counting(h299=299)
    assert evaluator(Fields(headers, commands.Basic.Properties())) is True
    assert Counting.lookups == 300


def test_compiled_once_per_text():
    assert compile_selector("k = 1") is compile_selector("k = 1")


def _like_reference(pattern: str, value: str, escape: str | None = None) -> bool:
    out, chars = [], iter(pattern)
    for ch in chars:
        if escape is not None and ch == escape:
            out.append(re.escape(next(chars)))
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.fullmatch("".join(out), value, re.S) is not None


@settings(max_examples=examples(400))
@given(pattern=st.text("ab%_", max_size=8), value=st.text("ab%_", max_size=9))
def test_like_agrees_with_a_regex_reference(pattern, value):
    assert like_pattern(pattern).match(value) is _like_reference(pattern, value)


@settings(max_examples=examples(200))
@given(pattern=st.text("ab%_!", max_size=8), value=st.text("ab%_", max_size=9))
def test_like_with_escape_agrees_with_reference(pattern, value):
    if pattern.endswith("!") and not pattern.endswith("!!"):
        with pytest.raises(ValueError):
            like_pattern(pattern, "!")
        return
    try:
        expected = _like_reference(pattern, value, "!")
    except StopIteration:
        return
    assert like_pattern(pattern, "!").match(value) is expected


def test_glob_has_no_backtracking_blowup():
    """'%a%a%a%a%a%b' against 200,000 'a's: a backtracking regex needs ~n^5 steps."""
    value = "a" * 200_000
    start = time.process_time()
    assert not like_pattern("%a%a%a%a%a%b").match(value)
    assert not wild_pattern("*a*a*a*a*a*b").match(value)
    assert like_pattern("%a%a%a%a%a%").match(value)
    assert time.process_time() - start < 0.5


def test_wild_pattern_syntax():
    assert wild_pattern("FOREX.*").match("FOREX.EUR.USD")
    assert not wild_pattern("FOREX.*").match("FOREXEUR")
    assert wild_pattern("FX?").match("FX1") and not wild_pattern("FX?").match("FX12")
    assert wild_pattern(r"a\*b").match("a*b") and not wild_pattern(r"a\*b").match("axb")
    assert wild_pattern("*").match("") and wild_pattern("").match("")
