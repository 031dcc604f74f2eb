"""Moving queue owners from the console: commands, the REST API, the dashboard, acks.

In process with a test database and the in-memory channel layer; Celery deliveries
scheduled on commit never run (tests/integration/test_console_cluster.py moves a
queue on real brokers).
"""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.http import QueryDict
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from clusterapi import commands, owners
from clusterapi.errors import Conflict, InvalidRequest
from clusterapi.models import AuditEntry, Broker, Command, QueueSnapshot
from console.dashboard.live import render_fragments
from console.dashboard.pages import PAGES

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer")]

A, B, C, D = "127.0.0.1:5801", "127.0.0.1:5802", "127.0.0.1:5803", "127.0.0.1:5804"


@pytest.fixture
def brokers() -> dict[str, Broker]:
    """Primaries A (the root), B and C and a secondary D of cluster ``rk``, all linked."""
    now = timezone.now()
    out = {}
    for i, name in enumerate((A, B, C, D), start=1):
        out[name] = Broker.objects.create(
            name=name,
            spid=f"spid-{i}",
            cluster="rk",
            broker_type="secondary" if name == D else "primary",
            state="up",
            connected=True,
            is_root=name == A,
            ready=True,
            last_seen=now,
        )
    return out


def queue_rows(
    brokers: dict[str, Broker], name: str, owner: str, kind: str = "replicated"
) -> dict[str, QueueSnapshot]:
    """A shared queue as every broker reports it: the master on ``owner``, proxies elsewhere."""
    now = timezone.now()
    replicas = [
        {"spid": b.spid, "in_sync": True, "behind": 0}
        for n, b in brokers.items()
        if n not in (owner, D) and kind != "classic"
    ]
    return {
        n: QueueSnapshot.objects.create(
            broker=b,
            vhost="/",
            name=name,
            durable=True,
            shared=True,
            master=n == owner,
            queue_type=kind,
            replicas=replicas if n == owner else [],
            updated_at=now,
        )
        for n, b in brokers.items()
    }


@pytest.fixture
def orders(brokers: dict[str, Broker]) -> dict[str, QueueSnapshot]:
    """``orders``, a replicated queue owned by B."""
    return queue_rows(brokers, "orders", B)


@pytest.fixture
def classic(brokers: dict[str, Broker]) -> dict[str, QueueSnapshot]:
    return queue_rows(brokers, "replies", C, "classic")


@pytest.fixture
def private(brokers: dict[str, Broker]) -> QueueSnapshot:
    return QueueSnapshot.objects.create(
        broker=brokers[A], vhost="/", name="amq.gen-1", exclusive=True, updated_at=timezone.now()
    )


def move_args(to: str = "spid-3", queue: str = "orders") -> dict[str, str]:
    return {"vhost": "/", "queue": queue, "to": to}


# -- issuing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("queue.move", None, "args.vhost: must be a non-empty string"),
        ("queue.move", {"vhost": "/", "queue": "orders"}, "args.to: must be a non-empty"),
        ("queue.move", {**move_args(), "to": 3}, "args.to: must be a non-empty string"),
        ("queue.move", {**move_args(), "queue": ""}, "args.queue: must be a non-empty"),
        ("queue.move", {**move_args(), "queue": "q" * 256}, "args.queue: at most 255"),
        ("queue.move", {**move_args(), "now": True}, "args.now: unknown argument"),
        ("queues.rebalance", {}, "args.vhost: must be a non-empty string"),
        ("queues.rebalance", {"vhost": ["/"]}, "args.vhost: must be a non-empty string"),
        ("queues.rebalance", {"vhost": "/", "all": 1}, "(queues.rebalance takes vhost)"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(
    brokers, orders, operator, name, args, message
) -> None:
    with pytest.raises(InvalidRequest, match=message) as refused:
        commands.issue(brokers[A], name, args, operator)
    assert not isinstance(refused.value, Conflict)
    assert Command.objects.count() == 0 and AuditEntry.objects.count() == 0


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (move_args(queue="replies"), "queue 'replies' is classic: it lives on its owner alone"),
        (move_args(queue="amq.gen-1"), "is private to its broker"),
        (move_args(queue="nowhere"), "no broker reports a queue 'nowhere'"),
        (move_args(to="spid-2"), f"{B} already owns queue 'orders'"),
        (move_args(to=B), f"{B} already owns queue 'orders'"),
        (move_args(to="spid-4"), f"{D} is a secondary broker: only primaries own queues"),
        (move_args(to="spid-9"), "no broker of the cluster is named 'spid-9'"),
    ],
)
def test_what_cannot_move_is_refused_with_the_reason(
    brokers, orders, classic, private, operator, args, reason
) -> None:
    with pytest.raises(Conflict, match=reason):
        commands.issue(brokers[A], "queue.move", args, operator)
    assert Command.objects.count() == 0


