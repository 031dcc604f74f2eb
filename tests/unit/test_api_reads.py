"""The REST API's reads, roles and error shape, in process against a test database."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from clusterapi.models import (
    Alarm,
    BindingSnapshot,
    Broker,
    ExchangeSnapshot,
    HeartbeatSample,
    QueueSnapshot,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer")]


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def cluster() -> list[Broker]:
    """Three brokers: a ready root, a follower, and one that went down."""
    now = timezone.now()
    brokers = [
        Broker.objects.create(
            name=f"127.0.0.1:570{i}",
            spid=f"spid-{i}",
            address=f"127.0.0.1:570{i}",
            broker_type="primary",
            state=state,
            connected=state == "up",
            last_seen=now - timedelta(seconds=i),
            is_root=i == 1,
            ready=state == "up",
            quorum="3/3" if state == "up" else "",
        )
        for i, state in ((1, "up"), (2, "up"), (3, "down"))
    ]
    for broker in brokers:
        for step in range(3):
            HeartbeatSample.objects.create(
                broker=broker, time=now - timedelta(seconds=10 * step), is_root=broker.is_root
            )
    for i, broker in enumerate(brokers[:2]):
        QueueSnapshot.objects.create(
            broker=broker, vhost="/", name=f"orders-{i}", messages=5 * i, updated_at=now
        )
        QueueSnapshot.objects.create(  # mastered on the root, a proxy on the other
            broker=broker,
            vhost="/",
            name="shared-jobs",
            shared=True,
            master=broker.is_root,
            updated_at=now,
        )
        ExchangeSnapshot.objects.create(
            broker=broker, vhost="/", name="amq.topic", type="topic", shared=True, updated_at=now
        )
        BindingSnapshot.objects.create(
            broker=broker,
            vhost="/",
            source="amq.topic",
            destination=f"orders-{i}",
            destination_type="queue",
            routing_key="orders.#",
            updated_at=now,
        )
    Alarm.objects.create(
        broker=brokers[2], kind="broker.down", message="no heartbeat", raised_at=now
    )
    return brokers


def test_cluster_state_names_the_root(viewer: User, cluster: list[Broker]) -> None:
    body = client_for(viewer).get("/api/v1/cluster/").json()
    assert body["root"] == {"name": "127.0.0.1:5701", "spid": "spid-1"}
    assert body["ready"] is True
    assert (body["brokers_up"], body["brokers_total"], body["alarms_active"]) == (2, 3, 1)


def test_brokers_list_filters_and_lookup_by_name_or_id(viewer: User, cluster: list[Broker]) -> None:
    api = client_for(viewer)
    assert api.get("/api/v1/brokers/").json()["count"] == 3
    assert [b["name"] for b in api.get("/api/v1/brokers/?is_root=true").json()["results"]] == [
        "127.0.0.1:5701"
    ]
    assert api.get("/api/v1/brokers/?state=down").json()["count"] == 1
    assert api.get("/api/v1/brokers/?type=secondary").json()["count"] == 0
    by_name = api.get("/api/v1/brokers/127.0.0.1:5702/").json()
    assert by_name["spid"] == "spid-2" and by_name["heartbeat_age"] >= 0
    assert api.get(f"/api/v1/brokers/{cluster[0].pk}/").json()["name"] == "127.0.0.1:5701"


def test_cluster_wide_queues_exchanges_bindings(viewer: User, cluster: list[Broker]) -> None:
    api = client_for(viewer)
    assert api.get("/api/v1/queues/").json()["count"] == 3  # the shared queue once
    shared = api.get("/api/v1/queues/?shared=true").json()["results"]
    assert [(q["broker"], q["master"], q["type"]) for q in shared] == [
        ("127.0.0.1:5701", True, "replicated")
    ]
    assert api.get("/api/v1/queues/?name_contains=ORDERS").json()["count"] == 2
    on_two = api.get("/api/v1/queues/?broker=127.0.0.1:5702&name=orders-1").json()["results"]
    assert [(q["name"], q["messages"]) for q in on_two] == [("orders-1", 5)]
    assert api.get(f"/api/v1/queues/?broker={cluster[0].pk}").json()["count"] == 2
    assert api.get("/api/v1/queues/?broker=127.0.0.1:5702").json()["count"] == 1
    [topic] = api.get("/api/v1/exchanges/?type=topic").json()["results"]
    assert (topic["shared"], topic["servers"], topic["broker"]) == (True, 2, "127.0.0.1:5701")
    rows = api.get("/api/v1/bindings/?destination=orders-0").json()["results"]
    assert [(b["source"], b["routing_key"]) for b in rows] == [("amq.topic", "orders.#")]


def test_heartbeat_history_filters_by_broker_and_time(viewer: User, cluster: list[Broker]) -> None:
    api = client_for(viewer)
    assert api.get("/api/v1/heartbeats/?broker=127.0.0.1:5701").json()["count"] == 3
    since = (timezone.now() - timedelta(seconds=15)).isoformat()
    recent = api.get("/api/v1/heartbeats/", {"broker": "127.0.0.1:5701", "since": since})
    assert recent.json()["count"] == 2
    times = [s["time"] for s in recent.json()["results"]]
    assert times == sorted(times, reverse=True)


def test_alarms_and_endpoints(viewer: User, cluster: list[Broker]) -> None:
    api = client_for(viewer)
    active = api.get("/api/v1/alarms/?active=true").json()["results"]
    assert [(a["kind"], a["broker"]) for a in active] == [("broker.down", "127.0.0.1:5703")]
    assert api.get("/api/v1/alarms/?active=false").json()["count"] == 0
    endpoints = api.get("/api/v1/endpoints/").json()
    assert sorted(e["url"] for e in endpoints) == [
        "amqp://127.0.0.1:5701/%2F",
        "amqp://127.0.0.1:5702/%2F",
    ]
    assert [e["is_root"] for e in endpoints if e["broker"] == "127.0.0.1:5701"] == [True]


def test_anonymous_and_bad_tokens_get_401_json() -> None:
    anonymous = APIClient()
    response = anonymous.get("/api/v1/brokers/")
    assert response.status_code == 401
    assert response.json()["error"] == response.json()["detail"]["detail"]
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token nope")
    assert bad.get("/api/v1/cluster/").status_code == 401


def test_token_endpoint(viewer: User) -> None:
    api = APIClient()
    ok = api.post(
        "/api/v1/auth/token/", {"username": "viewer", "password": "pw-viewer-1"}, format="json"
    )
    assert ok.status_code == 200 and ok.json()["token"]
    bad = api.post("/api/v1/auth/token/", {"username": "viewer", "password": "x"}, format="json")
    assert bad.status_code == 401 and "credentials" in bad.json()["error"]


def test_read_only_users_get_403_on_every_write(viewer: User, cluster: list[Broker]) -> None:
    api = client_for(viewer)
    for path, body in (
        ("/api/v1/brokers/127.0.0.1:5701/root/", {"enabled": False}),
        ("/api/v1/brokers/127.0.0.1:5701/dump/", {}),
        ("/api/v1/configs/", {"document": {}}),
    ):
        response = api.post(path, body, format="json")
        assert response.status_code == 403, path
        assert "operator" in response.json()["error"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("get", "/api/v1/brokers/nope/", 404),
        ("get", "/api/v1/no-such-thing/", 404),
        ("get", "/api/v1/heartbeats/?since=yesterday", 400),
        ("get", "/api/v1/brokers/?state=sideways", 400),
        ("get", "/api/v1/queues/?page=999", 404),
        ("get", "/api/v1/commands/not-a-uuid/", 404),
        ("get", "/api/v1/configs/current/", 404),
        ("delete", "/api/v1/brokers/1/", 405),
        ("put", "/api/v1/configs/1/", 405),
    ],
)
def test_errors_are_json_with_a_message(
    operator: User, cluster: list[Broker], method: str, path: str, status: int
) -> None:
    response = getattr(client_for(operator), method)(path)
    assert response.status_code == status
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["error"], str) and body["error"]
    assert "detail" in body


def test_a_missing_slash_is_explained(viewer: User) -> None:
    body = client_for(viewer).get("/api/v1/brokers").json()
    assert "/api/v1/brokers/" in body["error"]


def test_malformed_json_is_a_400(operator: User, cluster: list[Broker]) -> None:
    response = client_for(operator).post(
        "/api/v1/configs/", data="{not json", content_type="application/json"
    )
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]


def test_a_queue_type_is_what_its_declare_named_else_replicated_if_shared() -> None:
    def kind(shared: bool, arguments: object) -> str:
        return QueueSnapshot(shared=shared, arguments=arguments).kind

    assert kind(True, {"x-queue-type": "classic"}) == "classic"
    assert kind(True, {"x-queue-type": "quorum"}) == "quorum"
    assert kind(True, {}) == "replicated"
    assert kind(False, {}) == "classic"  # a private queue lives on its broker
    assert kind(True, ["not", "a", "table"]) == "replicated"
