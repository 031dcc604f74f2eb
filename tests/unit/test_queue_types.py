"""x-queue-type on declare: what each type accepts, and RabbitMQ 3.10.8's 406 texts.

Every expected text here was measured against RabbitMQ 3.10.8 (Debian's
rabbitmq-server) with the same declares; the one deliberate difference is
``stream``, a type RabbitMQ has and this broker has not (it is refused with
RabbitMQ's own text for a type it does not know).
"""

from __future__ import annotations

from typing import Any

import pytest

from brokerd.model.errors import ChannelError
from brokerd.model.queuetypes import CLASSIC, QUORUM, TYPE_ARGUMENTS, queue_type
from brokerd.model.vhost import VirtualHost

Q = "for queue 'q' in vhost '/'"


def declare(vhost: VirtualHost, *, durable: bool = True, **kwargs: Any) -> None:
    flags = {k: kwargs.pop(k) for k in ("exclusive", "auto_delete") if k in kwargs}
    vhost.declare_queue("q", connection_id=1, durable=durable, arguments=kwargs, **flags)


def refused(vhost: VirtualHost, **kwargs: Any) -> str:
    with pytest.raises(ChannelError) as info:
        declare(vhost, **kwargs)
    assert info.value.reply_code == 406
    return info.value.text


@pytest.fixture
def vhost() -> VirtualHost:
    return VirtualHost("/")


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        (
            {"x-queue-type": "bogus"},
            f"invalid arg 'x-queue-type' {Q}: \"unsupported queue type 'bogus'\"",
        ),
        ({"x-queue-type": ""}, f"invalid arg 'x-queue-type' {Q}: \"unsupported queue type ''\""),
        (
            {"x-queue-type": "stream"},
            f"invalid arg 'x-queue-type' {Q}: \"unsupported queue type 'stream'\"",
        ),
        ({"x-queue-type": 5}, f"invalid arg 'x-queue-type' {Q}: {{unacceptable_type,signedint}}"),
        ({"x-queue-type": "quorum", "durable": False}, f"invalid property 'non-durable' {Q}"),
        ({"x-queue-type": "quorum", "exclusive": True}, f"invalid property 'exclusive-owner' {Q}"),
        ({"x-queue-type": "quorum", "auto_delete": True}, f"invalid property 'auto-delete' {Q}"),
        (
            {"x-queue-type": "quorum", "x-quorum-initial-group-size": 0},
            f"invalid arg 'x-quorum-initial-group-size' {Q}: {{value_zero,0}}",
        ),
        (
            {"x-queue-type": "quorum", "x-quorum-initial-group-size": -1},
            f"invalid arg 'x-quorum-initial-group-size' {Q}: {{value_negative,-1}}",
        ),
        (
            {"x-queue-type": "quorum", "x-quorum-initial-group-size": "3"},
            f"invalid arg 'x-quorum-initial-group-size' {Q}: \"expected integer, got longstr\"",
        ),
        (
            {"x-queue-type": "quorum", "x-queue-leader-locator": 1},
            f"invalid arg 'x-queue-leader-locator' {Q}: {{unacceptable_type,signedint}}",
        ),
        (
            {"x-queue-type": "quorum", "x-dead-letter-strategy": "bogus"},
            f"invalid arg 'x-dead-letter-strategy' {Q}: invalid_dlx_strategy",
        ),
    ],
)
def test_a_bad_type_property_or_value_is_refused_with_rabbitmqs_text(
    vhost: VirtualHost, kwargs: dict[str, Any], text: str
) -> None:
    assert refused(vhost, **kwargs) == text
    assert "q" not in vhost.queues


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        (QUORUM, "x-max-priority", 5),
        (QUORUM, "x-queue-mode", "lazy"),
        (QUORUM, "x-queue-master-locator", "min-masters"),
        (QUORUM, "x-queue-version", 2),
        (QUORUM, "x-max-age", "1D"),
        (QUORUM, "x-stream-max-segment-size-bytes", 5),
        (CLASSIC, "x-quorum-initial-group-size", 3),
        (CLASSIC, "x-queue-leader-locator", "balanced"),
        (CLASSIC, "x-delivery-limit", 3),
        (CLASSIC, "x-dead-letter-strategy", "at-least-once"),
        (CLASSIC, "x-max-in-memory-length", 3),
        (CLASSIC, "x-max-in-memory-bytes", 3),
        (CLASSIC, "x-max-age", "1D"),
    ],
)
def test_an_argument_of_another_type_is_refused(
    vhost: VirtualHost, kind: str, key: str, value: object
) -> None:
    module = {CLASSIC: "rabbit_classic_queue", QUORUM: "rabbit_quorum_queue"}[kind]
    arguments = {key: value} if kind == CLASSIC else {"x-queue-type": kind, key: value}
    assert refused(vhost, **arguments) == f"invalid arg '{key}' {Q} of queue type {module}"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"x-queue-type": "quorum"},
        {"x-queue-type": "quorum", "x-message-ttl": 1000, "x-expires": 100000},
        {"x-queue-type": "quorum", "x-overflow": "reject-publish-dlx", "x-max-length": 10},
        {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3},
        {"x-queue-type": "quorum", "x-queue-leader-locator": "random"},  # RabbitMQ takes any
        {"x-queue-type": "quorum", "x-delivery-limit": 3, "x-single-active-consumer": True},
        {"x-queue-type": "quorum", "x-dead-letter-strategy": "at-least-once"},
        {"x-queue-type": "classic", "durable": False, "exclusive": True},
        {"x-queue-type": "classic", "x-max-priority": 5, "x-queue-mode": "lazy"},
        {"x-something-rabbitmq-does-not-know": 1},
    ],
)
def test_what_each_type_understands_is_declared(vhost: VirtualHost, kwargs: dict[str, Any]) -> None:
    declare(vhost, **kwargs)
    assert "q" in vhost.queues


