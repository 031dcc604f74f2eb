"""``x-federation-upstream``: fanout, except past the hop limit or back to its
downstream (RabbitMQ federation's loop prevention, on the upstream side)."""

from __future__ import annotations

import pytest
from pamqp import commands

from brokerd.config import default_config
from brokerd.model.broker import Broker
from brokerd.model.errors import ChannelError
from brokerd.model.message import Message
from brokerd.model.muxers.federation import should_forward

ARGS = {"x-max-hops": 2, "x-downstream-name": "site-b", "x-downstream-vhost": "/"}


def _hop(cluster: str, vhost: str = "/") -> dict[str, object]:
    return {
        "uri": "amqp://a",
        "exchange": "x",
        "redelivered": False,
        "cluster-name": cluster,
        "vhost": vhost,
    }


@pytest.mark.parametrize(
    ("headers", "forward"),
    [
        ({}, True),
        ({"x-received-from": [_hop("site-c")]}, True),
        ({"x-received-from": [_hop("site-c"), _hop("site-d")]}, False),  # 2 hops = max
        ({"x-received-from": [_hop("site-b")]}, False),  # it came from that downstream
        ({"x-received-from": [_hop("site-b", "other")]}, True),  # another vhost there
        ({"x-received-from": "not a list"}, True),
    ],
)
def test_hops_and_loops(headers: dict[str, object], forward: bool) -> None:
    assert should_forward(headers, 2, "site-b", "/") is forward


def test_the_exchange_routes_like_fanout_within_the_limits() -> None:
    config = default_config()
    broker = Broker(config.user_database(), config.vhosts, config.limits)
    vhost = broker.vhosts["/"]
    exchange = vhost.declare_exchange(
        "federation: x -> b", "x-federation-upstream", arguments=ARGS
    )[0]
    queue = vhost.declare_queue("fed-q", connection_id=1)[0]
    vhost.bind(exchange, queue, "")
    plain = Message.build("", "k", b"m")
    assert list(exchange.muxer.route(plain)) == [queue]
    looped = Message.build(
        "", "k", b"m", commands.Basic.Properties(headers={"x-received-from": [_hop("site-b")]})
    )
    assert list(exchange.muxer.route(looped)) == []


@pytest.mark.parametrize("hops", [None, 0, "2", True])
def test_a_missing_or_bad_hop_limit_is_406(hops: object) -> None:
    config = default_config()
    vhost = Broker(config.user_database(), config.vhosts, config.limits).vhosts["/"]
    args = {} if hops is None else {"x-max-hops": hops}
    with pytest.raises(ChannelError) as caught:
        vhost.declare_exchange("f", "x-federation-upstream", arguments=args)
    assert caught.value.reply_code == 406