def test_a_move_to_a_primary_that_is_down_is_refused(brokers, orders, operator) -> None:
    Broker.objects.filter(name=C).update(state="down", connected=False)
    with pytest.raises(Conflict, match=f"{C} is down: a queue moves only to a primary that is up"):
        commands.issue(brokers[A], "queue.move", move_args(), operator)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"broker_type": "secondary"}, "is a secondary: queue.move goes to a primary"),
        ({"broker_type": "standalone"}, "is standalone: it has no cluster"),
        ({"state": "down"}, "is down: it cannot run queue.move"),
        ({"connected": False}, "is not linked to the console now"),
    ],
)
def test_only_a_linked_primary_is_sent_a_move(brokers, orders, operator, changes, reason) -> None:
    Broker.objects.filter(name=A).update(**changes)
    with pytest.raises(Conflict, match=reason):
        commands.issue(Broker.objects.get(name=A), "queue.move", move_args(), operator)


def test_a_move_goes_to_the_root_with_the_target_spid_and_is_audited(
    brokers, orders, operator, scheduled, django_capture_on_commit_callbacks
) -> None:
    # by any broker's row of the queue (a proxy's here), the target by name
    with django_capture_on_commit_callbacks(execute=True):
        command = owners.move(orders[D], C, operator)
    assert (command.broker, command.name, command.args) == (brokers[A], "queue.move", move_args())
    assert scheduled == [command.id]
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.username, entry.target) == ("command.queue.move", "op", A)
    assert entry.details == {"id": str(command.id), **move_args(), "to_broker": C}


def test_without_the_root_another_linked_primary_carries_the_move(
    brokers, orders, operator, scheduled
) -> None:
    Broker.objects.filter(name=A).update(state="down", connected=False, is_root=False)
    Broker.objects.filter(name=B).update(last_seen=timezone.now() - dt.timedelta(seconds=1))
    assert owners.move(orders[A], "spid-3", operator).broker == brokers[C]  # heard last
    Broker.objects.filter(broker_type="primary").update(connected=False)
    with pytest.raises(Conflict, match="no primary of cluster 'rk' is linked to the console"):
        owners.move(orders[A], "spid-3", operator)
    with pytest.raises(Conflict, match="no primary is linked to the console"):
        owners.rebalance("/", operator)


def test_a_rebalance_goes_to_the_root_and_is_audited(brokers, orders, operator, scheduled) -> None:
    command = owners.rebalance("/", operator)
    assert (command.broker, command.name, command.args) == (
        brokers[A],
        "queues.rebalance",
        {"vhost": "/"},
    )
    entry = AuditEntry.objects.get(action="command.queues.rebalance")
    assert entry.details == {"id": str(command.id), "vhost": "/"}


# -- acks -------------------------------------------------------------------------------------


