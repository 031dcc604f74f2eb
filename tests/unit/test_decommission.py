"""Retiring a broker that is gone for good (issue 25): the service, the API, the
dashboard's confirmation step, a broker that links again, and the admin's delete."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from clusterapi import cluster, decommission, ingest, objects
from clusterapi.errors import Conflict, InvalidRequest
from clusterapi.models import Alarm, AuditEntry, Broker, ConfigVersion, HeartbeatSample
from tests.support.linkmessages import hello as link_hello

pytestmark = pytest.mark.django_db

GONE = "10.0.0.3:5701"


@pytest.fixture(autouse=True)
def in_memory_layer(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def brokers() -> dict[str, Broker]:
    now = timezone.now()
    kind = {"broker_type": Broker.TYPE_PRIMARY}
    up = Broker.objects.create(
        name="10.0.0.1:5701", spid="a", state="up", connected=True, last_seen=now, **kind
    )
    also_up = Broker.objects.create(
        name="10.0.0.2:5701", spid="b", state="up", connected=True, **kind
    )
    gone = Broker.objects.create(name=GONE, spid="c", state="down", address="10.0.0.3:5672", **kind)
    Alarm.objects.create(broker=gone, kind="broker.down", raised_at=now, message="down")
    Alarm.objects.create(broker=up, kind="broker.down", raised_at=now, message="other")
    HeartbeatSample.objects.create(broker=gone, time=now - dt.timedelta(minutes=5), spid="c")
    return {"up": up, "also_up": also_up, "gone": gone}


def api_for(user: User) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


# -- the service ---------------------------------------------------------------------------


def test_retiring_closes_alarms_leaves_lists_and_counts_and_keeps_the_row(
    brokers: dict[str, Broker], operator: User
) -> None:
    assert cluster.state()["brokers_total"] == 3
    outcome = decommission.retire(brokers["gone"], operator, GONE)
    gone = Broker.objects.get(name=GONE)
    assert gone.state == "retired" and gone.retired_at is not None
    assert outcome["alarms_closed"] == 1
    assert not Alarm.objects.filter(broker=gone, active=True).exists()
    assert Alarm.objects.filter(broker=brokers["up"], active=True).count() == 1  # others stay
    state = cluster.state()
    assert (state["brokers_up"], state["brokers_total"]) == (2, 2)
    assert GONE not in {b.name for b in objects.brokers()}
    assert GONE in {b.name for b in objects.brokers(retired=True)}
    assert HeartbeatSample.objects.filter(broker=gone).count() == 1  # history kept
    entry = AuditEntry.objects.get(action="broker.retire")
    assert entry.target == GONE and entry.username == operator.username
    assert entry.details["alarms_closed"] == 1
    assert (
        f"Remove {GONE} from known_hosts in the cluster file on every server"
        in (outcome["next"][0])
    )


def test_what_cannot_be_retired(brokers: dict[str, Broker], operator: User) -> None:
    with pytest.raises(InvalidRequest, match="type the broker's name"):
        decommission.retire(brokers["gone"], operator, "10.0.0.3")
    with pytest.raises(Conflict, match="stop brokerd on it first"):
        decommission.retire(brokers["up"], operator, brokers["up"].name)
    decommission.retire(brokers["gone"], operator, GONE)
    with pytest.raises(Conflict, match="retired already"):
        decommission.retire(brokers["gone"], operator, GONE)
    assert AuditEntry.objects.filter(action="broker.retire").count() == 1


def test_the_advice_names_a_console_version_that_lists_it(brokers: dict[str, Broker]) -> None:
    ConfigVersion.objects.create(
        number=4, document={"known_hosts": ["10.0.0.1:5701", GONE]}, checksum="1" * 16
    )
    steps = decommission.advice(brokers["gone"])
    assert any("configuration version 4 also lists" in step for step in steps)
    assert not any("version" in step for step in decommission.advice(brokers["also_up"]))


def test_the_advice_fits_the_broker_s_type() -> None:
    """Only a primary is in known_hosts: a secondary's advice edits no cluster file."""
    secondary = Broker.objects.create(
        name="10.0.0.9:5705", state="down", broker_type=Broker.TYPE_SECONDARY
    )
    steps = decommission.advice(secondary)
    assert "is a secondary: no server's known_hosts lists it" in steps[0]
    assert not any("Remove" in step and "known_hosts" in step for step in steps)
    alone = Broker.objects.create(name="10.0.0.8:5672", state="down")
    assert "ran standalone" in decommission.advice(alone)[0]


