"""Resource limits (issue 12) on the sans-IO machine: connections, channels, queues,
exchanges per broker and per vhost, bytes before login; and their configuration."""

from __future__ import annotations

import tomllib

import pytest
from pamqp import commands

from brokerd.cluster.messages import CLUSTER_EXCHANGE
from brokerd.config import ConfigError, parse_config, parse_size
from brokerd.model.auth import Permission
from brokerd.model.broker import Limits, VhostLimits
from brokerd.model.limits import SYSTEM_EXCHANGES, user_exchanges
from brokerd.protocol.connection import ConnectionState
from brokerd.wire.codec import PROTOCOL_HEADER
from tests.unit.test_connection_machine import Client, make_broker, start_ok


def opened(broker, vhost: str = "/") -> Client:
    client = Client(broker=broker)
    client.feed(PROTOCOL_HEADER)
    client.send(0, start_ok())
    client.send(0, commands.Connection.TuneOk(2047, 131072, 0))
    client.last = client.send(0, commands.Connection.Open(vhost))
    return client


def closed_with(out, code: int) -> str:
    kinds = commands.Connection.Close | commands.Channel.Close
    closes = [m for _, m in out if isinstance(m, kinds)]
    assert closes, f"expected a close {code}, got {out}"
    assert closes[-1].reply_code == code, closes[-1].reply_text
    return closes[-1].reply_text


# -- connections ------------------------------------------------------------------------


def test_vhost_connection_limit_refuses_with_rabbitmqs_words_and_frees_on_close():
    broker = make_broker()
    broker.vhost_limits["/"] = VhostLimits(max_connections=2)
    first, second = opened(broker), opened(broker)
    assert first.conn.state is second.conn.state is ConnectionState.OPEN
    third = opened(broker)
    assert closed_with(third.last, 530) == (
        "NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
        "connection limit (2) is reached"
    )
    assert broker.connection_count == 2
    first.send(0, commands.Connection.Close(200, "bye", 0, 0))
    assert broker.vhost_connections == {"/": 1}
    assert opened(broker).conn.state is ConnectionState.OPEN  # room again


def test_broker_connection_limit_counts_every_vhost():
    broker = make_broker()
    broker.add_vhost("other")
    broker.users.set_permission("guest", "other", Permission())
    broker.limits.max_connections = 1
    assert opened(broker).conn.state is ConnectionState.OPEN
    text = closed_with(opened(broker, "other").last, 530)
    assert text == "NOT_ALLOWED - connection refused: node connection limit (1) is reached"


def test_a_lost_connection_is_uncounted_once():
    broker = make_broker()
    client = opened(broker)
    client.conn.connection_lost()
    client.conn.connection_lost()
    assert broker.connection_count == 0 and broker.vhost_connections == {}


def test_cluster_link_claim_without_a_cluster_is_an_ordinary_client():
    broker = make_broker()
    broker.limits.max_connections = 0
    client = Client(broker=broker)
    client.feed(PROTOCOL_HEADER)
    claim = start_ok()
    claim.client_properties["rookery_link"] = {"spid": "x"}
    client.send(0, claim)
    client.send(0, commands.Connection.TuneOk(2047, 131072, 0))
    out = client.send(0, commands.Connection.Open("/"))
    closed_with(out, 530)
    assert not client.conn.cluster_link


# -- channels ----------------------------------------------------------------------------


def test_channel_max_counts_open_channels_as_rabbitmq():
    broker = make_broker()
    client = Client(broker=broker)
    client.feed(PROTOCOL_HEADER)
    client.send(0, start_ok())
    client.send(0, commands.Connection.TuneOk(2, 131072, 0), commands.Connection.Open("/"))
    client.open_channel(1)
    client.open_channel(2)
    out = client.send(3, commands.Channel.Open())
    assert closed_with(out, 530) == (
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"
    )


def test_vhost_channel_limit_applies_live():
    broker = make_broker()
    client = opened(broker)
    client.open_channel(1)
    broker.vhost_limits["/"] = VhostLimits(channel_max=1)  # a reload
    out = client.send(2, commands.Channel.Open())
    assert "channel limit of virtual host '/' (1)" in closed_with(out, 530)


# -- queues and exchanges ----------------------------------------------------------------


def declare_queue(client: Client, name: str, channel: int = 1):
    return client.send(channel, commands.Queue.Declare(queue=name))


def test_vhost_queue_limit_is_406_and_redeclare_and_passive_pass():
    broker = make_broker()
    broker.vhost_limits["/"] = VhostLimits(max_queues=1)
    client = opened(broker)
    client.open_channel(1)
    declare_queue(client, "q1")
    assert isinstance(declare_queue(client, "q1")[0][1], commands.Queue.DeclareOk)
    out = client.send(1, commands.Queue.Declare(queue="q1", passive=True))
    assert isinstance(out[0][1], commands.Queue.DeclareOk)
    out = declare_queue(client, "q2")
    assert closed_with(out, 406) == (
        "PRECONDITION_FAILED - cannot declare queue 'q2': queue limit in virtual host '/' (1) "
        "is reached"
    )
    assert "q2" not in broker.vhosts["/"].queues


def test_broker_queue_limit_covers_server_named_queues():
    broker = make_broker()
    broker.limits.max_queues = 0
    client = opened(broker)
    client.open_channel(1)
    text = closed_with(declare_queue(client, ""), 406)
    assert text.startswith("PRECONDITION_FAILED - cannot declare queue 'amq.gen-")
    assert text.endswith("queue limit of this broker (0) is reached")