def test_an_accepted_move_is_audited_once_and_the_owner_waits_for_the_brokers(
    brokers, orders, operator, scheduled
) -> None:
    command = owners.move(orders[B], "spid-3", operator)
    result = {"queue": "orders", "from": "spid-2", "to": "spid-3", "state": "requested"}
    for _ in range(2):  # a retried command is acked again
        commands.acknowledge(brokers[A].pk, str(command.id), True, result, None)
    command.refresh_from_db()
    assert (command.state, command.result) == ("acked", result)
    [entry] = AuditEntry.objects.filter(action="queue.move")
    assert entry.target == A and entry.details == {
        "id": str(command.id),
        "vhost": "/",
        "queue": "orders",
        "from": "spid-2",
        "to": "spid-3",
        "from_broker": B,
        "to_broker": C,
        "state": "requested",
    }
    # no fake state: B stays the owner until the brokers' statuses say otherwise
    owner = QueueSnapshot.objects.get(name="orders", master=True)
    assert owner.broker == brokers[B]


def test_a_refused_move_is_audited_as_failed_only(brokers, orders, operator, scheduled) -> None:
    command = owners.move(orders[B], "spid-3", operator)
    commands.acknowledge(brokers[A].pk, str(command.id), False, None, "a move of it is under way")
    command.refresh_from_db()
    assert (command.state, command.error) == ("failed", "a move of it is under way")
    assert AuditEntry.objects.filter(action="command.failed").count() == 1
    assert not AuditEntry.objects.filter(action="queue.move").exists()


def test_a_rebalance_ack_is_audited_with_its_moves(brokers, orders, operator, scheduled) -> None:
    command = owners.rebalance("/", operator)
    moves = [
        {"queue": "orders", "from": "spid-2", "to": "spid-3"},
        {"queue": "other", "from": "spid-x", "to": "spid-1"},
        "garbage",
    ]
    commands.acknowledge(brokers[A].pk, str(command.id), True, {"moves": moves}, None)
    entry = AuditEntry.objects.get(action="queues.rebalance")
    assert entry.details["moves"] == 2
    assert entry.details["queues"] == [
        {"queue": "orders", "from": "spid-2", "to": "spid-3", "from_broker": B, "to_broker": C},
        {"queue": "other", "from": "spid-x", "to": "spid-1", "from_broker": None, "to_broker": A},
    ]


# -- REST ---------------------------------------------------------------------------------


def api_client(user: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def api(operator: User) -> APIClient:
    return api_client(operator)


def test_rest_move_answers_202_with_the_command(brokers, orders, api: APIClient) -> None:
    response = api.post(f"/api/v1/queues/{orders[D].pk}/move/", {"to": C}, format="json")
    assert response.status_code == 202, response.json()
    body = response.json()
    assert (body["name"], body["state"], body["broker"], body["args"]) == (
        "queue.move",
        "pending",
        A,
        move_args(),
    )
    assert body["created_by"] == "op"
    by_spid = api.post(f"/api/v1/queues/{orders[B].pk}/move/", {"to": "spid-1"}, format="json")
    assert by_spid.status_code == 202 and by_spid.json()["args"]["to"] == "spid-1"
    listed = api.get("/api/v1/commands/?name=queue.move").json()
    assert listed["count"] == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "to"), ({"to": 5}, "to"), ({"to": ""}, "to"), ({"to": C, "force": True}, "force")],
)
def test_rest_move_with_a_bad_body_is_a_400(brokers, orders, api, body, field) -> None:
    response = api.post(f"/api/v1/queues/{orders[B].pk}/move/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"] and field in response.json()["detail"]
    assert Command.objects.count() == 0


@pytest.mark.parametrize(
    ("queue", "to", "reason"),
    [
        ("orders", B, "already owns queue 'orders'"),
        ("orders", "10.9.9.9:5672", "no broker of the cluster is named '10.9.9.9:5672'"),
        ("replies", A, "is classic"),
        ("amq.gen-1", B, "private to 127.0.0.1:5801: only a shared queue has an owner"),
    ],
)
def test_rest_move_that_cannot_happen_is_a_409(
    brokers, orders, classic, private, api, queue, to, reason
) -> None:
    row = QueueSnapshot.objects.filter(name=queue).first()
    response = api.post(f"/api/v1/queues/{row.pk}/move/", {"to": to}, format="json")
    assert response.status_code == 409
    assert reason in response.json()["error"]
    assert Command.objects.count() == 0


