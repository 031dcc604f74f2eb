"""The benchmark client's frames: what it sends must be valid AMQP, what it counts must be right.

Every pre-encoded byte string of ``brokerd.bench`` is decoded back with pamqp
(the reference codec), and the cheap frame scanner is checked against
pamqp-encoded server traffic.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from pamqp import body as pbody
from pamqp import commands, frame
from pamqp import header as pheader

from brokerd.bench import frames
from brokerd.bench.frames import AMQPURL, FrameError
from brokerd.bench.workers import _Confirms


def decode_all(data: bytes) -> list[tuple[int, object]]:
    out = []
    pos = 0
    while pos < len(data):
        consumed, channel, value = frame.unmarshal(data[pos:])
        assert consumed > 0
        out.append((channel, value))
        pos += consumed
    assert pos == len(data)
    return out


def deliver_bytes(channel: int, tag: int, body: bytes, ctag: str = "bench-0") -> bytes:
    """A server's delivery as pamqp encodes it: basic.deliver, header, body."""
    return (
        frame.marshal(
            commands.Basic.Deliver(
                consumer_tag=ctag, delivery_tag=tag, exchange="", routing_key="q"
            ),
            channel,
        )
        + frame.marshal(pheader.ContentHeader(0, len(body), commands.Basic.Properties()), channel)
        + frame.marshal(pbody.ContentBody(body), channel)
    )


# -- what the publisher sends -------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 250, 1000])
def test_publish_frames_decode_with_pamqp(size: int) -> None:
    body = frames.make_body(size)
    assert len(body) == size
    data = frames.publish_frames(1, "ex", "rk", body, 131072)
    decoded = decode_all(data)
    channel, method = decoded[0]
    assert channel == 1
    assert isinstance(method, commands.Basic.Publish)
    assert (method.exchange, method.routing_key) == ("ex", "rk")
    assert (method.mandatory, method.immediate) == (False, False)
    channel, hdr = decoded[1]
    assert channel == 1 and isinstance(hdr, pheader.ContentHeader)
    assert hdr.class_id == 60 and hdr.body_size == size
    bodies = [v for _, v in decoded[2:]]
    assert all(isinstance(b, pbody.ContentBody) for b in bodies)
    assert b"".join(b.value for b in bodies) == body
    assert len(bodies) == (1 if size else 0)


def test_publish_batch_is_n_whole_messages() -> None:
    body = frames.make_body(250)
    one = frames.publish_frames(3, "", "bench-q", body, 131072)
    batch = frames.publish_batch(3, "", "bench-q", body, 50, 131072)
    assert batch == one * 50
    decoded = decode_all(batch)
    assert len(decoded) == 150
    for i in range(0, 150, 3):
        assert isinstance(decoded[i][1], commands.Basic.Publish)
        assert decoded[i][1].routing_key == "bench-q"
        assert decoded[i + 1][1].body_size == 250
        assert decoded[i + 2][1].value == body
    assert {channel for channel, _ in decoded} == {3}


def test_body_is_split_at_frame_max() -> None:
    body = frames.make_body(10_000)
    decoded = decode_all(frames.publish_frames(1, "", "q", body, 4096))
    parts = [v for _, v in decoded[2:]]
    assert [len(p.value) for p in parts] == [4088, 4088, 1824]
    assert b"".join(p.value for p in parts) == body
    # every frame respects frame_max (payload + 8 bytes of framing)
    data = frames.publish_frames(1, "", "q", body, 4096)
    pos = 0
    while pos < len(data):
        _, _, size = frames._unpack_head(data, pos)
        assert size + 8 <= 4096
        pos += size + 8


def test_control_methods_are_pamqp_frames() -> None:
    for method in (
        commands.Connection.StartOk(
            client_properties={"product": "rookery-bench"},
            mechanism="PLAIN",
            response="\0guest\0guest",
            locale="en_US",
        ),
        commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0),
        commands.Connection.Open(virtual_host="/"),
        commands.Queue.Declare(queue="x", passive=True),
        commands.Confirm.Select(),
        commands.Basic.Consume(queue="x", consumer_tag="bench-0", no_ack=True),
    ):
        data = frames.method_frame(5, method)
        [(channel, decoded)] = decode_all(data)
        assert channel == 5 and type(decoded) is type(method)
        again = frames.decode_method(data[7:-1])
        assert type(again) is type(method)


