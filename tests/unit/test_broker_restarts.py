"""A broker restarting (issue 25): one row per server, the new spid shown, the restart
recorded with both spids and the downtime; peers listed once per server."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from clusterapi import ingest
from clusterapi.models import Broker, BrokerEvent
from console.dashboard.broker_page import peer_links
from tests.support.linkmessages import hello as link_hello

pytestmark = pytest.mark.django_db

NAME = "10.0.0.1:5701"


@pytest.fixture(autouse=True)
def in_memory_layer(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def hello(spid: str, start: float | None = None, name: str = NAME) -> ingest.Hello:
    extra = {} if start is None else {"start_time": start}
    return ingest.parse_hello(link_hello(name, spid, **extra))


def test_a_new_spid_is_a_restart_of_the_same_broker() -> None:
    first, _ = ingest.register_hello(hello("spid-1"), "chan-1")
    assert not BrokerEvent.objects.exists()  # a first hello is no restart
    ingest.register_hello(hello("spid-1"), "chan-2")  # a reconnect of the same run
    assert not BrokerEvent.objects.exists()

    last_seen = timezone.now() - dt.timedelta(seconds=30)
    Broker.objects.filter(pk=first.pk).update(last_seen=last_seen, state="down")
    started = (last_seen + dt.timedelta(seconds=12.5)).timestamp()
    again, came_back = ingest.register_hello(hello("spid-2", started), "chan-3")
    assert came_back and again.pk == first.pk and Broker.objects.count() == 1
    assert again.spid == "spid-2"
    event = BrokerEvent.objects.get()
    assert event.kind == "restart" and event.broker_id == first.pk
    assert event.level == "warning"  # no planned stop was announced
    assert event.details["old_spid"] == "spid-1" and event.details["new_spid"] == "spid-2"
    assert event.details["downtime_seconds"] == pytest.approx(12.5, abs=0.01)
    assert "spid-1 -> spid-2" in event.message and "down 12.5 s" in event.message


def test_a_start_before_the_last_message_is_no_negative_downtime() -> None:
    ingest.register_hello(hello("spid-1"), "chan-1")
    ingest.register_hello(hello("spid-2", time.time() - 3600), "chan-2")
    assert BrokerEvent.objects.get().details["downtime_seconds"] == 0.0


def test_the_broker_page_shows_the_new_spid_and_the_restart(operator: User) -> None:
    ingest.register_hello(hello("spid-1"), "chan-1")
    ingest.register_hello(hello("spid-2"), "chan-2")
    client = Client()
    client.force_login(operator)
    html = client.get(f"/brokers/{NAME}/").content.decode()
    assert "<code>spid-2</code>" in html
    assert 'id="broker-events"' in html and 'data-event="restart"' in html
    assert "spid-1 -&gt; spid-2" in html


def test_peers_are_listed_once_per_server_the_newest_run_winning() -> None:
    Broker.objects.create(name="10.0.0.2:5701", spid="new-b", state="up")
    broker = Broker.objects.create(
        name=NAME,
        spid="a",
        state="up",
        view={
            "peers": [
                {"spid": "old-b", "address": "10.0.0.2:5701", "active": False, "type": "primary"},
                {"spid": "c", "address": "10.0.0.3:5701", "active": True, "type": "primary"},
                {"spid": "new-b", "address": "10.0.0.2:5701", "active": True, "type": "primary"},
            ]
        },
    )
    peers = peer_links(broker)
    assert [p["spid"] for p in peers] == ["c", "new-b"]
    assert peers[1]["name"] == "10.0.0.2:5701"
    # the old spid listed after the new one does not win either
    broker.view["peers"].reverse()
    assert sorted(p["spid"] for p in peer_links(broker)) == ["c", "new-b"]