def test_rest_move_of_an_unknown_queue_is_a_404(brokers, api) -> None:
    response = api.post("/api/v1/queues/999999/move/", {"to": C}, format="json")
    assert response.status_code == 404 and "error" in response.json()


def test_rest_rebalance_defaults_to_the_default_vhost(brokers, orders, api) -> None:
    response = api.post("/api/v1/queues/rebalance/", {}, format="json")
    assert response.status_code == 202
    assert (response.json()["name"], response.json()["args"]) == (
        "queues.rebalance",
        {"vhost": "/"},
    )
    named = api.post("/api/v1/queues/rebalance/", {"vhost": "app"}, format="json")
    assert named.status_code == 202 and named.json()["args"] == {"vhost": "app"}
    bad = api.post("/api/v1/queues/rebalance/", {"vhost": 1}, format="json")
    assert bad.status_code == 400 and "vhost" in bad.json()["error"]
    Broker.objects.update(connected=False)
    nobody = api.post("/api/v1/queues/rebalance/", {}, format="json")
    assert nobody.status_code == 409 and "no primary is linked" in nobody.json()["error"]


def test_rest_moves_need_the_operator_role(brokers, orders, viewer) -> None:
    api = api_client(viewer)
    move = api.post(f"/api/v1/queues/{orders[B].pk}/move/", {"to": C}, format="json")
    rebalance = api.post("/api/v1/queues/rebalance/", {}, format="json")
    assert move.status_code == rebalance.status_code == 403
    assert "operator role" in move.json()["error"]
    assert Command.objects.count() == 0


def test_the_api_root_names_the_queue_actions(api) -> None:
    [queues] = [e for e in api.get("/api/v1/").json()["endpoints"] if e["name"] == "queue"]
    assert "/move/" in queues["description"] and "/rebalance/" in queues["description"]


# -- dashboard ---------------------------------------------------------------------------


@pytest.fixture
def op_client(operator: User) -> Client:
    client = Client()
    client.force_login(operator)
    return client


def test_the_queue_page_offers_a_move_to_the_other_primaries(brokers, orders, op_client) -> None:
    html = op_client.get(f"/queues/{orders[A].pk}/").content.decode()
    assert 'id="move-form"' in html and 'name="csrfmiddlewaretoken"' in html
    assert f'hx-post="/queues/{orders[B].pk}/move/"' in html  # the owner's row
    assert f'<option value="spid-1">{A}</option>' in html
    assert f'<option value="spid-3">{C}</option>' in html
    assert 'value="spid-2"' not in html and 'value="spid-4"' not in html  # owner, secondary
    assert f"{B}</a> owns the queue" in html


def test_a_classic_queue_offers_no_move_and_says_why(brokers, classic, op_client) -> None:
    html = op_client.get(f"/queues/{classic[A].pk}/").content.decode()
    assert 'id="move-form"' not in html
    assert 'id="move-unavailable"' in html and "a classic queue lives on its owner alone" in html


def test_without_a_linked_primary_the_page_says_so(brokers, orders, op_client) -> None:
    Broker.objects.update(connected=False)
    html = op_client.get(f"/queues/{orders[B].pk}/").content.decode()
    assert 'id="move-form"' not in html and "is linked to the console now" in html
    listing = op_client.get("/queues/").content.decode()
    assert 'id="rebalance-form"' not in listing and 'id="rebalance-unavailable"' in listing