def test_reserved_names_keep_their_403_under_a_limit():
    broker = make_broker()
    broker.limits.max_queues = 0
    broker.limits.max_exchanges = 0
    client = opened(broker)
    client.open_channel(1)
    closed_with(declare_queue(client, "amq.mine"), 403)
    client.open_channel(2)
    out = client.send(2, commands.Exchange.Declare(exchange="amq.mine", exchange_type="direct"))
    closed_with(out, 403)


def test_exchange_limits_count_only_declared_exchanges():
    broker = make_broker()
    broker.vhost_limits["/"] = VhostLimits(max_exchanges=1)
    client = opened(broker)
    client.open_channel(1)
    client.send(1, commands.Exchange.Declare(exchange="x1", exchange_type="fanout"))
    assert user_exchanges(broker.vhosts["/"]) == 1
    out = client.send(1, commands.Exchange.Declare(exchange="x2", exchange_type="fanout"))
    assert closed_with(out, 406) == (
        "PRECONDITION_FAILED - cannot declare exchange 'x2': exchange limit in virtual host "
        "'/' (1) is reached"
    )


def test_the_cluster_exchange_is_a_system_exchange():
    assert CLUSTER_EXCHANGE in SYSTEM_EXCHANGES


# -- before authentication ----------------------------------------------------------------


def test_a_big_frame_before_login_is_refused_at_its_header():
    client = Client()
    client.feed(PROTOCOL_HEADER)
    # a start-ok claiming 100 KiB: refused as soon as its frame header is in
    out = client.feed(b"\x01\x00\x00\x00\x01\x90\x00" + b"\x00" * 100)
    assert "exceeds frame_max 4096" in closed_with(out, 501)
    assert client.conn.state is ConnectionState.CLOSED


def test_bytes_pipelined_during_the_login_are_capped():
    client = Client()
    client.conn.on_login = lambda check: None  # the check stays pending, as off the loop
    client.feed(PROTOCOL_HEADER)
    client.send(0, start_ok())
    assert client.conn.login is not None
    assert client.feed(b"\x08\x00\x00\x00\x00\x00\x00\xce" * 512) == []  # 4096: still fits
    out = client.feed(b"\x08")
    assert "4097 bytes received before authentication, more than the limit of 4096" in (
        closed_with(out, 501)
    )
    assert client.conn.state is ConnectionState.CLOSED
    client.conn.complete_login(client.conn.login, None, "late")  # ignored: already closed


def test_after_login_the_negotiated_frame_max_applies():
    client = Client()
    client.handshake()
    client.open_channel(1)
    from tests.unit.test_connection_machine import publish_frames

    client.feed(publish_frames(1, "", "nowhere", b"x" * 100_000, frame_max=131072))
    assert client.conn.state is ConnectionState.OPEN


# -- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (0, 0),
        (12345, 12345),
        ("50MB", 50_000_000),
        ("512MiB", 512 * 1024**2),
        ("2GB", 2 * 10**9),
        ("1 GiB", 1024**3),
        ("64k", 65536),
        ("100", 100),
    ],
)
def test_sizes_as_rabbitmq_writes_them(text, size):
    assert parse_size(text, "x") == size


@pytest.mark.parametrize("bad", ["1.5GB", "12 parsecs", "-1", -1, True, "", None])
def test_bad_sizes_name_the_key(bad):
    with pytest.raises(ConfigError, match=r"^limits\.disk: must be a number of bytes"):
        parse_size(bad, "limits.disk")


TOML = """
[limits]
max_connections = 100
max_queues = 1000
vm_memory_high_watermark = "2GiB"
disk_free_limit = "1GB"
max_unauthenticated_bytes = 8192

[[vhosts]]
name = "/"
limits = { max_connections = 10, max_queues = 20, max_exchanges = 5, channel_max = 64 }

[[vhosts]]
name = "plain"
"""


def test_brokerd_toml_limits_and_vhost_limits():
    config = parse_config(tomllib.loads(TOML), "brokerd.toml")
    limits = config.limits
    assert (limits.max_connections, limits.max_queues, limits.max_exchanges) == (100, 1000, None)
    assert limits.memory_limit(10**12) == 2 * 1024**3
    assert limits.disk_free_limit == 10**9 and limits.max_unauthenticated_bytes == 8192
    assert config.vhost_limits == {"/": VhostLimits(10, 20, 5, 64)}


def test_relative_watermark_is_a_share_of_memory():
    assert Limits().memory_limit(1000) == 400
    config = parse_config({"limits": {"vm_memory_high_watermark": 0.25}})
    assert config.limits.memory_limit(1000) == 250


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"limits": {"max_queues": -1}}, "limits.max_queues: must be a non-negative"),
        ({"limits": {"vm_memory_high_watermark": 2}}, "a fraction of memory from 0 to 1"),
        ({"limits": {"max_unauthenticated_bytes": 100}}, "must be an integer from 1024"),
        ({"vhosts": [{"name": "/", "limits": {"queues": 1}}]}, "unknown vhost limit 'queues'"),
        ({"vhosts": [{"name": "/", "limits": 5}]}, r"vhosts\[0\].limits: must be a table"),
    ],
)
def test_bad_limits_in_brokerd_toml(raw, error):
    with pytest.raises(ConfigError, match=error):
        parse_config(raw, "brokerd.toml")
