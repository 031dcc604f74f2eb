"""brokerd's Prometheus endpoint: off by default, loopback by default, RabbitMQ's names,
values read from the model at scrape time."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.brokerd_process import BrokerProcess, free_port
from tests.conftest import uid

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, int]]:
    port = free_port()
    proc = BrokerProcess(
        Path(tmp_path_factory.mktemp("metrics")), extra_args=["--metrics-port", str(port)]
    ).start()
    try:
        yield proc, port
    finally:
        proc.stop()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_follow_the_model(metered):
    broker, port = metered
    before = scrape(port)
    assert before[("rabbitmq_connections", ())] == 0
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        q = uid("metered")
        ch.queue_declare(q, auto_delete=True)
        for i in range(5):
            ch.basic_publish("", q, str(i).encode())
        method, _, _ = ch.basic_get(q)
        ch.basic_nack(method.delivery_tag, requeue=True)  # back, redelivered next time
        got, _, _ = ch.basic_get(q)
        assert got.redelivered
        ch.basic_ack(got.delivery_tag)
        method, _, _ = ch.basic_get(q)  # one left unacked
        ch.basic_consume(q, lambda *a: None)
        conn.process_data_events(time_limit=0.2)
        m = scrape(port)
        labels = (("queue", q), ("vhost", "/"))
        assert m[("rabbitmq_connections", ())] == 1
        assert m[("rabbitmq_channels", ())] == 1
        assert m[("rabbitmq_queue_consumers", labels)] == 1
        assert (
            m[("rabbitmq_queue_messages_ready", labels)]
            + m[("rabbitmq_queue_messages_unacked", labels)]
            == m[("rabbitmq_queue_messages", labels)]
            == 4
        )
        assert m[("rabbitmq_queue_messages_published_total", labels)] == 5
        g = "rabbitmq_global_messages_"
        assert m[(g + "received_total", ())] - before[(g + "received_total", ())] == 5
        assert m[(g + "routed_total", ())] - before[(g + "routed_total", ())] == 5
        assert m[(g + "acknowledged_total", ())] - before[(g + "acknowledged_total", ())] == 1
        assert m[(g + "redelivered_total", ())] - before[(g + "redelivered_total", ())] >= 1
        assert m[(g + "delivered_total", ())] - before[(g + "delivered_total", ())] >= 3
        assert m[("rookery_cluster_role", (("role", "standalone"),))] == 1
        assert m[("rookery_cluster_is_root", ())] == 0
        assert m[("rookery_cluster_peers_active", ())] == 0
        # a requeue is not a death: nothing expired or dead-lettered
        assert m[("rookery_queue_messages_expired_total", labels)] == 0
        assert m[("rookery_queue_messages_dead_lettered_total", labels)] == 0


def test_metrics_count_expiry_and_dead_letters(metered):
    broker, port = metered
    strategy = (("dead_letter_strategy", "at_most_once"), ("queue_type", "rabbit_classic_queue"))
    before = scrape(port)
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        dead, q = uid("dead"), uid("ttl")
        ch.queue_declare(dead)
        args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
        ch.queue_declare(q, arguments={"x-message-ttl": 50, **args})
        for i in range(3):
            ch.basic_publish("", q, str(i).encode())
        deadline = time.monotonic() + 10
        while ch.queue_declare(dead, passive=True).method.message_count < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        m = scrape(port)
    labels = (("queue", q), ("vhost", "/"))
    assert m[("rookery_queue_messages_expired_total", labels)] == 3
    assert m[("rookery_queue_messages_dead_lettered_total", labels)] == 3
    name = "rabbitmq_global_messages_dead_lettered_expired_total"
    assert m[(name, strategy)] - before[(name, strategy)] == 3


def test_metrics_lossy_drops_and_logins(metered):
    broker, port = metered
    with pika.BlockingConnection(pika.URLParameters(broker.url)) as conn:
        ch = conn.channel()
        ex = uid("lossy")
        ch.exchange_declare(ex, "x-lossy", auto_delete=True, arguments={"x-loss-rate": "1"})
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, ex)
        for _ in range(3):
            ch.basic_publish(ex, "", b"x")
        ch.queue_declare(q, passive=True)
        m = scrape(port)
        labels = (("exchange", ex), ("vhost", "/"))
        assert m[("rookery_exchange_messages_dropped_total", labels)] == 3
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.URLParameters(f"amqp://guest:wrong@127.0.0.1:{broker.port}/"))
    assert scrape(port)[("rookery_login_refused_total", ())] >= 1


def test_other_paths_and_methods_are_refused(metered):
    _, port = metered
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
    assert info.value.code == 404
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=5)
    assert info.value.code == 405
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"garbage without an end")
        s.shutdown(socket.SHUT_WR)
        assert s.recv(100) == b""  # dropped, nothing else
    assert scrape(port)  # still serving


def test_metrics_off_by_default_and_loopback_by_default(broker: BrokerProcess, metered):
    metered_broker, port = metered
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    listeners = [r[1] for r in rows if r[3] == "0A"]  # state 0A: LISTEN
    assert f"0100007F:{port:04X}" in listeners  # 127.0.0.1
    assert f"00000000:{port:04X}" not in listeners  # not 0.0.0.0
    assert "metrics listening bind=127.0.0.1" in metered_broker.log_text()
    assert "(loopback only)" in metered_broker.log_text()
    assert "metrics listening" not in broker.log_text()  # the default broker serves none