def test_a_retired_broker_that_links_again_is_active_again(
    brokers: dict[str, Broker], operator: User
) -> None:
    decommission.retire(brokers["gone"], operator, GONE)
    hello = link_hello(GONE, "c2", address="10.0.0.3:5672")
    broker, came_back = ingest.register_hello(ingest.parse_hello(hello), "chan")
    assert came_back and broker.pk == brokers["gone"].pk
    assert broker.state == "up" and broker.retired_at is None
    assert cluster.state()["brokers_total"] == 3
    back = AuditEntry.objects.filter(action="broker.up", target=GONE).get()
    assert back.details["previous_state"] == "retired"


# -- the API -------------------------------------------------------------------------------


def test_api_decommission(brokers: dict[str, Broker], operator: User, viewer: User) -> None:
    url = f"/api/v1/brokers/{GONE}/decommission/"
    refused = api_for(viewer).post(url, {"confirm": GONE}, format="json")
    assert refused.status_code == 403
    wrong = api_for(operator).post(url, {"confirm": "nope"}, format="json")
    assert wrong.status_code == 400 and "type the broker's name" in wrong.json()["error"]
    unknown = api_for(operator).post(url, {"confirm": GONE, "force": True}, format="json")
    assert unknown.status_code == 400
    live = api_for(operator).post(
        f"/api/v1/brokers/{brokers['up'].pk}/decommission/",
        {"confirm": brokers["up"].name},
        format="json",
    )
    assert live.status_code == 409 and "stop brokerd" in live.json()["error"]
    assert Broker.objects.get(name=GONE).state == "down"

    done = api_for(operator).post(url, {"confirm": GONE}, format="json")
    assert done.status_code == 200, done.content
    body = done.json()
    assert body["broker"] == GONE and body["alarms_closed"] == 1
    assert any("known_hosts in the cluster file on every server" in s for s in body["next"])

    listed = api_for(viewer).get("/api/v1/brokers/").json()
    assert GONE not in [b["name"] for b in listed["results"]]
    retired = api_for(viewer).get("/api/v1/brokers/?state=retired").json()
    assert [b["name"] for b in retired["results"]] == [GONE]
    one = api_for(viewer).get(f"/api/v1/brokers/{GONE}/")
    assert one.status_code == 200 and one.json()["state"] == "retired"
    assert one.json()["retired_at"] is not None
    counts = api_for(viewer).get("/api/v1/cluster/").json()
    assert counts["brokers_total"] == 2
    again = api_for(operator).post(url, {"confirm": GONE}, format="json")
    assert again.status_code == 409


# -- the dashboard ---------------------------------------------------------------------------


