"""The console's bridges (issue 42): what brokers report of the bridges they run,
checked at the link; the current configuration's definitions beside it on the
Bridges page and at ``/api/v1/bridges/``, never with a password."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from clusterapi import configs, linkparse
from clusterapi.linkparse import LinkProtocolError
from clusterapi.models import Broker

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer", "scheduled")]

SECRET = "s3cret-far"


def _bridge(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "vhost": "/",
        "value": {
            "src-uri": f"amqp://site:{SECRET}@far.example",
            "src-queue": "outbox",
            "dest-uri": "amqp://",
            "dest-queue": "inbox",
        },
    }


def _reported(name: str, state: str, reason: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "vhost": "/",
        "state": state,
        "reason": reason,
        "since": time.time() - 5,
        "src_uri": "amqp://site:***@far.example",
        "dest_uri": "amqp://",
        "forwarded": 120,
        "acknowledged": 110,
        "requeued": 0,
        "in_flight": 10,
        "rate": 24.5,
    }


@pytest.fixture
def reported(operator: Any) -> Broker:
    configs.save({"bridges": [_bridge("in-from-far"), _bridge("idle")]}, operator, "bridges")
    view = {"bridges": linkparse.bridges({"bridges": [_reported("in-from-far", "running")]})}
    return Broker.objects.create(name="127.0.0.1:5701", state="up", connected=True, view=view)


def test_the_api_lists_each_bridge_with_its_broker_and_state(reported: Broker, viewer: Any) -> None:
    client = APIClient()
    client.force_authenticate(viewer)
    response = client.get("/api/v1/bridges/")
    assert response.status_code == 200
    rows = {row["name"]: row for row in response.json()}
    assert rows["in-from-far"]["broker"] == reported.name
    assert rows["in-from-far"]["state"] == "running" and rows["in-from-far"]["rate"] == 24.5
    assert rows["idle"]["state"] == "not running" and rows["idle"]["broker"] == ""
    assert rows["idle"]["definition"]["src-uri"] == "amqp://site:***@far.example"
    assert SECRET not in response.content.decode()


def test_the_bridges_page_shows_state_and_reason_without_passwords(
    reported: Broker, viewer: Any
) -> None:
    view = {"bridges": [_reported("in-from-far", "starting", "cannot connect to far:5672")]}
    Broker.objects.filter(pk=reported.pk).update(view={"bridges": linkparse.bridges(view)})
    client = Client()
    client.force_login(viewer)
    page = client.get("/bridges/").content.decode()
    assert 'data-bridge="//in-from-far" data-state="starting"' in page
    assert "cannot connect to far:5672" in page and SECRET not in page


@pytest.mark.parametrize(
    ("view", "error"),
    [
        ({"bridges": "x"}, "status.view.bridges"),
        ({"bridges": [1]}, "status.view.bridges[0] must be an object"),
        ({"bridges": [{"vhost": "/", "state": "running"}]}, "status.view.bridges[0].name"),
        ({"bridges": [{**_reported("b", "running"), "forwarded": "many"}]}, "forwarded"),
        ({"bridges": [_reported("b", "running")] * 257}, "at most 256"),
    ],
)
def test_a_bad_bridge_report_is_a_protocol_error(view: dict[str, Any], error: str) -> None:
    with pytest.raises(LinkProtocolError, match=error.replace("[", r"\[").replace("]", r"\]")):
        linkparse.bridges(view)


def test_a_federation_link_shows_what_it_federates_and_its_backlog(
    reported: Broker, viewer: Any
) -> None:
    link = {
        **_reported("federation exchange fed.x from up", "running"),
        "type": "federation",
        "kind": "exchange",
        "object": "fed.x",
        "upstream": "up",
        "backlog": 42,
    }
    rows = linkparse.bridges({"bridges": [link, _reported("in-from-far", "running")]})
    assert rows[0]["federation"] == {"kind": "exchange", "object": "fed.x", "upstream": "up"}
    assert rows[0]["backlog"] == 42 and "federation" not in rows[1] and rows[1]["backlog"] is None
    Broker.objects.filter(pk=reported.pk).update(view={"bridges": rows})
    client = Client()
    client.force_login(viewer)
    page = client.get("/bridges/").content.decode()
    assert "federation: exchange fed.x from upstream up" in page
    assert '<td class="num">42</td>' in page
