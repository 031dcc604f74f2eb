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

from clusterapi.models import Alarm, AuditEntry, Broker, Command
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
    Broker.objects.filter(pk=brokers[1].pk).update(root_enabled=False)
    enabled = api.post(f"/api/v1/brokers/{brokers[1].pk}/root/", {"enabled": True}, format="json")
    assert enabled.status_code == 202 and enabled.json()["name"] == "root.enable"
    listed = api.get("/api/v1/commands/?name=root.disable").json()["results"]
    assert [c["id"] for c in listed] == [body["id"]]
    assert api.get(f"/api/v1/commands/{body['id']}/").json()["args"] == {}


@pytest.mark.parametrize(
    ("changes", "enabled", "reason"),
    [
        ({"broker_type": "secondary"}, True, "secondaries are never root"),
        ({"state": "down"}, False, "is down"),
        ({}, True, "root is enabled"),
    ],
)
def test_what_a_broker_cannot_do_is_a_409_with_the_reason(
    api: APIClient, brokers: list[Broker], changes: dict, enabled: bool, reason: str
) -> None:
    Broker.objects.filter(pk=brokers[2].pk).update(**changes)
    response = api.post(
        f"/api/v1/brokers/{brokers[2].pk}/root/", {"enabled": enabled}, format="json"
    )
    assert response.status_code == 409
    assert reason in response.json()["error"]
    assert Command.objects.count() == 0


@pytest.mark.parametrize(
    "body", [{}, {"enabled": "maybe"}, {"enabled": None}, {"enabled": 0}, [1, 2]]
)
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


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/brokers/127.0.0.1:5801/dump/", {"now": True}, "now"),
        ("/api/v1/brokers/127.0.0.1:5801/root/", {"enabled": True, "force": 1}, "force"),
        ("/api/v1/configs/", {"document": {}, "coment": "typo"}, "coment"),
        ("/api/v1/configs/", {"document": {}, "comment": 0}, "comment"),
        ("/api/v1/reports/", {"period_start": "2026-01-01T00:00:00Z"}, "period_start"),
    ],
)
def test_unknown_or_mistyped_body_fields_are_a_400(
    api: APIClient, brokers: list[Broker], path: str, body: dict, field: str
) -> None:
    response = api.post(path, body, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]
    assert Command.objects.count() == 0


def test_a_configuration_is_saved_pushed_and_converges_by_what_brokers_report(
    api: APIClient, brokers: list[Broker]
) -> None:
    document = {"heartbeat": {"interval": 0.5, "timeout": 2.0}, "vhosts": ["/"]}
    response = api.post(
        "/api/v1/configs/", {"document": document, "comment": "faster"}, format="json"
    )
    assert response.status_code == 201, response.json()
    version = response.json()
    assert version["outcome"] == "created" and version["current"] is True
    assert version["number"] == 1 and len(version["checksum"]) == 16
    assert version["comment"] == "faster" and version["created_by"] == "op"
    assert version["converged"] is False
    assert [(r["broker"], r["state"]) for r in version["convergence"]] == [
        (b.name, "pending") for b in brokers
    ]
    assert {u["key"] for u in version["unset"]} == {
        "known_hosts",
        "limits",
        "vhost_limits",
        "bridges",
        "federation_upstreams",
        "policies",
        "users",
        "permissions",
    }
    assert Command.objects.filter(name="config.apply").count() == 3

    # converged is what the brokers report running, not what they acked
    Broker.objects.update(config_version=1, config_checksum=version["checksum"])
    current = api.get("/api/v1/configs/current/").json()
    assert current["number"] == 1 and current["converged"] is True
    assert api.get("/api/v1/configs/1/").json()["checksum"] == version["checksum"]
    assert api.get("/api/v1/cluster/").json()["config_version"] == 1

    # the same document again: nothing new
    same = api.post("/api/v1/configs/", {"document": document}, format="json")
    assert same.status_code == 200 and same.json()["outcome"] == "unchanged"
    # a change to the current one, from the version it started from
    changed = api.post(
        "/api/v1/configs/", {"changes": {"vhosts": ["/", "b"]}, "base": 1}, format="json"
    )
    assert changed.status_code == 201 and changed.json()["document"]["heartbeat"]["timeout"] == 2.0
    stale = api.post("/api/v1/configs/", {"changes": {"vhosts": None}, "base": 1}, format="json")
    assert stale.status_code == 409 and "version 2" in stale.json()["error"]
    # version 1 again, through its push endpoint
    pushed = api.post("/api/v1/configs/1/push/", {"comment": "back"}, format="json")
    assert pushed.status_code == 200 and pushed.json()["outcome"] == "repushed"
    assert api.get("/api/v1/configs/current/").json()["number"] == 1
    assert api.get("/api/v1/configs/").json()["count"] == 2


@pytest.mark.parametrize(
    ("body", "status", "named"),
    [
        ({"document": {"heartbeat": {"interval": -1}}}, 422, "heartbeat"),
        ({"document": {"limits": {"frame_max": "big"}}}, 422, "limits"),
        ({"document": {"no_such_part": 1}}, 422, "no_such_part"),
        ({"changes": {"no_such_part": 1}}, 422, "no_such_part"),
        ({"document": "text"}, 400, "document"),
        ({}, 400, "document"),
        ({"document": {}, "changes": {}}, 400, "either"),
    ],
)
def test_bad_configuration_is_refused_naming_the_key(
    api: APIClient, brokers: list[Broker], body: dict, status: int, named: str
) -> None:
    response = api.post("/api/v1/configs/", body, format="json")
    assert response.status_code == status, response.json()
    assert named in response.json()["error"]
    assert Command.objects.count() == 0


def test_an_alarm_is_acknowledged_once_with_an_audit_entry(
    api: APIClient, brokers: list[Broker]
) -> None:
    alarm = Alarm.objects.create(broker=brokers[0], kind="broker.down", raised_at=timezone.now())
    url = f"/api/v1/alarms/{alarm.pk}/acknowledge/"
    response = api.post(url, {"comment": "on it"}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["acknowledged_by"] == "op" and body["acknowledgement"] == "on it"
    assert body["active"] is True and body["acknowledged_at"]
    entry = AuditEntry.objects.get(action="alarm.acknowledge")
    assert (
        entry.target == f"broker.down on {brokers[0].name}" and entry.details["comment"] == "on it"
    )
    assert api.get("/api/v1/cluster/").json()["alarms_unacknowledged"] == 0
    again = api.post(url, {}, format="json")
    assert again.status_code == 409 and "already" in again.json()["error"]
    cleared = Alarm.objects.create(kind="link.refused", raised_at=timezone.now(), active=False)
    gone = api.post(f"/api/v1/alarms/{cleared.pk}/acknowledge/", {}, format="json")
    assert gone.status_code == 409 and "cleared" in gone.json()["error"]
    viewer = User.objects.create_user("viewer", password="pw-viewer-1")
    client = APIClient()
    client.force_authenticate(viewer)
    assert (
        client.post(f"/api/v1/alarms/{cleared.pk}/acknowledge/", {}, format="json").status_code
        == 403
    )
