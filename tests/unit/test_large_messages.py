"""Large bodies cost about 1x their size: assembled in place, delivered as views."""

from __future__ import annotations

import os

import pytest
from pamqp import commands, frame

from brokerd.model import message as message_module
from brokerd.model.message import LARGE_BODY, Message, body_buffer
from brokerd.protocol import channel as channel_module
from brokerd.wire import codec
from tests.unit.test_connection_machine import Client, parse, publish_frames


@pytest.mark.parametrize("size", [0, 1, 4088, 4089, 70_000, 300_001])
@pytest.mark.parametrize("frame_max", [4096, 131072])
def test_content_parts_are_the_content_frames_without_copying_the_body(size, frame_max):
    body = os.urandom(size)
    parts = codec.content_parts(3, b"\x00\x00", body, frame_max)
    assert b"".join(parts) == codec.content_frames(3, b"\x00\x00", body, frame_max)
    views = [p for p in parts if isinstance(p, memoryview)]
    assert all(v.obj is body for v in views)  # slices of the body itself
    assert sum(map(len, views)) == size


def test_body_buffer_is_a_writable_mapping_of_the_declared_size():
    buffer = body_buffer(3 * LARGE_BODY)
    assert buffer is not None and len(buffer) == 3 * LARGE_BODY and not buffer.readonly
    buffer[5:8] = b"abc"
    assert bytes(buffer[4:9]) == b"\x00abc\x00"


def opened(frame_max: int = 131072) -> Client:
    client = Client()
    client.handshake(frame_max=frame_max)
    client.open_channel(1)
    client.send(1, commands.Queue.Declare(queue="big"))
    return client


def get_body(client: Client) -> tuple[bytes, list]:
    client.conn.receive_data(frame.marshal(commands.Basic.Get(queue="big", no_ack=True), 1))
    buffers = client.conn.output_buffers()
    data = b"".join(buffers)
    frames = parse(data)
    body = b"".join(f.value for _, f in frames if type(f).__name__ == "ContentBody")
    return body, buffers


def test_a_large_body_is_assembled_in_place_and_sent_as_views():
    client = opened()
    body = os.urandom(3 * LARGE_BODY + 17)
    client.feed(publish_frames(1, "", "big", body, frame_max=131072))
    (queued,) = client.broker.vhosts["/"].queues["big"].messages
    assert isinstance(queued.body, memoryview) and queued.body.readonly
    assert queued.body == body
    got, buffers = get_body(client)
    assert got == body
    views = [b for b in buffers if isinstance(b, memoryview)]
    assert len(views) == -(-len(body) // (131072 - 8))  # one view per body frame
    assert all(v.obj is queued.body.obj for v in views)  # the stored body, not a copy


def test_a_medium_body_is_joined_and_sent_as_views_but_not_cached():
    client = opened()
    body = os.urandom(200_000)
    client.feed(publish_frames(1, "", "big", body, frame_max=131072))
    (queued,) = client.broker.vhosts["/"].queues["big"].messages
    assert isinstance(queued.body, bytes) and queued.body == body
    got, buffers = get_body(client)
    assert got == body and any(isinstance(b, memoryview) for b in buffers)
    assert queued._content is None  # no second copy kept with the message


def test_small_messages_keep_one_joined_output_and_the_cache():
    client = opened()
    client.feed(publish_frames(1, "", "big", b"x" * 250))
    (queued,) = client.broker.vhosts["/"].queues["big"].messages
    assert type(queued.body) is bytes
    got, buffers = get_body(client)
    assert got == b"x" * 250 and len(buffers) == 1 and type(buffers[0]) is bytes
    assert queued._content is not None


def test_without_a_mapping_the_frames_are_joined(monkeypatch):
    monkeypatch.setattr(channel_module, "body_buffer", lambda size: None)
    client = opened()
    body = os.urandom(LARGE_BODY + 5)
    client.feed(publish_frames(1, "", "big", body, frame_max=131072))
    (queued,) = client.broker.vhosts["/"].queues["big"].messages
    assert type(queued.body) is bytes and queued.body == body


def test_a_partial_large_body_goes_with_its_channel():
    client = opened()
    frames = publish_frames(1, "", "big", os.urandom(2 * LARGE_BODY), frame_max=131072)
    client.feed(frames[: frame_boundary(frames, 5)])  # method, header, three body frames
    channel = client.conn.channels[1]
    assert channel._buffer is not None and channel._received == 3 * (131072 - 8)
    client.conn.connection_lost()
    assert channel._buffer is None
    assert not client.broker.vhosts["/"].queues["big"].messages


def frame_boundary(data: bytes, count: int) -> int:
    """Where the first ``count`` frames of ``data`` end."""
    pos = 0
    for _ in range(count):
        pos += 8 + int.from_bytes(data[pos + 3 : pos + 7], "big")
    return pos


def test_a_larger_body_than_declared_is_refused_in_place():
    client = opened()
    body = os.urandom(LARGE_BODY + 100)
    frames = publish_frames(1, "", "big", body, frame_max=131072)
    header_end = frames.index(b"\xce", frames.index(b"\xce") + 1) + 1  # method, header
    declared_short = frames[:header_end].replace(
        (LARGE_BODY + 100).to_bytes(8, "big"), (LARGE_BODY + 50).to_bytes(8, "big")
    )
    out = client.feed(declared_short + frames[header_end:])
    assert any(isinstance(m, commands.Connection.Close) and m.reply_code == 505 for _, m in out), (
        out
    )


def test_message_body_may_be_any_bytes_like():
    for body in (b"abc", bytearray(b"abc"), memoryview(b"abc")):
        msg = Message.build("", "k", body)
        assert msg.size == 3
        assert b"".join(msg.content_parts(1, 4096)) == codec.content_frames(
            1, msg.props_raw, b"abc", 4096
        )
    assert message_module.Body  # the alias code may annotate with


def test_a_large_body_crosses_a_cluster_link_intact():
    """Links send ``message.body`` as it is: a view of a large one encodes as bytes would."""
    from brokerd.cluster.plane import records

    body = os.urandom(LARGE_BODY + 3)
    buffer = body_buffer(len(body))
    assert buffer is not None
    buffer[:] = body
    view = buffer.toreadonly()
    batch = records.Batch()
    batch.forward(7, "s/1/1", [("", "q")], "", "q", b"\x00\x00", view)
    batch.deliver("tag", 9, False, "", "q", b"\x00\x00", view)
    assert batch.size > 2 * len(body)
    forward, deliver = records.decode(batch.take())
    assert forward.body == body and deliver.body == body
