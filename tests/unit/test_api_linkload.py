"""The link benchmark's fake broker speaks the protocol the console ingests."""

from __future__ import annotations

import random

import pytest

from clusterapi import ingest
from clusterapi.bench.linkload import FakeBroker, parse_args
from clusterapi.bench.meters import percentile
from clusterapi.models import BindingSnapshot, QueueSnapshot

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer")]


def test_full_then_deltas_are_ingested_as_the_fake_broker_holds_them() -> None:
    fake = FakeBroker(0, queues=50, churn=0.2, rate=1.0, rng=random.Random(7))
    broker, _ = ingest.register_hello(ingest.parse_hello(fake.hello()))
    link = ingest.LinkState(broker.pk, broker.name, broker.broker_type)

    first = fake.status([], fake.spid)
    assert first["full"] and len(first["queues"]) == 50
    assert not ingest.apply_status(link, first).resync

    for _ in range(25):  # long enough for queues to be replaced (remove + upsert)
        fake.tick(1.0)
        delta = fake.status([], fake.spid)
        assert delta["full"] is False
        assert not ingest.apply_status(link, delta).resync

    assert fake.created > 50, "no queue was replaced: the delta removal path went unused"
    stored = dict(QueueSnapshot.objects.filter(broker=broker).values_list("name", "messages"))
    assert stored == {name: q.messages for name, q in fake.state.items()}
    bound = set(BindingSnapshot.objects.filter(broker=broker).values_list("destination", flat=True))
    assert bound == set(fake.state)


def test_commands_are_acked() -> None:
    fake = FakeBroker(1, queues=1, churn=0.1, rate=1.0, rng=random.Random(1))
    ack = fake.answer({"type": "command", "id": "c1", "command": "state.dump", "args": {}})
    assert ack["ok"] and "1 queues" in ack["result"]["dump"] and ack["id"] == "c1"
    refused = fake.answer({"type": "command", "id": "c2", "command": "nope"})
    assert refused["ok"] is False and "nope" in refused["error"]


def test_arguments_and_percentiles() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--console", "ws://x/ws/brokers/", "--token", "t", "--rate", "0"])
    args = parse_args(["--console", "ws://x/ws/brokers/", "--token", "t"])
    assert (args.brokers, args.queues, args.rate) == (10, 1000, 1.0)
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0
    assert percentile(list(range(101)), 95) == 95