# -- what the consumer and publisher read --------------------------------------------------


def test_scan_counts_deliveries_per_channel() -> None:
    body = frames.make_body(250)
    ack = frame.marshal(commands.Basic.Ack(delivery_tag=7, multiple=True), 1)
    heartbeat = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    data = (
        deliver_bytes(1, 1, body)
        + deliver_bytes(2, 1, body)
        + heartbeat
        + deliver_bytes(1, 2, body)
        + ack
        + deliver_bytes(2, 2, frames.make_body(1000))
    )
    counts = [0] * 4
    others: list[tuple[int, bytes]] = []
    assert frames.scan_frames(data, 0, len(data), counts, others) == len(data)
    assert counts == [0, 2, 2, 0]
    assert others == [(1, ack[7:-1])]
    assert frames.confirm_of(others[0][1]) == (True, 7, True)


def test_scan_keeps_incomplete_frames_for_later() -> None:
    body = frames.make_body(250)
    data = b"".join(deliver_bytes(1, tag, body) for tag in range(1, 101))
    for cut in (1, 7, 10, 11, 12, 100, len(data) // 2, len(data) - 1):
        counts = [0, 0]
        others: list[tuple[int, bytes]] = []
        pos = frames.scan_frames(data, 0, cut, counts, others)
        assert pos <= cut
        rest = data[pos:]
        assert frames.scan_frames(rest, 0, len(rest), counts, others) == len(rest)
        assert counts[1] == 100 and not others


def test_scan_rejects_a_bad_frame_end() -> None:
    data = bytearray(deliver_bytes(1, 1, b"x"))
    data[-1] = 0x00
    with pytest.raises(FrameError):
        frames.scan_frames(data, 0, len(data), [0, 0], [])


def test_confirm_of_reads_acks_and_nacks() -> None:
    ack = frame.marshal(commands.Basic.Ack(delivery_tag=2**40, multiple=False), 1)[7:-1]
    nack = frame.marshal(commands.Basic.Nack(delivery_tag=5, multiple=True, requeue=False), 1)
    assert frames.confirm_of(ack) == (True, 2**40, False)
    assert frames.confirm_of(nack[7:-1]) == (False, 5, True)
    other = frame.marshal(commands.Basic.QosOk(), 1)[7:-1]
    assert frames.confirm_of(other) is None


def test_confirm_bookkeeping() -> None:
    c = _Confirms()
    c.settle(True, 3, False)
    assert c.settled == 1 and c.upto == 0
    c.settle(True, 2, True)  # 1..2 acked; 3 was already
    assert c.settled == 3 and c.upto == 3 and not c.singles
    c.settle(False, 10, True)  # 4..10 nacked
    assert c.settled == 10 and c.nacked == 7
    c.settle(True, 11, False)
    c.settle(True, 11, False)  # duplicate
    assert c.settled == 11


def test_urls() -> None:
    u = AMQPURL("amqp://guest:guest@127.0.0.1:5672/")
    assert (u.host, u.port, u.user, u.password, u.vhost) == (
        "127.0.0.1",
        5672,
        "guest",
        "guest",
        "/",
    )
    assert AMQPURL("amqp://a:b%40c@h/%2Fvh").vhost == "/vh"
    assert AMQPURL("amqp://a:b%40c@h/%2Fvh").password == "b@c"
    assert AMQPURL("amqp://h").vhost == "/"
    assert "b@c" not in AMQPURL("amqp://a:b%40c@h/").redacted
    with pytest.raises(ValueError):
        AMQPURL("http://h/")
    tls = AMQPURL("amqps://h/?cafile=/etc/ca.pem")
    assert (tls.tls, tls.port, tls.cafile) == (True, 5671, "/etc/ca.pem")
    assert tls.redacted == "amqps://guest@h:5671/"
    assert AMQPURL("amqp://h").ssl_context() is None


@pytest.mark.integration  # starts a Python process
def test_bench_does_not_import_the_broker() -> None:
    code = (
        "import sys, brokerd.bench.cli, brokerd.bench.workers, brokerd.bench.scenarios\n"
        "bad = [m for m in sys.modules if m.startswith("
        "('brokerd.model', 'brokerd.protocol', 'brokerd.server', 'brokerd.wire'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- end to end against a real brokerd ------------------------------------------------------


@pytest.mark.integration
def test_bench_runs_against_brokerd(broker) -> None:
    from brokerd.bench.client import Client, ServerClosed
    from brokerd.bench.scenarios import SCENARIOS, Options, Run

    opts = Options(duration=1.0, warmup=0.3, queues=3, batch=50, confirm_window=1000)
    for name in ("queue-250", "fanout-isr", "fanout-consumers", "ttl-dlx"):
        run = Run(broker.url, SCENARIOS[name], opts)
        result = run.run()
        assert result["value"] > 0, result
        assert result["publish_rate"] > 0
        assert result["nacked"] == 0
        # everything it declared is gone again
        client = Client(AMQPURL(broker.url)).connect()
        try:
            for queue in [*run.queue_names, *([run.expiring] if run.expiring else [])]:
                ch = client.open_channel()
                with pytest.raises(ServerClosed, match="404"):
                    client.queue_declare(ch, queue, passive=True)
        finally:
            client.close()


# -- the consumer's fast delivery counter ------------------------------------------------------


def random_stream(rng: random.Random, n: int, odd: float) -> bytes:
    """Deliveries on a few channels, sprinkled with acks, heartbeats and other layouts."""
    body = frames.make_body(250)
    ack = frame.marshal(commands.Basic.Ack(delivery_tag=7, multiple=True), 1)
    heartbeat = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    parts = []
    for i in range(n):
        r = rng.random()
        if r < odd / 3:
            parts.append(ack)
        elif r < 2 * odd / 3:
            parts.append(heartbeat)
        elif r < odd:
            size = rng.choice([0, 5, 250, 1000])
            parts.append(deliver_bytes(rng.randint(1, 300), i, frames.make_body(size)))
        elif r < odd * 1.2:
            parts.append(deliver_bytes(1, i, body, ctag="another-tag"))
        else:
            channel = rng.choice([1, 1, 1, 2, 3, 256, 300])
            parts.append(deliver_bytes(channel, rng.randint(0, 2**63), body))
    return b"".join(parts)


@pytest.mark.parametrize("seed", range(40))
def test_delivery_counter_matches_the_frame_walk(seed: int) -> None:
    rng = random.Random(seed)
    data = random_stream(rng, rng.randint(0, 600), rng.choice([0.0, 0.001, 0.02, 0.2]))
    expected = [0] * 301
    expected_others: list[tuple[int, bytes]] = []
    assert frames.scan_frames(data, 0, len(data), expected, expected_others) == len(data)
    counter = frames.DeliveryCounter(300)
    buf = bytearray()
    i = 0
    while i < len(data):  # fed in recv-sized pieces, a partial frame kept for the next one
        n = rng.choice([rng.randint(1, 50), rng.randint(1, 5000), rng.randint(1, 100_000)])
        buf += data[i : i + n]
        i += n
        pos = counter.scan(buf, 0, len(buf))
        del buf[:pos]
    assert not buf
    assert counter.counts == expected
    assert counter.others == expected_others


def test_delivery_counter_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    body = frames.make_body(250)
    data = b"".join(deliver_bytes(1, tag, body) for tag in range(1, 1001))
    counter = frames.DeliveryCounter(1)
    calls = 0
    real = frames.scan_frames

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(frames, "scan_frames", counting)
    assert counter.scan(data, 0, len(data)) == len(data)
    assert counter.counts[1] == 1000
    assert calls <= 20  # the run is checked with slices, not walked frame by frame