def client_for(user: User, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def test_broker_page_offers_decommission_only_when_it_can(
    brokers: dict[str, Broker], operator: User, viewer: User
) -> None:
    page = client_for(operator).get(f"/brokers/{GONE}/").content.decode()
    assert f'href="/brokers/{GONE}/decommission/"' in page
    live = client_for(operator).get(f"/brokers/{brokers['up'].name}/").content.decode()
    assert "/decommission/" not in live and 'id="decommission-unavailable"' in live
    as_viewer = client_for(viewer).get(f"/brokers/{GONE}/").content.decode()
    assert "/decommission/" not in as_viewer


def test_dashboard_confirmation_step_then_retire(
    brokers: dict[str, Broker], operator: User, viewer: User
) -> None:
    url = f"/brokers/{GONE}/decommission/"
    assert client_for(viewer).get(url).status_code == 403
    assert client_for(viewer).post(url, {"confirm": GONE}).status_code == 403
    confirm = client_for(operator).get(url)
    html = confirm.content.decode()
    assert confirm.status_code == 200
    assert f"Remove {GONE} from known_hosts in the cluster file on every server" in html
    assert 'name="csrfmiddlewaretoken"' in html and 'name="confirm"' in html
    assert Broker.objects.get(name=GONE).state == "down"  # a GET changes nothing
    # CSRF-protected
    assert client_for(operator, csrf=True).post(url, {"confirm": GONE}).status_code == 403
    wrong = client_for(operator).post(url, {"confirm": "x"})
    assert wrong.status_code == 400 and "type the broker" in wrong.content.decode()
    done = client_for(operator).post(url, {"confirm": GONE})
    assert done.status_code == 200 and 'id="decommission-done"' in done.content.decode()
    assert Broker.objects.get(name=GONE).state == "retired"
    listing = client_for(viewer).get("/brokers/").content.decode()
    assert GONE not in listing and "10.0.0.1:5701" in listing
    overview = client_for(viewer).get("/").content.decode()
    assert "2 of 2" in overview
    history = client_for(viewer).get(f"/brokers/{GONE}/").content.decode()
    assert 'id="broker-retired"' in history


def test_the_decommission_offer_is_live_and_a_down_broker_s_peers_are_marked_old(
    brokers: dict[str, Broker], operator: User
) -> None:
    """The offer is a live fragment: an up broker's page that sees it crash gets the
    button without a reload. A down broker's peer table is what it last said."""
    from django.http import QueryDict

    from console.dashboard.live import render_fragments
    from console.dashboard.pages import PAGES

    up = brokers["up"]
    params = QueryDict(f"broker={up.name}")

    def offer() -> str:
        [fragment] = [
            f for f in render_fragments(PAGES["broker"], params, True) if "broker-decommission" in f
        ]
        return fragment

    assert 'id="decommission-unavailable"' in offer()
    Broker.objects.filter(pk=up.pk).update(state="down", connected=False)
    assert f"/brokers/{up.name}/decommission/" in offer()
    page = client_for(operator).get(f"/brokers/{up.name}/").content.decode()
    assert 'id="peer-links-old"' in page and "as-last-reported" in page
    alive = client_for(operator).get(f"/brokers/{brokers['also_up'].name}/").content.decode()
    assert 'id="peer-links-old"' not in alive


# -- the admin -------------------------------------------------------------------------------


@pytest.fixture
def admin_client(client: Client, django_user_model: Any) -> Client:
    user = django_user_model.objects.create_user("root", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def test_admin_deletes_a_retired_broker_and_refuses_one_in_service(
    brokers: dict[str, Broker], operator: User, admin_client: Client
) -> None:
    live = f"/admin/clusterapi/broker/{brokers['up'].pk}/delete/"
    assert admin_client.get(live).status_code == 403
    decommission.retire(brokers["gone"], operator, GONE)
    url = f"/admin/clusterapi/broker/{brokers['gone'].pk}/delete/"
    page = admin_client.get(url)
    assert page.status_code == 200 and "Yes, I\u2019m sure" in page.content.decode()
    assert "1 heartbeat samples" in page.content.decode()  # counted, not listed one by one
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert not Broker.objects.filter(name=GONE).exists()
    assert not HeartbeatSample.objects.exists()
    # the bulk action refuses brokers in service, and says why
    changelist = "/admin/clusterapi/broker/"
    ask = {"action": "delete_selected", "_selected_action": [brokers["up"].pk]}
    page = admin_client.post(changelist, ask).content.decode()
    assert "brokers in service (retire them first: 10.0.0.1:5701)" in page
    assert admin_client.post(changelist, {**ask, "post": "yes"}).status_code == 403
    assert Broker.objects.filter(pk=brokers["up"].pk).exists()