def test_every_argument_a_type_understands_is_one_rabbitmq_knows() -> None:
    assert TYPE_ARGUMENTS[CLASSIC] & TYPE_ARGUMENTS[QUORUM] >= {"x-queue-type", "x-expires"}
    assert queue_type({}) == CLASSIC
    assert queue_type({"x-queue-type": "quorum"}) == QUORUM
    assert queue_type({}, default=QUORUM) == QUORUM


@pytest.mark.parametrize(
    ("first", "second", "key", "text"),
    [
        (
            {"x-queue-type": "quorum"},
            {},
            "x-queue-type",
            "received none but current is the value 'quorum' of type 'longstr'",
        ),
        (
            {"x-queue-type": "quorum"},
            {"x-queue-type": "classic"},
            "x-queue-type",
            "received 'classic' but current is 'quorum'",
        ),
        (
            {},
            {"x-queue-type": "quorum"},
            "x-queue-type",
            "received the value 'quorum' of type 'longstr' but current is none",
        ),
        (
            {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3},
            {"x-queue-type": "quorum", "x-quorum-initial-group-size": 5},
            "x-quorum-initial-group-size",
            "received '5' but current is '3'",
        ),
        (
            {"x-queue-type": "quorum", "x-queue-leader-locator": "balanced"},
            {"x-queue-type": "quorum"},
            "x-queue-leader-locator",
            "received none but current is the value 'balanced' of type 'longstr'",
        ),
    ],
)
def test_a_redeclare_must_ask_for_the_same_type_and_placement(
    vhost: VirtualHost, first: dict[str, Any], second: dict[str, Any], key: str, text: str
) -> None:
    declare(vhost, **first)
    assert refused(vhost, **second) == f"inequivalent arg '{key}' {Q}: {text}"


@pytest.mark.parametrize(
    ("first", "second"),
    [({"x-queue-type": "classic"}, {}), ({}, {"x-queue-type": "classic"})],
)
def test_an_absent_type_is_classic_on_redeclare(
    vhost: VirtualHost, first: dict[str, Any], second: dict[str, Any]
) -> None:
    declare(vhost, **first)
    declare(vhost, **second)
