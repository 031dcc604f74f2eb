"""The Prometheus collector reads the model at scrape time; the Grafana dashboard in
deploy/ only uses names it exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from brokerd.config import default_config
from brokerd.model.broker import Broker
from brokerd.model.message import Message
from brokerd.server.loopwatch import LoopWatch
from brokerd.server.metrics import BrokerCollector
from brokerd.server.resources import ResourceMonitor

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-brokerd.json"


def fake_server() -> SimpleNamespace:
    config = default_config()
    broker = Broker(config.user_database(), config.vhosts, config.limits)
    vhost = broker.vhosts["/"]
    queue = vhost.declare_queue("jobs", connection_id=1)[0]
    queue.push(Message.build("", "jobs", b"x"))
    vhost.declare_exchange("drop", "x-lossy", arguments={"x-loss-rate": 0.5})
    broker.messages_in = 7
    resources = ResourceMonitor(
        lambda: broker.limits,
        Path("/data"),
        lambda cause, reason: None,
        read_memory=lambda: 500,
        read_disk_free=lambda path: 40_000_000,
        total=1000,
        trim=lambda: None,
    )
    resources.check()
    watch = LoopWatch()
    for lag in (0.001, 0.002, 0.3):
        watch.lag.add(lag)
    return SimpleNamespace(
        broker=broker,
        resources=resources,
        spid="s1",
        cluster_config=None,
        logins=SimpleNamespace(checks=3, refused=2),
        store=SimpleNamespace(corrupt=0),
        counts=lambda: {
            "connections": 2,
            "channels": 3,
            "consumers": 0,
            "queues": 1,
            "exchanges": 7,
            "bindings": 0,
        },
        cluster_summary=lambda: {"role": "standalone", "root": None, "peers_active": 0},
        loopwatch=watch,
        cluster=None,
        bridge_status=lambda: [
            {
                "vhost": "/",
                "name": "to-dc2",
                "state": "terminated",
                "forwarded": 12,
                "acknowledged": 10,
                "in_flight": 2,
            }
        ],
    )


def scrape(server) -> dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(server))
    text = generate_latest(registry).decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_collector_reads_the_model():
    server = fake_server()
    m = scrape(server)
    assert m["rabbitmq_connections"] == [({}, 2.0)]
    assert m["rabbitmq_global_messages_received_total"] == [({}, 7.0)]
    assert m["rabbitmq_queue_messages_ready"] == [({"vhost": "/", "queue": "jobs"}, 1.0)]
    assert m["rookery_exchange_messages_dropped_total"] == [
        ({"vhost": "/", "exchange": "drop"}, 0.0)
    ]
    assert m["rookery_login_refused_total"] == [({}, 2.0)]
    assert m["rabbitmq_process_resident_memory_bytes"] == [({}, 500.0)]
    assert m["rabbitmq_resident_memory_limit_bytes"] == [({}, 400.0)]  # 0.4 of 1000
    assert m["rabbitmq_alarms_memory_used_watermark"] == [({}, 1.0)]
    assert m["rabbitmq_disk_space_available_bytes"] == [({}, 40e6)]
    assert m["rabbitmq_disk_space_available_limit_bytes"] == [({}, 50e6)]
    assert m["rabbitmq_alarms_free_disk_space_watermark"] == [({}, 1.0)]
    server.broker.vhosts["/"].queues["jobs"].push(Message.build("", "jobs", b"y"))
    assert scrape(server)["rabbitmq_queue_messages_ready"][0][1] == 2.0  # read at scrape


def test_dashboard_uses_only_exported_names():
    exported = set(scrape(fake_server()))
    dashboard = json.loads(DASHBOARD.read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b(?:rabbitmq|rookery)_[a-z_]+", target["expr"])
    }
    assert used, "the dashboard queries nothing"
    assert used <= exported, used - exported


def test_dead_lettering_is_counted_per_reason_and_strategy():
    server = fake_server()
    vhost = server.broker.vhosts["/"]
    vhost.declare_queue("dead", connection_id=1)
    args = {"x-max-length": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"}
    bounded = vhost.declare_queue("bounded", connection_id=1, arguments=args)[0]
    for body in (b"1", b"2", b"3"):
        bounded.push(Message.build("", "bounded", body))  # 1 and 2 go: maxlen
    got = vhost.queues["jobs"].take()  # no DLX: a rejection is dropped
    assert got is not None
    vhost.queues["jobs"].reject([got[0]])
    m = scrape(server)
    strategies = {
        (labels["dead_letter_strategy"], value)
        for labels, value in m["rabbitmq_global_messages_dead_lettered_maxlen_total"]
    }
    assert strategies == {("at_most_once", 2.0), ("disabled", 0.0)}
    assert ({"queue_type": "rabbit_classic_queue", "dead_letter_strategy": "disabled"}, 1.0) in m[
        "rabbitmq_global_messages_dead_lettered_rejected_total"
    ]
    assert ({"vhost": "/", "queue": "bounded"}, 2.0) in m[
        "rookery_queue_messages_dead_lettered_total"
    ]
    assert ({"vhost": "/", "queue": "bounded"}, 0.0) in m["rookery_queue_messages_expired_total"]


def test_the_event_loop_lag_is_exported_as_quantiles() -> None:
    families = {m.name: m for m in BrokerCollector(fake_server()).collect()}  # type: ignore[arg-type]
    lag = {
        s.labels["quantile"]: s.value for s in families["rookery_event_loop_lag_seconds"].samples
    }
    assert lag["1"] == 0.3 and lag["0.5"] == 0.002


def test_a_held_loop_is_sampled_where_it_is_held() -> None:
    """The lag says the loop was held; the sampler says by what (the loop watch
    logs it with the lag), so a stall in production explains itself."""
    import time

    from brokerd.server.loopwatch import StallSampler

    sampler = StallSampler(period=0.02)
    sampler.start()
    try:
        sampler.beat()

        def busy_in_plane_code() -> None:
            end = time.monotonic() + 1.0
            while time.monotonic() < end:
                pass

        busy_in_plane_code()
        held = sampler.take()
    finally:
        sampler.stop()
    assert held, "nothing sampled while the loop thread was held"
    assert "busy_in_plane_code" in held[0][0]
    sampler.beat()
    assert sampler.take() == []  # taken: the next stall starts afresh


def test_each_bridge_exports_its_state_its_counts_and_what_is_in_flight() -> None:
    families = scrape(fake_server())
    states = {labels["state"]: value for labels, value in families["rookery_bridge_state"]}
    assert states == {"starting": 0, "running": 0, "blocked": 0, "terminated": 1}
    assert families["rookery_bridge_forwarded_total"] == [({"vhost": "/", "name": "to-dc2"}, 12)]
    assert [v for _l, v in families["rookery_bridge_acknowledged_total"]] == [10]
    assert [v for _l, v in families["rookery_bridge_in_flight"]] == [2]
