"""Quorum groups that follow the members, from the console (issue 43): the Members
section's Grow/Shrink groups actions with their confirmation step, the outcome per
queue in the section, and ``POST /api/v1/queues/grow|shrink/``.

In process with a test database, as ``test_cluster_members.py`` (whose fixtures and
broker-playing ``answering`` this reuses).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from clusterapi import commands, groups
from clusterapi.models import AuditEntry, Broker, Command
from tests.unit import test_cluster_members as forget_tests
from tests.unit.test_cluster_members import (
    GONE,
    HOSTILE,
    NEVER,
    ROOT,
    SECOND,
    STOPPED,
    THIRD,
    api_for,
    section,
    table,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer", "scheduled")]

# the forget tests' fixtures: three linked primaries reporting the members, the clients,
# and the broker's link played from a thread
brokers = forget_tests.brokers
operator_client = forget_tests.operator_client
viewer_client = forget_tests.viewer_client
answering = forget_tests.answering

REFUSED = "queue 'pair' is kept by 2 members: fewer would not be a majority of its group"


def result(action: str, address: str = THIRD) -> dict[str, Any]:
    """A broker's ack of queues.grow|shrink: one queue changed, one refused."""
    return {
        "address": address,
        "action": action,
        "queues": [
            {"queue": "trio", "changed": True, "group": [ROOT, SECOND], "reason": ""},
            {"queue": "pair", "changed": False, "group": [ROOT, address], "reason": REFUSED},
        ],
    }


def token_of(client: Client) -> str:
    client.get("/")  # sets the CSRF cookie
    return client.cookies["csrftoken"].value


# -- the overview's Members section ---------------------------------------------------------


def test_grow_and_shrink_are_offered_only_for_running_primaries(
    operator_client: Client, viewer_client: Client, brokers: list[Broker]
) -> None:
    rows = table()
    rows["members"].append(
        {"address": "10.0.0.7:5672", "spid": "s7", "type": "secondary", "state": "up"}
    )
    Broker.objects.filter(name=ROOT).update(view={"members": rows})
    html = section(operator_client.get("/").content.decode())
    everyone = (ROOT, SECOND, THIRD, STOPPED, NEVER, GONE, "10.0.0.7:5672")
    for verb in ("Grow groups onto", "Shrink groups off"):
        offered = {a for a in everyone if f'aria-label="{verb} {a}"' in html}
        assert offered == {ROOT, SECOND, THIRD}, verb
    assert "/cluster/members/groups/?action=shrink&amp;address=10.0.0.3%3A5672" in html
    assert "groups…" not in section(viewer_client.get("/").content.decode())


# -- the confirmation step and the POST -----------------------------------------------------


@pytest.mark.parametrize("action", ["grow", "shrink"])
def test_the_confirmation_step_offers_the_form_only_for_a_running_primary(
    operator_client: Client, brokers: list[Broker], action: str
) -> None:
    url = "/cluster/members/groups/"
    page = operator_client.get(url, {"action": action, "address": THIRD}).content.decode()
    assert 'id="member-groups-form"' in page and 'name="csrfmiddlewaretoken"' in page
    assert f'name="action" value="{action}"' in page and f"queues {action} {THIRD}" in page
    stopped = operator_client.get(url, {"action": action, "address": STOPPED}).content.decode()
    assert 'id="member-groups-form"' not in stopped and "only a running primary" in stopped
    hostile = operator_client.get(url, {"action": action, "address": HOSTILE}).content.decode()
    assert 'id="member-groups-form"' not in hostile and "is not a member" in hostile
    assert "<script>" not in hostile
    odd = operator_client.get(url, {"action": "<b>x</b>", "address": THIRD}).content.decode()
    assert 'id="member-groups-form"' not in odd and "<b>x" not in odd
    assert Command.objects.count() == 0


def test_a_change_without_the_csrf_token_is_refused(
    operator_client: Client, brokers: list[Broker]
) -> None:
    response = operator_client.post(
        "/cluster/members/groups/", {"action": "grow", "address": THIRD}
    )
    assert response.status_code == 403 and Command.objects.count() == 0


