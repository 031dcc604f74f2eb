"""A planned stop versus a crash, on the console side (issue 25), and the stopping
broker's queue hand-over (issue 45).

``stopping`` (sent by brokerd on SIGTERM before it closes the link) marks the broker
stopped with an info event, and its link closing then raises nothing; a link that
closes without it marks the broker down at once, with the ``broker.down`` alarm.

A stopping primary hands its replicated queues to the other primaries only while a
root can order the moves: with no root, no quorum once it abstains, or no other
primary to take them, it does not wait for moves that cannot happen (the last
primaries of a cluster being stopped waited ~6 s each).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections

from brokerd.cluster.controller import ClusterController
from clusterapi import cluster, consumers, ingest
from clusterapi.ingest import LinkProtocolError, LinkState
from clusterapi.models import Alarm, AuditEntry, Broker, BrokerEvent
from tests.support.linkmessages import hello as link_hello
from tests.unit.test_cluster_controller import CONFIG, link_from, make
from tests.unit.test_cluster_controller import status as peer_status

NAME = "10.0.0.1:5701"
TOKEN = "s3cret-broker-token"


@pytest.fixture(autouse=True)
def in_memory_layer(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.CONSOLE_BROKER_TOKEN = TOKEN


def hello(spid: str = "spid-1") -> dict[str, Any]:
    return link_hello(NAME, spid, checksum=None)


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


# -- the stopping broker's hand-over (brokerd) ---------------------------------------------


def stopping_follower(*, s3: dict[str, Any] | None = None) -> ClusterController:
    """s2 of three known primaries, following root s1 with s3 (``s3``: its status,
    None: never heard), and stepping down as a planned stop does first."""
    ctl, _clock = make("s2", 2.0)
    link_from(ctl, 11, "s1", 1.0)
    peer_status(ctl, 11, "s1", 1.0, vote="s1", is_root=True)
    if s3 is not None:
        link_from(ctl, 13, "s3", 3.0)
        peer_status(ctl, 13, "s3", 3.0, **{"vote": "s1", **s3})
    ctl.step_down()
    return ctl


def owning(ctl: ClusterController, monkeypatch: pytest.MonkeyPatch, *names: str) -> list[str]:
    """``ctl`` owns replicated queues ``names``; returns the list the moves asked for
    get appended to (none are ordered: no root answers in these tests)."""
    asked: list[str] = []
    queues = [type("Q", (), {"name": n, "local": True, "moving": None}) for n in names]
    monkeypatch.setattr(ctl.queues, "owned_replicated", lambda: queues)

    def evacuate(_refused: Any) -> list[dict[str, str]]:
        asked.extend(names)
        return []

    monkeypatch.setattr(ctl.moves, "evacuate", evacuate)
    return asked


def test_a_healthy_cluster_hands_the_queues_over() -> None:
    ctl = stopping_follower(s3={})
    assert ctl.current_root == "s1" and ctl.stopping
    assert ctl.why_queues_stay() is None  # s1 and s3 keep a quorum of 3


@pytest.mark.parametrize(
    ("s3", "why"),
    [
        (None, "no quorum (1 of 3 known primaries stay)"),  # gone before: Ctrl-C's order
        ({"stopping": True, "vote": None}, "no quorum (1 of 3 known primaries stay)"),
    ],
)
def test_no_quorum_once_this_server_abstains(s3: dict[str, Any] | None, why: str) -> None:
    # the root still says it is root (its last status), but it cannot order anything
    ctl = stopping_follower(s3=s3)
    assert ctl.current_root == "s1"
    assert ctl.why_queues_stay() == why


def test_no_root_and_no_taker() -> None:
    ctl, _ = make("s2", 2.0)
    ctl.step_down()
    assert ctl.why_queues_stay() == "no root"
    # a quorum and a root, but every other primary is fenced: nowhere to go
    ctl = stopping_follower(s3={})
    ctl.queues.is_fenced = lambda spid: True  # type: ignore[method-assign]
    assert ctl.why_queues_stay() == "no other live primary to take them"


async def test_without_quorum_the_stop_does_not_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ctl = stopping_follower(s3=None)
    asked = owning(ctl, monkeypatch, "orders")
    with caplog.at_level("WARNING", "brokerd.cluster"):
        await asyncio.wait_for(ctl.move_queues_away(), 1)
    assert asked == []  # no move asked of a root that cannot order it
    assert (
        "stopping: no quorum (1 of 3 known primaries stay), 1 queue stays here "
        "(its copies elsewhere, or its journal, keep it)"
    ) in caplog.text
    assert "moved to other primaries" not in caplog.text

    healthy = stopping_follower(s3={})
    asked = owning(healthy, monkeypatch, "orders", "invoices")
    await asyncio.wait_for(healthy.move_queues_away(), 1)
    assert asked == ["orders", "invoices"]  # the planned hand-over, as before


async def test_a_hand_over_under_way_ends_once_quorum_goes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ctl = stopping_follower(s3={})
    owning(ctl, monkeypatch, "orders")
    queue = type("Q", (), {"name": "orders", "local": True, "moving": "s3", "epoch": 4})()
    monkeypatch.setattr(ctl.moves, "evacuate", lambda _refused: [{"queue": "orders"}])
    monkeypatch.setattr(ctl.queues, "shared_queue", lambda name: queue)
    with caplog.at_level("WARNING", "brokerd.cluster"):
        # the fake clock stands still: only the lost quorum can end the wait
        stop = asyncio.create_task(ctl.move_queues_away(limit=CONFIG.heartbeat_timeout))
        await asyncio.sleep(0.05)
        assert not stop.done()  # waiting for the move, as in a healthy cluster
        peer_status(ctl, 13, "s3", 3.0, vote=None, stopping=True)  # s3 stops too
        await asyncio.wait_for(stop, 1)
    assert "stopping: 0 of 1 queues moved to other primaries" in caplog.text
    assert "still under way: orders" in caplog.text
    assert "stopping: no quorum (1 of 3 known primaries stay), 1 queue stays here" in caplog.text


async def test_a_stop_waits_for_what_it_relayed_so_far_and_for_no_later_forward() -> None:
    """Forwards taken for a queue being handed over are relayed to its new owner; the
    stopping server keeps its links until those are settled, or the peers would send
    them again, flagged, beside the relayed copy (a CI run caught such a duplicate).
    Later forwards, its own clients' (they may never pause), are not waited for."""
    ctl, clock = make()
    out = ctl.queues.transport.out("s2")
    out.up = True
    out.unsettled[5] = (None, [], None, False)  # relayed to the queue's new owner
    stop = asyncio.create_task(ctl.settle_relays(limit=1.0))
    await asyncio.sleep(0.03)
    assert not stop.done()  # the relay is not settled yet
    out.unsettled[9] = (None, [], None, False)  # a later forward
    del out.unsettled[5]  # the new owner settled the relay
    await asyncio.wait_for(stop, 0.5)
    # bounded: a new owner that never settles holds the stop no longer than the limit
    stop = asyncio.create_task(ctl.settle_relays(limit=1.0))
    await asyncio.sleep(0.03)
    assert not stop.done()
    clock.now += 1.5
    await asyncio.wait_for(stop, 0.5)
