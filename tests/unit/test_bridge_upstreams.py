"""Federation upstreams, sets and policies as RabbitMQ defines them (issue 42): its
JSON accepted unchanged with its defaults, anything else refused with the key named,
and the policy choice deciding which upstreams federate an object."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokerd.bridges.definitions import DefinitionError
from brokerd.bridges.upstreams import (
    links_for,
    parse_policy,
    parse_upstream,
    parse_upstream_set,
    policy_for,
)

UPSTREAM = {"uri": "amqp://fed:pw@site-a.example"}


def test_an_upstream_takes_rabbitmqs_defaults() -> None:
    up = parse_upstream("a", UPSTREAM)
    assert (up.prefetch, up.reconnect_delay, up.ack_mode, up.max_hops) == (
        1000,
        5.0,
        "on-confirm",
        1,
    )
    assert up.exchange is None and up.expires is None and up.message_ttl is None
    full = parse_upstream(
        "b",
        {
            **UPSTREAM,
            "exchange": "orders",
            "max-hops": 2,
            "expires": 3600000,
            "message-ttl": 0,
            "prefetch-count": 50,
            "trust-user-id": True,
            "ha-policy": "all",
            "ack-mode": "on-publish",
        },
    )
    assert (full.exchange, full.max_hops, full.expires, full.message_ttl) == (
        "orders",
        2,
        3600000,
        0,
    )


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({}, "uri"),
        ({**UPSTREAM, "max-hop": 2}, "max-hop"),
        ({**UPSTREAM, "max-hops": 0}, "max-hops"),
        ({**UPSTREAM, "expires": 0}, "expires"),
        ({**UPSTREAM, "message-ttl": -1}, "message-ttl"),
        ({**UPSTREAM, "ack-mode": "sometimes"}, "ack-mode"),
        ({"uri": "http://site-a"}, "uri"),
        ({**UPSTREAM, "trust-user-id": "yes"}, "trust-user-id"),
    ],
)
def test_a_bad_upstream_names_its_key(value: dict[str, Any], field: str) -> None:
    with pytest.raises(DefinitionError) as raised:
        parse_upstream("a", value)
    assert raised.value.field == field


def test_sets_and_policies_choose_the_upstreams_of_an_object() -> None:
    upstreams = {
        "a": parse_upstream("a", UPSTREAM),
        "b": parse_upstream("b", {"uri": "amqp://site-b.example", "exchange": "x-b"}),
    }
    _name, entries = parse_upstream_set("west", [{"upstream": "b", "max-hops": 3}])
    sets = {"west": entries}
    policies = [
        parse_policy(
            "fed-all",
            {"pattern": "^fed\\.", "definition": {"federation-upstream-set": "all"}},
        ),
        parse_policy(
            "fed-west",
            {
                "pattern": "^fed\\.west",
                "apply-to": "exchanges",
                "priority": 5,
                "definition": {"federation-upstream-set": "west"},
            },
        ),
        parse_policy("one", {"pattern": "^q$", "definition": {"federation-upstream": "a"}}),
    ]
    everywhere = links_for("exchange", "fed.orders", policies, upstreams, sets)
    assert [(link.upstream.name, link.source) for link in everywhere] == [
        ("a", "fed.orders"),
        ("b", "x-b"),
    ]
    west = links_for("exchange", "fed.west.orders", policies, upstreams, sets)
    assert [(link.upstream.name, link.upstream.max_hops) for link in west] == [("b", 3)]
    # the higher-priority policy applies to exchanges only: a queue falls back
    assert policy_for("queue", "fed.west.q", policies).name == "fed-all"  # type: ignore[union-attr]
    assert [link.upstream.name for link in links_for("queue", "q", policies, upstreams, sets)] == [
        "a"
    ]
    assert links_for("exchange", "local", policies, upstreams, sets) == []


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"pattern": "(", "definition": {"federation-upstream": "a"}}, "pattern"),
        ({"pattern": ".", "apply-to": "bindings", "definition": {}}, "apply-to"),
        ({"pattern": ".", "definition": {"max-length": 5}}, "definition"),
        (
            {"pattern": ".", "definition": {"federation-upstream": ""}},
            "definition.federation-upstream",
        ),
        ({"pattern": ".", "priority": "high", "definition": {}}, "priority"),
        ({"pattern": ".", "definition": {}, "ha-mode": "all"}, "ha-mode"),
    ],
)
def test_a_bad_policy_names_its_key(value: dict[str, Any], field: str) -> None:
    with pytest.raises(DefinitionError) as raised:
        parse_policy("p", value)
    assert raised.value.field == field


def test_a_set_cannot_override_an_upstreams_uri() -> None:
    with pytest.raises(DefinitionError) as raised:
        parse_upstream_set("s", [{"upstream": "a", "uri": "amqp://elsewhere"}])
    assert raised.value.field == "value[0].uri"


@given(
    st.lists(
        st.tuples(st.integers(-3, 3), st.sampled_from(["exchanges", "queues", "all"])),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["exchange", "queue"]),
)
def test_the_chosen_policy_is_one_of_the_highest_that_apply(
    spec: list[tuple[int, str]], kind: str
) -> None:
    policies = [
        parse_policy(
            f"p{i}",
            {
                "pattern": ".*",
                "apply-to": apply_to,
                "priority": priority,
                "definition": {"federation-upstream": "a"},
            },
        )
        for i, (priority, apply_to) in enumerate(spec)
    ]
    applying = [p for p in policies if p.applies(kind, "x")]
    chosen = policy_for(kind, "x", policies)
    if not applying:
        assert chosen is None
    else:
        assert chosen is not None and chosen.priority == max(p.priority for p in applying)
        assert chosen.name == min(p.name for p in applying if p.priority == chosen.priority)
