"""A planned stop versus a crash, on the console side (issue 25).

``stopping`` (sent by brokerd on SIGTERM before it closes the link) marks the broker
stopped with an info event, and its link closing then raises nothing; a link that
closes without it marks the broker down at once, with the ``broker.down`` alarm.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections

from clusterapi import cluster, consumers, ingest
from clusterapi.ingest import LinkProtocolError, LinkState
from clusterapi.models import Alarm, AuditEntry, Broker, BrokerEvent

NAME = "10.0.0.1:5701"
TOKEN = "s3cret-broker-token"


@pytest.fixture(autouse=True)
def in_memory_layer(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CONSOLE_BROKER_TOKEN = TOKEN


def hello(spid: str = "spid-1") -> dict[str, Any]:
    return {
        "v": 1,
        "type": "hello",
        "spid": spid,
        "name": NAME,
        "address": "10.0.0.1:5672",
        "broker_type": "primary",
        "version": "0.1.0",
        "start_time": time.time(),
        "cluster": "test",
        "checksum": None,
        "heartbeat_interval": 1.0,
        "config_version": None,
        "config_checksum": None,
    }


def status(seq: int) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "status",
        "seq": seq,
        "time": time.time(),
        "full": True,
        "view": {"is_root": False, "ready": True, "root_enabled": True},
        "counts": {},
        "totals": {},
        "rates": {},
        "queues": [],
    }


def linked(spid: str = "spid-1", channel: str = "chan-1") -> LinkState:
    broker, _ = ingest.register_hello(ingest.parse_hello(hello(spid)), channel)
    return LinkState(broker.pk, broker.name, broker.broker_type, spid=broker.spid)


def down_alarms() -> list[Alarm]:
    return list(Alarm.objects.filter(kind="broker.down", active=True))


@pytest.mark.django_db
def test_a_planned_stop_is_an_info_event_and_no_down_alarm() -> None:
    link = linked()
    assert cluster.state()["brokers_up"] == 1
    assert ingest.record_stopping(link, "spid-1", "SIGTERM")
    broker = Broker.objects.get()
    assert broker.state == "stopped" and not broker.ready
    assert cluster.state()["brokers_up"] == 0  # counts follow at once
    event = BrokerEvent.objects.get()
    assert (event.kind, event.level) == ("stopping", "info")
    assert "SIGTERM" in event.message and event.details["spid"] == "spid-1"
    assert AuditEntry.objects.filter(action="broker.stopping", target=NAME).exists()

    ingest.apply_status(link, status(0))  # one last status on its way out
    assert Broker.objects.get().state == "stopped"
    assert ingest.link_closed(link, "chan-1", 1001) == "stopped"
    broker = Broker.objects.get()
    assert broker.state == "stopped" and not broker.connected
    assert down_alarms() == []
    assert BrokerEvent.objects.count() == 1


@pytest.mark.django_db
def test_a_link_closing_without_stopping_is_down_at_once_with_the_alarm() -> None:
    link = linked()
    assert ingest.link_closed(link, "chan-1", 1006) == "down"
    broker = Broker.objects.get()
    assert broker.state == "down" and not broker.connected and not broker.ready
    [alarm] = down_alarms()
    assert "without a planned stop (code 1006)" in alarm.message
    event = BrokerEvent.objects.get()
    assert (event.kind, event.level) == ("link_lost", "warning")
    assert cluster.state()["brokers_up"] == 0
    # back: the alarm clears, the restart is a warning (it was not planned)
    linked("spid-2", "chan-2")
    assert down_alarms() == []
    restart = BrokerEvent.objects.get(kind="restart")
    assert restart.level == "warning" and restart.details["planned"] is False


@pytest.mark.django_db
def test_after_a_planned_stop_the_restart_is_info() -> None:
    link = linked()
    ingest.record_stopping(link, "spid-1", "SIGTERM")
    ingest.link_closed(link, "chan-1", 1001)
    broker, came_back = ingest.register_hello(ingest.parse_hello(hello("spid-2")), "chan-2")
    assert came_back and broker.state == "up"
    restart = BrokerEvent.objects.get(kind="restart")
    assert restart.level == "info" and restart.details["planned"] is True
    assert "after a planned stop" in restart.message


@pytest.mark.django_db
def test_what_a_closing_link_leaves_alone() -> None:
    old = linked("spid-1", "chan-1")
    linked("spid-1", "chan-2")  # reconnected before the old link's close arrived
    assert ingest.link_closed(old, "chan-1", 1006) == ""
    assert Broker.objects.get().state == "up" and down_alarms() == []
    current = LinkState(old.broker_id, old.name, spid="spid-1")
    # the console closed it (malformed message): the broker reconnects, it is not down
    assert ingest.link_closed(current, "chan-2", 4400, crash=False) == ""
    assert Broker.objects.get().state == "up" and down_alarms() == []


@pytest.mark.django_db
def test_stopping_for_another_run_is_ignored() -> None:
    link = linked()
    assert not ingest.record_stopping(link, "spid-old", "SIGTERM")
    assert not link.stopping and Broker.objects.get().state == "up"
    assert ingest.link_closed(link, "chan-1", 1006) == "down"


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        ({"v": 1, "type": "stopping"}, "stopping.spid is missing"),
        ({"v": 1, "type": "stopping", "spid": 7}, "stopping.spid has the wrong type"),
        ({"v": 1, "type": "stopping", "spid": ""}, "1 to 64"),
        ({"v": 1, "type": "stopping", "spid": "s", "reason": 3}, "stopping.reason"),
    ],
)
def test_malformed_stopping_messages(msg: dict[str, Any], error: str) -> None:
    with pytest.raises(LinkProtocolError, match=error):
        ingest.parse_stopping(msg)
    assert ingest.parse_stopping({"spid": "s"}) == ("s", "")


# -- through the consumer ----------------------------------------------------------------------


@pytest.fixture
async def release_the_database_thread() -> Any:
    """Leave no open connection in Channels' database thread (as the link consumer's
    integration tests do)."""
    yield
    await database_sync_to_async(_drop_thread_connections)()


def _drop_thread_connections() -> None:
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            conn.connection.close()
            conn.connection = None


async def open_link(spid: str = "spid-1") -> WebsocketCommunicator:
    from console.asgi import application

    headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {TOKEN}".encode())]
    link = WebsocketCommunicator(application, "/ws/brokers/", headers=headers)
    assert (await link.connect())[0]
    await link.send_json_to(hello(spid))
    assert (await link.receive_json_from())["type"] == "welcome"
    return link


@pytest.mark.django_db(transaction=True)
async def test_the_consumer_sigterm_then_close(
    release_the_database_thread: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumers, "_last_refusal_recorded", 0.0)
    link = await open_link()
    await link.send_json_to({"v": 1, "type": "stopping", "spid": "spid-1", "reason": "SIGTERM"})
    await link.receive_nothing(timeout=0.2)
    broker = await database_sync_to_async(Broker.objects.get)(name=NAME)
    assert broker.state == "stopped"
    await link.disconnect(code=1001)
    assert await database_sync_to_async(down_alarms)() == []
    broker = await database_sync_to_async(Broker.objects.get)(name=NAME)
    assert broker.state == "stopped" and not broker.connected

    again = await open_link("spid-2")  # a crash this time: no stopping
    await again.disconnect(code=1006)
    [alarm] = await database_sync_to_async(down_alarms)()
    assert alarm.broker_id == broker.pk
    broker = await database_sync_to_async(Broker.objects.get)(name=NAME)
    assert broker.state == "down"


@pytest.mark.django_db(transaction=True)
async def test_the_consumer_closing_a_malformed_link_is_no_crash(
    release_the_database_thread: Any,
) -> None:
    link = await open_link()
    await link.send_json_to({"v": 1, "type": "stopping"})  # no spid: malformed
    closed = await link.receive_output(timeout=1)
    assert closed["type"] == "websocket.close" and closed["code"] == 4400
    await link.disconnect(code=4400)  # what the server reports once the socket is gone
    broker = await database_sync_to_async(Broker.objects.get)(name=NAME)
    assert broker.state == "up" and not broker.connected
    assert await database_sync_to_async(down_alarms)() == []


@pytest.mark.django_db
def test_events_in_the_api(viewer: Any) -> None:
    from rest_framework.test import APIClient

    link = linked()
    ingest.record_stopping(link, "spid-1", "SIGTERM")
    client = APIClient()
    client.force_authenticate(viewer)
    body = client.get(f"/api/v1/events/?broker={NAME}&level=info").json()
    assert [(e["broker"], e["kind"], e["level"]) for e in body["results"]] == [
        (NAME, "stopping", "info")
    ]
    assert client.get("/api/v1/events/?level=warning").json()["count"] == 0
    assert client.get("/api/v1/events/?level=loud").status_code == 400
