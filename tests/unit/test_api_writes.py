"""The REST API's writes: commands and configuration versions go through the services.

In process with a test database; transactions are rolled back, so the Celery
deliveries scheduled on commit never run (the real-stack tests cover delivery).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from clusterapi.models import AuditEntry, Broker, Command, ConfigApplication
from clusterapi.roles import OPERATORS_GROUP

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer")]


@pytest.fixture
def api() -> APIClient:
    user = User.objects.create_user("op", password="pw-op-1")
    user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def brokers() -> list[Broker]:
    return [
        Broker.objects.create(
            name=f"127.0.0.1:580{i}",
            broker_type="primary",
            state="up",
            connected=True,
            last_seen=timezone.now(),
        )
        for i in range(1, 4)
    ]


def test_disable_root_creates_an_audited_command(api: APIClient, brokers: list[Broker]) -> None:
    response = api.post("/api/v1/brokers/127.0.0.1:5801/root/", {"enabled": False}, format="json")
    assert response.status_code == 202
    body = response.json()
    assert (body["name"], body["state"], body["broker"]) == (
        "root.disable",
        "pending",
        "127.0.0.1:5801",
    )
    assert body["created_by"] == "op" and body["result"] is None
    command = Command.objects.get(pk=body["id"])
    assert command.broker == brokers[0]
    assert AuditEntry.objects.filter(
        action="command.root.disable", username="op", target="127.0.0.1:5801"
    ).exists()
    enabled = api.post(f"/api/v1/brokers/{brokers[1].pk}/root/", {"enabled": True}, format="json")
    assert enabled.status_code == 202 and enabled.json()["name"] == "root.enable"
    listed = api.get("/api/v1/commands/?name=root.disable").json()["results"]
    assert [c["id"] for c in listed] == [body["id"]]
    assert api.get(f"/api/v1/commands/{body['id']}/").json()["args"] == {}


@pytest.mark.parametrize("body", [{}, {"enabled": "maybe"}, {"enabled": None}, [1, 2]])
def test_root_needs_a_boolean(api: APIClient, brokers: list[Broker], body: Any) -> None:
    response = api.post("/api/v1/brokers/127.0.0.1:5801/root/", body, format="json")
    assert response.status_code == 400
    assert "enabled" in response.json()["error"] or "dict" in response.json()["error"]
    assert Command.objects.count() == 0


def test_dump_and_unknown_broker(api: APIClient, brokers: list[Broker]) -> None:
    response = api.post("/api/v1/brokers/127.0.0.1:5803/dump/", {}, format="json")
    assert response.status_code == 202 and response.json()["name"] == "state.dump"
    missing = api.post("/api/v1/brokers/10.9.9.9:1/dump/", {}, format="json")
    assert missing.status_code == 404 and missing.json()["error"]


def test_new_configuration_version_is_pushed_to_every_broker(
    api: APIClient, brokers: list[Broker]
) -> None:
    document = {"heartbeat": {"interval": 0.5, "timeout": 2.0}, "vhosts": ["/"]}
    response = api.post(
        "/api/v1/configs/", {"document": document, "comment": "faster"}, format="json"
    )
    assert response.status_code == 201, response.json()
    version = response.json()
    assert version["number"] == 1 and len(version["checksum"]) == 16
    assert version["comment"] == "faster" and version["created_by"] == "op"
    assert version["converged"] is False
    assert [(r["broker"], r["state"]) for r in version["convergence"]] == [
        (b.name, "pending") for b in brokers
    ]
    assert Command.objects.filter(name="config.apply").count() == 3

    ConfigApplication.objects.filter(version__number=1).update(
        state="acked", checksum=version["checksum"]
    )
    current = api.get("/api/v1/configs/current/").json()
    assert current["number"] == 1 and current["converged"] is True
    assert api.get("/api/v1/configs/1/").json()["checksum"] == version["checksum"]
    assert api.get("/api/v1/configs/").json()["count"] == 1
    assert api.get("/api/v1/cluster/").json()["config_version"] == 1


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"document": {"heartbeat": {"interval": -1}}}, "heartbeat"),
        ({"document": {"limits": {"frame_max": "big"}}}, "limits"),
        ({"document": {"no_such_part": 1}}, "no_such_part"),
        ({"document": "text"}, "document"),
        ({}, "document"),
    ],
)
def test_bad_configuration_is_a_400_naming_the_key(
    api: APIClient, brokers: list[Broker], body: dict, named: str
) -> None:
    response = api.post("/api/v1/configs/", body, format="json")
    assert response.status_code == 400, response.json()
    assert named in response.json()["error"]
    assert Command.objects.count() == 0
