"""The bridge's sans-IO AMQP client, fed a broker's frames by hand (no sockets)."""

from __future__ import annotations

import pytest
from pamqp import commands

from brokerd.bridges.client import (
    BODY_MAX,
    ChannelClosed,
    ClientConnection,
    Confirmed,
    ConnectionClosed,
    Delivered,
    Opened,
    ProtocolError,
    Reply,
)
from brokerd.wire import codec
from brokerd.wire.codec import FRAME_BODY, PROTOCOL_HEADER


def _methods(data: bytes) -> list[object]:
    frames, pos = codec.split_frames(data, 0, 1 << 20)
    assert pos == len(data)
    return [codec.decode_method(p) for t, _c, p in frames if t == codec.FRAME_METHOD]


def _opened(**kw: object) -> ClientConnection:
    conn = ClientConnection(username="u", password="p", vhost="v", heartbeat=10, **kw)  # type: ignore[arg-type]
    assert conn.data_to_send() == PROTOCOL_HEADER
    start = commands.Connection.Start(mechanisms="PLAIN AMQPLAIN EXTERNAL", locales="en_US")
    assert conn.receive(codec.method_frame(0, start)) == []
    (start_ok,) = _methods(conn.data_to_send())
    assert isinstance(start_ok, commands.Connection.StartOk)
    assert start_ok.mechanism == "PLAIN" and start_ok.response == "\0u\0p"
    tune = commands.Connection.Tune(channel_max=0, frame_max=65536, heartbeat=60)
    assert conn.receive(codec.method_frame(0, tune)) == []
    tune_ok, open_ = _methods(conn.data_to_send())
    assert isinstance(tune_ok, commands.Connection.TuneOk)
    assert (tune_ok.frame_max, tune_ok.heartbeat) == (65536, 10)  # the lower of the two
    assert isinstance(open_, commands.Connection.Open) and open_.virtual_host == "v"
    (opened,) = conn.receive(codec.method_frame(0, commands.Connection.OpenOk()))
    assert opened == Opened(heartbeat=10)
    return conn


def test_the_handshake_logs_in_tunes_and_opens_the_vhost() -> None:
    _opened()


def test_a_delivery_split_over_frames_arrives_whole_with_its_property_bytes() -> None:
    conn = _opened()
    props = codec.encode_properties(commands.Basic.Properties(content_type="t", priority=1))
    body = bytes(range(256)) * 600  # over frame_max: several body frames
    deliver = commands.Basic.Deliver(
        consumer_tag="c", delivery_tag=7, redelivered=True, exchange="x", routing_key="k"
    )
    data = codec.method_frame(1, deliver) + codec.content_frames(1, props, body, conn.frame_max)
    events = []
    for i in range(0, len(data), 1000):  # byte stream cut anywhere
        events += conn.receive(data[i : i + 1000])
    assert events == [Delivered(7, "x", "k", True, props, body)]


def test_confirms_nacks_and_replies_become_events() -> None:
    conn = _opened()
    events = conn.receive(
        codec.method_frame(1, commands.Basic.Ack(delivery_tag=5, multiple=True))
        + codec.method_frame(1, commands.Basic.Nack(delivery_tag=6))
        + codec.method_frame(
            1, commands.Queue.DeclareOk(queue="q", message_count=3, consumer_count=0)
        )
    )
    assert events[:2] == [Confirmed(5, True, True), Confirmed(6, False, False)]
    assert isinstance(events[2], Reply) and events[2].method.message_count == 3


def test_publish_keeps_the_property_bytes_and_splits_the_body_at_frame_max() -> None:
    conn = _opened()
    props = codec.encode_properties(commands.Basic.Properties(headers={"a": 1}))
    conn.publish("x", "k", props, b"z" * 100_000)
    frames, _ = codec.split_frames(conn.data_to_send(), 0, 1 << 20)
    assert codec.decode_method(frames[0][2]).exchange == "x"
    assert codec.decode_header(frames[1][2])[2] == props
    bodies = [p for t, _c, p in frames if t == FRAME_BODY]
    assert b"".join(bodies) == b"z" * 100_000 and all(len(b) <= 65536 - 8 for b in bodies)


def test_closes_from_the_broker_are_answered_and_reported() -> None:
    conn = _opened()
    close = commands.Channel.Close(
        reply_code=404, reply_text="NOT_FOUND - no queue 'q'", class_id=50, method_id=10
    )
    assert conn.receive(codec.method_frame(1, close)) == [
        ChannelClosed(404, "NOT_FOUND - no queue 'q'")
    ]
    assert isinstance(_methods(conn.data_to_send())[0], commands.Channel.CloseOk)
    refused = commands.Connection.Close(
        reply_code=403, reply_text="ACCESS_REFUSED", class_id=0, method_id=0
    )
    assert conn.receive(codec.method_frame(0, refused)) == [ConnectionClosed(403, "ACCESS_REFUSED")]
    assert isinstance(_methods(conn.data_to_send())[0], commands.Connection.CloseOk)


def test_broken_input_is_a_protocol_error_never_an_unbounded_buffer() -> None:
    conn = _opened()
    deliver = commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="")
    header = codec.content_frames(1, b"\x00\x00", b"", conn.frame_max)
    huge = bytearray(header)
    huge[11:19] = (BODY_MAX + 1).to_bytes(8, "big")  # the body size field
    with pytest.raises(ProtocolError) as caught:
        conn.receive(codec.method_frame(1, deliver) + bytes(huge))
    assert caught.value.code == 505
    with pytest.raises(ProtocolError) as caught:
        _opened().receive(b"\x01\x00\x00\x00\x00\x00\x04abcdX")  # bad frame end
    assert caught.value.code == 501
    with pytest.raises(ProtocolError):
        _opened().receive(codec.frame(FRAME_BODY, 1, b"stray"))


def test_close_says_goodbye_once() -> None:
    conn = _opened()
    conn.close(320, "bridge moved")
    (close,) = _methods(conn.data_to_send())
    assert isinstance(close, commands.Connection.Close) and close.reply_code == 320
    conn.close()
    assert conn.data_to_send() == b""


def test_a_mechanism_the_broker_does_not_offer_is_refused_before_logging_in() -> None:
    conn = ClientConnection(mechanism="external")
    conn.data_to_send()
    start = commands.Connection.Start(mechanisms="PLAIN", locales="en_US")
    with pytest.raises(ProtocolError, match="does not offer EXTERNAL"):
        conn.receive(codec.method_frame(0, start))