def test_a_viewer_can_neither_see_the_step_nor_change_groups(
    viewer_client: Client, brokers: list[Broker]
) -> None:
    url = "/cluster/members/groups/"
    assert viewer_client.get(url, {"action": "grow", "address": THIRD}).status_code == 403
    response = viewer_client.post(
        url, {"action": "grow", "address": THIRD}, HTTP_X_CSRFTOKEN=token_of(viewer_client)
    )
    assert response.status_code == 403 and Command.objects.count() == 0


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"action": "grow", "address": "node3"}, "address: must be a member&#x27;s HOST:PORT"),
        ({"action": "regrow", "address": THIRD}, "action: must be grow or shrink"),
    ],
)
def test_a_malformed_change_is_refused_on_the_page(
    operator_client: Client, brokers: list[Broker], body: dict, error: str
) -> None:
    response = operator_client.post(
        "/cluster/members/groups/", body, HTTP_X_CSRFTOKEN=token_of(operator_client)
    )
    assert response.status_code == 400 and error in response.content.decode()
    assert Command.objects.count() == 0


def test_a_shrink_is_sent_to_the_root_and_each_queues_answer_shown(
    operator_client: Client,
    brokers: list[Broker],
    scheduled: list,
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_client.post(
            "/cluster/members/groups/",
            {"action": "shrink", "address": THIRD},
            HTTP_X_CSRFTOKEN=token_of(operator_client),
        )
    assert response.status_code == 302 and response["Location"] == "/#cluster-members"
    command = Command.objects.get()
    assert (command.name, command.args, command.broker.name) == (
        "queues.shrink",
        {"address": THIRD},
        ROOT,
    )
    assert scheduled == [command.id]
    asked = AuditEntry.objects.get(action="command.queues.shrink")
    assert asked.target == ROOT and asked.details["address"] == THIRD
    waiting = section(operator_client.get("/").content.decode())
    assert f'data-command="{command.id}" data-state="pending"' in waiting
    assert "waiting for the root's answer on each quorum queue" in waiting
    commands.acknowledge(brokers[0].pk, str(command.id), True, result("shrink"), None)
    html = section(operator_client.get("/").content.decode())
    assert 'data-state="acked"' in html and "2 quorum queues named it" in html
    assert 'data-queue="trio" data-changed="yes"' in html
    assert f"<code>{ROOT}</code>, <code>{SECOND}</code>" in html  # its new group
    assert 'data-queue="pair" data-changed="no"' in html
    assert "fewer would not be a majority of its group" in html  # the root's reason
    done = AuditEntry.objects.get(action="queues.shrunk")
    assert done.target == THIRD and done.details == {
        "id": str(command.id),
        "changed": ["trio"],
        "refused": 1,
    }
    commands.acknowledge(brokers[0].pk, str(command.id), True, result("shrink"), None)
    assert AuditEntry.objects.filter(action="queues.shrunk").count() == 1  # a retried ack


def test_what_a_broker_answers_is_shown_escaped_and_malformed_rows_left_out(
    operator_client: Client, brokers: list[Broker]
) -> None:
    command = groups.change("grow", THIRD, None)
    hostile = {
        "queues": [
            {"queue": HOSTILE, "changed": False, "group": "<i>", "reason": "<img src=x>"},
            {"queue": "q2", "changed": "yes", "group": [HOSTILE, 5]},
            {"changed": True},
            "not a row",
        ]
    }
    commands.acknowledge(brokers[0].pk, str(command.id), True, hostile, None)
    html = section(operator_client.get("/").content.decode())
    assert "<script>" not in html and "<img" not in html and "<i>" not in html
    assert "&lt;img src=x&gt;" in html and "2 quorum queues left it out" in html
    assert 'data-queue="q2" data-changed="no"' in html  # only a true ``changed`` is changed


def test_a_failed_change_shows_the_brokers_reason(
    operator_client: Client, brokers: list[Broker]
) -> None:
    command = groups.change("grow", THIRD, None)
    reason = "queues.grow: a worker of a host has no quorum groups to change"
    commands.acknowledge(brokers[0].pk, str(command.id), False, None, reason)
    html = section(operator_client.get("/").content.decode())
    assert 'data-state="failed"' in html and reason in html
    assert not AuditEntry.objects.filter(action="queues.grown").exists()


# -- the REST API -----------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["grow", "shrink"])
def test_a_change_answers_each_queues_answer(
    operator: User, brokers: list[Broker], answering: Callable[..., None], action: str
) -> None:
    name = f"queues.{action}"
    answering(True, result(action), name=name)
    response = api_for(operator).post(
        f"/api/v1/queues/{action}/", {"address": " 10.0.0.3:5672"}, format="json"
    )
    assert response.status_code == 200, response.json()
    command = Command.objects.get()
    assert response.json() == {
        "command": str(command.id),
        "broker": ROOT,
        "address": THIRD,
        "action": action,
        "queues": result(action)["queues"],
    }
    assert (command.name, command.args, command.state) == (name, {"address": THIRD}, "acked")
    done = "queues.grown" if action == "grow" else "queues.shrunk"
    assert AuditEntry.objects.get(action=done).details["changed"] == ["trio"]
    assert AuditEntry.objects.filter(action=f"command.{name}", target=ROOT).exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"address": "node3"}, "address: must be a member's HOST:PORT"),
        ({"address": "node3:65536"}, "address: port 65536 is out of range"),
        ({"address": ["10.0.0.3:5672"]}, "address"),
        ({}, "address"),
        ({"address": THIRD, "action": "shrink"}, "action"),
    ],
)
def test_a_malformed_change_is_a_400_naming_the_field(
    operator: User, brokers: list[Broker], body: dict, field: str
) -> None:
    response = api_for(operator).post("/api/v1/queues/grow/", body, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]
    assert Command.objects.count() == 0