def test_the_move_form_issues_an_audited_command(brokers, orders, op_client) -> None:
    response = op_client.post(
        f"/queues/{orders[B].pk}/move/", {"to": "spid-3"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="queue-move-result"' in html and "queue.move" in html and f"to {C}" in html
    command = Command.objects.get()
    assert (command.name, command.broker, command.args) == ("queue.move", brokers[A], move_args())
    assert AuditEntry.objects.filter(action="command.queue.move", username="op").exists()
    refused = op_client.post(f"/queues/{orders[B].pk}/move/", {"to": B}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 409 and "already owns queue" in refused.content.decode()
    empty = op_client.post(f"/queues/{orders[B].pk}/move/", {}, HTTP_HX_REQUEST="true")
    assert empty.status_code == 400 and "to: choose the primary" in empty.content.decode()
    plain = op_client.post(f"/queues/{orders[B].pk}/move/", {"to": "spid-1"})
    assert plain.status_code == 302 and plain["Location"] == f"/queues/{orders[B].pk}/"
    assert op_client.get(f"/queues/{orders[B].pk}/move/").status_code == 405


def test_the_rebalance_button_issues_an_audited_command(brokers, orders, op_client) -> None:
    html = op_client.get("/queues/").content.decode()
    assert 'id="rebalance-form"' in html and "Rebalance queues" in html
    assert '<input type="hidden" name="vhost" value="/">' in html
    response = op_client.post("/queues/rebalance/", {"vhost": "/"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert 'id="queue-rebalance-result"' in response.content.decode()
    command = Command.objects.get()
    assert (command.name, command.args) == ("queues.rebalance", {"vhost": "/"})
    commands.acknowledge(
        brokers[A].pk,
        str(command.id),
        True,
        {"moves": [{"queue": "orders", "from": "spid-2", "to": "spid-3"}]},
        None,
    )
    html = op_client.get("/queues/").content.decode()
    assert "1 move ordered" in html and f"{B} → {C}" in html
    plain = op_client.post("/queues/rebalance/", {"vhost": "/"})
    assert plain.status_code == 302 and plain["Location"] == "/queues/"


def test_viewers_see_no_buttons_and_are_refused(brokers, orders, viewer) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(viewer)
    page = client.get(f"/queues/{orders[B].pk}/").content.decode()
    listing = client.get("/queues/").content.decode()
    assert 'id="move-form"' not in page and "move-unavailable" not in page
    assert f"{B}</a> owns the queue" in page  # the owner is for everyone to read
    assert 'id="rebalance-form"' not in listing
    token = client.cookies["csrftoken"].value
    for url, data in [(f"/queues/{orders[B].pk}/move/", {"to": C}), ("/queues/rebalance/", {})]:
        assert client.post(url, data, HTTP_X_CSRFTOKEN=token).status_code == 403, url
    assert Command.objects.count() == 0


def test_a_move_without_the_csrf_token_is_refused(brokers, orders, operator) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    client.get(f"/queues/{orders[B].pk}/")
    assert client.post(f"/queues/{orders[B].pk}/move/", {"to": C}).status_code == 403
    assert client.post("/queues/rebalance/", {"vhost": "/"}).status_code == 403
    token = client.cookies["csrftoken"].value
    ok = client.post(f"/queues/{orders[B].pk}/move/", {"to": C}, HTTP_X_CSRFTOKEN=token)
    assert ok.status_code == 302 and Command.objects.count() == 1


def test_live_fragments_follow_a_move_to_its_outcome(brokers, orders, operator) -> None:
    command = owners.move(orders[B], "spid-3", operator)
    query = QueryDict(f"id={orders[B].pk}")

    def section() -> str:
        fragments = render_fragments(PAGES["queue"], query, can_operate=True)
        [move] = [f for f in fragments if 'id="queue-move"' in f]
        return move

    assert 'data-state="pending"' in section() and "has not answered yet" in section()
    result = {"queue": "orders", "from": "spid-2", "to": "spid-3", "state": "requested"}
    commands.acknowledge(brokers[A].pk, str(command.id), True, result, None)
    assert f"the root hands the queue over from {B}" in section()
    # the brokers report the new owner: the page shows it, and offers B instead of C
    QueueSnapshot.objects.filter(name="orders").update(master=False)
    QueueSnapshot.objects.filter(name="orders", broker=brokers[C]).update(master=True)
    html = section()
    assert f"{C}</a> owns the queue" in html
    assert 'value="spid-2"' in html and 'value="spid-3"' not in html
