"""The cluster's members in the console (issue 43): the overview's Members section, its
Forget confirmation step, and ``/api/v1/cluster/members/`` with ``.../forget/``.

In process with a test database. A forget through the API waits for the broker's
ack: ``answering`` plays the broker's link in a thread, acking with
``commands.acknowledge`` as the link consumer does, over the test's own database
connection (shared the way Django shares an in-memory SQLite database with a live
server's thread).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from clusterapi import commands, members
from clusterapi.models import AuditEntry, Broker, Command

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer", "scheduled")]

ROOT, SECOND, THIRD = "10.0.0.1:5672", "10.0.0.2:5672", "10.0.0.3:5672"
STOPPED, NEVER, GONE = "10.0.0.4:5672", "10.0.0.5:5672", "10.0.0.6:5672"
HOSTILE = '<script>alert("m")</script>:5672'


def table(version: int = 1, committed: bool = True, **extra: Any) -> dict[str, Any]:
    """``view.members`` as brokerd sends it (``brokerd ctl cluster members --json``)."""

    def row(address: str, spid: str | None, state: str, root: bool = False) -> dict:
        return {"address": address, "spid": spid, "type": "primary", "state": state, "root": root}

    return {
        "version": version,
        "term": 4,
        "node": "0123456789abcdef",
        "committed": committed,
        "forgotten": [{"address": "10.0.0.9:5672", "node": "fedcba9876543210"}],
        "joining": False,
        "checksum": "aa11bb22cc33dd44",
        "root": "spid-1",
        "members": [
            row(ROOT, "spid-1", "self", root=True),
            row(SECOND, "spid-2", "up"),
            row(THIRD, "spid-3", "up"),
            row(STOPPED, "spid-4", "down"),
            row(NEVER, None, "never heard"),
            row(GONE, "spid-6", "gone"),
        ],
        **extra,
    }


@pytest.fixture
def brokers() -> list[Broker]:
    """Three primaries linked to the console, the first the root; each reports the
    members (the root's table differs from the others' so the test sees whose is shown)."""
    now = timezone.now()
    out = []
    for i, name in enumerate((ROOT, SECOND, THIRD), start=1):
        out.append(
            Broker.objects.create(
                name=name,
                spid=f"spid-{i}",
                broker_type="primary",
                state="up",
                connected=True,
                is_root=i == 1,
                ready=True,
                last_seen=now - dt.timedelta(seconds=i),
                view={"members": table(version=1 if i == 1 else 0)},
            )
        )
    return out


@pytest.fixture
def operator_client(operator: User) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    return client


@pytest.fixture
def viewer_client(viewer: User) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(viewer)
    return client


def api_for(user: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.get_or_create(user=user)[0].key}")
    return client


def section(html: str) -> str:
    start = html.index('<section id="cluster-members"')
    return html[start : html.index("</section>", start)]


# -- the overview's Members section ---------------------------------------------------------


def test_the_members_section_shows_the_roots_table(
    operator_client: Client, brokers: list[Broker]
) -> None:
    html = section(operator_client.get("/").content.decode())
    assert 'data-version="1"' in html and 'data-committed="yes"' in html  # the root's, not 0
    assert "held by a majority" in html and f"as {ROOT} reports it" in html
    for address, state in [
        (ROOT, "self"),
        (SECOND, "up"),
        (STOPPED, "down"),
        (NEVER, "never heard"),
    ]:
        assert f'data-member="{address}" data-state="{state}"' in html
    assert "<code>spid-4</code>" in html and ">root</span>" in html
    assert f'href="/brokers/{ROOT}/">{ROOT}</a>' in html  # a member that links: its page
    assert 'data-forgotten="10.0.0.9:5672"' in html and "node fedcba9876543210" in html


def test_forget_is_offered_only_for_members_that_are_not_running(
    operator_client: Client, viewer_client: Client, brokers: list[Broker]
) -> None:
    html = section(operator_client.get("/").content.decode())
    offered = {
        a for a in (ROOT, SECOND, THIRD, STOPPED, NEVER, GONE) if f'aria-label="Forget {a}"' in html
    }
    assert offered == {STOPPED, NEVER, GONE}
    assert "/cluster/members/forget/?address=10.0.0.4%3A5672" in html
    assert "Forget" not in section(viewer_client.get("/").content.decode()).replace("Forgotten", "")


def test_what_a_broker_reports_is_shown_escaped_and_malformed_rows_are_left_out(
    operator_client: Client, brokers: list[Broker]
) -> None:
    hostile = table()
    hostile["members"] += [
        {"address": HOSTILE, "spid": "<b>x</b>", "type": "primary", "state": "<i>down</i>"},
        {"spid": "no-address", "state": "down"},
        "not a row",
    ]
    hostile["forgotten"].append({"address": "<img src=x onerror=alert(1)>", "node": 7})
    Broker.objects.filter(name=ROOT).update(view={"members": hostile})
    html = section(operator_client.get("/").content.decode())
    assert "<script>" not in html and "<img" not in html and "<b>x" not in html
    assert "&lt;script&gt;alert(&quot;m&quot;)&lt;/script&gt;:5672" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert 'data-state="unknown"' in html  # a state the console does not know ...
    assert html.count("Forget…") == 3  # ... is never offered for forgetting
    assert "no-address" not in html


def test_without_a_linked_broker_the_section_says_why(
    operator_client: Client, brokers: list[Broker]
) -> None:
    Broker.objects.update(connected=False)
    html = section(operator_client.get("/").content.decode())
    assert 'id="members-unknown"' in html and "no broker of a cluster is linked" in html


def test_only_standalone_brokers_hide_the_section(operator_client: Client) -> None:
    Broker.objects.create(
        name="127.0.0.1:5800", broker_type="standalone", state="up", connected=True
    )
    html = operator_client.get("/").content.decode()
    assert '<section id="cluster-members" hidden></section>' in html


# -- forgetting from the dashboard ------------------------------------------------------------


def test_the_confirmation_step_offers_the_form_only_for_a_stopped_member(
    operator_client: Client, brokers: list[Broker]
) -> None:
    page = operator_client.get("/cluster/members/forget/", {"address": STOPPED}).content.decode()
    assert 'id="member-forget-form"' in page and 'name="csrfmiddlewaretoken"' in page
    assert f'name="address" value="{STOPPED}"' in page and "old data directory" in page
    running = operator_client.get("/cluster/members/forget/", {"address": SECOND}).content.decode()
    assert 'id="member-forget-form"' not in running and "Stop it first" in running
    stranger = operator_client.get("/cluster/members/forget/", {"address": HOSTILE})
    html = stranger.content.decode()
    assert 'id="member-forget-form"' not in html and "is not a member" in html
    assert "<script>" not in html
    assert Command.objects.count() == 0


def test_a_forget_without_the_csrf_token_is_refused(
    operator_client: Client, brokers: list[Broker]
) -> None:
    response = operator_client.post("/cluster/members/forget/", {"address": STOPPED})
    assert response.status_code == 403
    assert Command.objects.count() == 0


def test_a_viewer_can_neither_see_the_step_nor_forget(
    viewer_client: Client, brokers: list[Broker]
) -> None:
    assert viewer_client.get("/cluster/members/forget/", {"address": STOPPED}).status_code == 403
    viewer_client.get("/")  # sets the CSRF cookie
    token = viewer_client.cookies["csrftoken"].value
    response = viewer_client.post(
        "/cluster/members/forget/", {"address": STOPPED}, HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 403 and Command.objects.count() == 0


def test_a_forget_is_sent_to_the_root_and_its_refusal_shown(
    operator_client: Client,
    brokers: list[Broker],
    scheduled: list,
    django_capture_on_commit_callbacks: Any,
) -> None:
    page = operator_client.get("/cluster/members/forget/", {"address": STOPPED})
    token = page.context["csrf_token"]
    with django_capture_on_commit_callbacks(execute=True):
        response = operator_client.post(
            "/cluster/members/forget/", {"address": STOPPED, "csrfmiddlewaretoken": str(token)}
        )
    assert response.status_code == 302 and response["Location"] == "/#cluster-members"
    command = Command.objects.get()
    assert (command.name, command.args, command.broker.name) == (
        "cluster.forget",
        {"address": STOPPED},
        ROOT,
    )
    assert scheduled == [command.id]  # its delivery queued, as every command's
    assert AuditEntry.objects.filter(action="command.cluster.forget", target=ROOT).exists()
    waiting = section(operator_client.get("/").content.decode())
    assert f'data-command="{command.id}" data-state="pending"' in waiting
    reason = f"{STOPPED} is running (spid spid-4): stop it before forgetting it"
    commands.acknowledge(brokers[0].pk, str(command.id), False, None, reason)
    html = section(operator_client.get("/").content.decode())
    assert 'data-state="failed"' in html and reason in html


def test_a_malformed_address_is_refused_on_the_page(
    operator_client: Client, brokers: list[Broker]
) -> None:
    operator_client.get("/")
    token = operator_client.cookies["csrftoken"].value
    response = operator_client.post(
        "/cluster/members/forget/", {"address": "node4"}, HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 400
    assert "address: must be a member&#x27;s HOST:PORT" in response.content.decode()
    assert Command.objects.count() == 0


def test_the_overview_keeps_the_members_live(brokers: list[Broker]) -> None:
    from console.dashboard.pages import PAGES

    assert "dashboard/fragments/cluster_members.html" in PAGES["overview"].fragments


# -- the REST API -----------------------------------------------------------------------------


def test_get_members_answers_the_roots_table(viewer: User, brokers: list[Broker]) -> None:
    response = api_for(viewer).get("/api/v1/cluster/members/")
    assert response.status_code == 200
    body = response.json()
    assert body["source"] == ROOT and body["reported_at"]
    assert {k: body[k] for k in ("version", "term", "committed", "root", "checksum")} == {
        "version": 1,
        "term": 4,
        "committed": True,
        "root": "spid-1",
        "checksum": "aa11bb22cc33dd44",
    }
    assert body["forgotten"] == [{"address": "10.0.0.9:5672", "node": "fedcba9876543210"}]
    rows = {m["address"]: m for m in body["members"]}
    assert rows[STOPPED] == {
        "address": STOPPED,
        "spid": "spid-4",
        "type": "primary",
        "state": "down",
        "root": False,
        "forgettable": True,
    }
    assert rows[NEVER]["spid"] is None and rows[NEVER]["forgettable"]
    assert not rows[ROOT]["forgettable"] and rows[ROOT]["root"]


def test_without_the_root_the_freshest_linked_broker_answers(
    viewer: User, brokers: list[Broker]
) -> None:
    Broker.objects.filter(name=ROOT).update(connected=False)
    assert api_for(viewer).get("/api/v1/cluster/members/").json()["source"] == SECOND


def test_get_members_is_a_503_without_a_linked_broker(viewer: User, brokers: list[Broker]) -> None:
    Broker.objects.update(connected=False)
    response = api_for(viewer).get("/api/v1/cluster/members/")
    assert response.status_code == 503
    assert "no broker of a cluster is linked to the console" in response.json()["error"]
    Broker.objects.update(connected=True, view={})
    old = api_for(viewer).get("/api/v1/cluster/members/")
    assert old.status_code == 503 and "reports the cluster's members" in old.json()["error"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"address": "node4"}, "address: must be a member's HOST:PORT"),
        ({"address": "node4:0"}, "address: port 0 is out of range"),
        ({"address": "unix:/run/w.sock"}, "address: must be"),
        ({"address": 5672}, "address"),
        ({}, "address"),
        ({"address": STOPPED, "force": True}, "force"),
    ],
)
def test_a_malformed_forget_is_a_400_naming_the_field(
    operator: User, brokers: list[Broker], body: dict, field: str
) -> None:
    response = api_for(operator).post("/api/v1/cluster/members/forget/", body, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]
    assert Command.objects.count() == 0


def test_a_forget_is_a_503_without_a_linked_broker(operator: User, brokers: list[Broker]) -> None:
    Broker.objects.update(connected=False)
    response = api_for(operator).post(
        "/api/v1/cluster/members/forget/", {"address": STOPPED}, format="json"
    )
    assert response.status_code == 503 and "no broker of a cluster" in response.json()["error"]


def test_a_viewer_cannot_forget_through_the_api(viewer: User, brokers: list[Broker]) -> None:
    response = api_for(viewer).post(
        "/api/v1/cluster/members/forget/", {"address": STOPPED}, format="json"
    )
    assert response.status_code == 403 and Command.objects.count() == 0


@pytest.fixture
def answering() -> Iterator[Callable[..., None]]:
    """Plays the broker's link: once a command ``name`` (cluster.forget unless told)
    exists, acks it (from a thread, while the request waits) with what it is told."""
    connection = connections["default"]
    threads: list[threading.Thread] = []

    def answer(
        ok: bool, result: Any = None, error: str | None = None, name: str = Command.CLUSTER_FORGET
    ) -> None:
        def run() -> None:
            connections["default"] = connection
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                command = Command.objects.filter(name=name).first()
                if command is not None:
                    commands.acknowledge(command.broker_id, str(command.id), ok, result, error)
                    return
                time.sleep(0.05)

        connection.inc_thread_sharing()
        thread = threading.Thread(target=run, daemon=True)
        threads.append(thread)
        thread.start()

    yield answer
    for thread in threads:
        thread.join(15)
        connection.dec_thread_sharing()


def test_a_forget_answers_the_brokers_result(
    operator: User, brokers: list[Broker], answering: Callable[..., None]
) -> None:
    result = {"forgotten": STOPPED, "version": 2, "committed": True, "members": [ROOT, SECOND]}
    answering(True, result)
    response = api_for(operator).post(
        "/api/v1/cluster/members/forget/", {"address": " 10.0.0.4:5672"}, format="json"
    )
    assert response.status_code == 200, response.json()
    command = Command.objects.get()
    assert response.json() == {
        "command": str(command.id),
        "broker": ROOT,
        "forgotten": STOPPED,
        "version": 2,
        "committed": True,
        "members": [ROOT, SECOND],
    }
    assert command.args == {"address": STOPPED} and command.state == "acked"
    audited = AuditEntry.objects.get(action="cluster.forgotten")
    assert audited.target == STOPPED and audited.details["version"] == 2


def test_a_refused_forget_is_a_409_with_the_roots_reason(
    operator: User, brokers: list[Broker], answering: Callable[..., None]
) -> None:
    reason = f"{SECOND} is running (spid spid-2): stop it before forgetting it"
    answering(False, None, reason)
    response = api_for(operator).post(
        "/api/v1/cluster/members/forget/", {"address": SECOND}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["error"] == reason


def test_a_forget_the_broker_does_not_answer_is_a_504_naming_the_open_command(
    operator: User, brokers: list[Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(members, "FORGET_WAIT_SECONDS", 0.3)
    response = api_for(operator).post(
        "/api/v1/cluster/members/forget/", {"address": STOPPED}, format="json"
    )
    assert response.status_code == 504
    command = Command.objects.get()
    assert command.is_open and f"/api/v1/commands/{command.id}/" in response.json()["error"]


def test_the_endpoints_are_listed_and_described(client: Client, brokers: list[Broker]) -> None:
    root = client.get("/api/v1/").json()
    assert any(e["url"].endswith("/api/v1/cluster/members/") for e in root["endpoints"])
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    forget = schema["paths"]["/api/v1/cluster/members/forget/"]["post"]
    assert {"200", "400", "409", "503", "504"} <= set(forget["responses"])
    assert "503" in schema["paths"]["/api/v1/cluster/members/"]["get"]["responses"]