def test_a_change_is_a_503_without_a_linked_broker(operator: User, brokers: list[Broker]) -> None:
    Broker.objects.update(connected=False)
    response = api_for(operator).post("/api/v1/queues/shrink/", {"address": THIRD}, format="json")
    assert response.status_code == 503
    assert "no broker of a cluster is linked" in response.json()["error"]
    assert Command.objects.count() == 0


def test_a_viewer_cannot_change_groups_through_the_api(viewer: User, brokers: list[Broker]) -> None:
    response = api_for(viewer).post("/api/v1/queues/grow/", {"address": THIRD}, format="json")
    assert response.status_code == 403 and Command.objects.count() == 0


def test_a_change_refused_as_a_whole_is_a_409_with_the_brokers_reason(
    operator: User, brokers: list[Broker], answering: Callable[..., None]
) -> None:
    reason = "queues.grow: a worker of a host has no quorum groups to change"
    answering(False, None, reason, name=Command.QUEUES_GROW)
    response = api_for(operator).post("/api/v1/queues/grow/", {"address": THIRD}, format="json")
    assert response.status_code == 409 and response.json()["error"] == reason


def test_a_change_the_broker_does_not_answer_is_a_504_naming_the_open_command(
    operator: User, brokers: list[Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(groups, "WAIT_SECONDS", 0.3)
    response = api_for(operator).post("/api/v1/queues/grow/", {"address": THIRD}, format="json")
    assert response.status_code == 504
    command = Command.objects.get()
    assert command.is_open and f"/api/v1/commands/{command.id}/" in response.json()["error"]


def test_the_endpoints_are_listed_and_described(client: Client, brokers: list[Broker]) -> None:
    root = client.get("/api/v1/").json()
    queues = next(e for e in root["endpoints"] if e["url"].endswith("/api/v1/queues/"))
    assert ".../grow/ and .../shrink/" in queues["description"]
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    for action in ("grow", "shrink"):
        post = schema["paths"][f"/api/v1/queues/{action}/"]["post"]
        assert {"200", "400", "403", "409", "503", "504"} <= set(post["responses"])
        assert f"brokerd ctl queues {action} HOST:PORT" in post["description"]
