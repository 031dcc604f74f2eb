"""Shared objects shown once (clusterapi.objects) through the REST API, in process.

Three primaries A (root), B, C and a standalone broker S. The shared queue
``jobs`` is mastered on A with proxies on B and C; ``mine`` is a private queue of
B and of C (two queues with one name); wiring of the cluster vhost is on A, B, C.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from clusterapi import objects
from clusterapi.models import BindingSnapshot, Broker, ExchangeSnapshot, QueueSnapshot

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer")]

A, B, C, S = "127.0.0.1:5701", "127.0.0.1:5702", "127.0.0.1:5703", "127.0.0.1:5799"


@pytest.fixture
def api() -> APIClient:
    client = APIClient()
    client.force_authenticate(User.objects.create_user("viewer", password="pw-viewer-1"))
    return client


def queue(broker: Broker, name: str, **over: Any) -> QueueSnapshot:
    values: dict[str, Any] = {"vhost": "/", "name": name, "updated_at": timezone.now()}
    values.update(over)
    return QueueSnapshot.objects.create(broker=broker, **values)


@pytest.fixture
def brokers() -> dict[str, Broker]:
    out = {}
    for name in (A, B, C, S):
        out[name] = Broker.objects.create(
            name=name,
            spid=f"spid-{name[-1]}",
            broker_type="standalone" if name == S else "primary",
            cluster="" if name == S else "test",
            state="up",
            is_root=name == A,
            counts={"messages_ready": {A: 4, B: 0, C: 1, S: 2}[name]},
        )
    a, b, c, s = out.values()
    queue(
        a,
        "jobs",
        shared=True,
        messages=4,
        consumers=3,
        local_consumers=0,
        consumer_servers={"spid-2": 2, "spid-3": 1},
    )
    queue(b, "jobs", shared=True, master=False, consumers=2, local_consumers=2)
    queue(c, "jobs", shared=True, master=False, consumers=1, local_consumers=1)
    queue(b, "mine", exclusive=True, consumers=1, local_consumers=1)
    queue(c, "mine", exclusive=True, messages=1)
    for broker in (a, b, c):
        ExchangeSnapshot.objects.create(
            broker=broker,
            vhost="/",
            name="work",
            type="direct",
            shared=True,
            updated_at=timezone.now(),
        )
        BindingSnapshot.objects.create(
            broker=broker,
            vhost="/",
            source="work",
            destination="jobs",
            destination_type="queue",
            routing_key="j",
            shared=True,
            updated_at=timezone.now(),
        )
    BindingSnapshot.objects.create(
        broker=b,
        vhost="/",
        source="work",
        destination="mine",
        destination_type="queue",
        routing_key="m",
        updated_at=timezone.now(),
    )
    ExchangeSnapshot.objects.create(
        broker=s, vhost="/", name="work", type="direct", updated_at=timezone.now()
    )
    return out


def listed(api: APIClient, path: str) -> list[dict[str, Any]]:
    response = api.get(path)
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def test_a_shared_queue_is_listed_once_from_its_master(
    api: APIClient, brokers: dict[str, Broker]
) -> None:
    rows = listed(api, "/api/v1/queues/?name=jobs")
    assert len(rows) == 1
    [jobs] = rows
    assert (jobs["broker"], jobs["master"], jobs["messages"], jobs["consumers"]) == (A, True, 4, 3)
    assert jobs["consumer_servers"] == [
        {"broker": B, "spid": "spid-2", "consumers": 2},
        {"broker": C, "spid": "spid-3", "consumers": 1},
    ]
    # private queues of one name on two brokers are two queues
    mine = listed(api, "/api/v1/queues/?name=mine")
    assert sorted(q["broker"] for q in mine) == [B, C]
    assert [q["consumer_servers"] for q in mine if q["broker"] == B] == [
        [{"broker": B, "spid": "spid-2", "consumers": 1}]
    ]
    assert api.get("/api/v1/queues/").json()["count"] == 3


def test_broker_means_the_master_and_consumers_on_finds_where_consumers_are(
    api: APIClient, brokers: dict[str, Broker]
) -> None:
    assert [q["name"] for q in listed(api, f"/api/v1/queues/?broker={A}")] == ["jobs"]
    assert [q["name"] for q in listed(api, f"/api/v1/queues/?broker={B}")] == ["mine"]
    on_b = listed(api, f"/api/v1/queues/?consumers_on={B}")
    assert sorted((q["name"], q["broker"]) for q in on_b) == [("jobs", A), ("mine", B)]
    on_c = listed(api, f"/api/v1/queues/?consumers_on={brokers[C].pk}")
    assert [(q["name"], q["broker"]) for q in on_c] == [("jobs", A)]  # C's "mine" has none
    assert listed(api, f"/api/v1/queues/?consumers_on={A}") == []
    assert listed(api, "/api/v1/queues/?consumers_on=nobody:1") == []
    assert api.get("/api/v1/queues/?consumers_on=").status_code == 400


def test_any_row_of_a_queue_has_the_per_broker_breakdown(
    api: APIClient, brokers: dict[str, Broker]
) -> None:
    proxy = QueueSnapshot.objects.get(broker=brokers[B], name="jobs")
    body = api.get(f"/api/v1/queues/{proxy.pk}/").json()
    assert (body["broker"], body["master"], body["messages"]) == (B, False, 0)
    assert body["consumer_servers"] == []  # a proxy does not know
    assert [(r["broker"], r["master"], r["local_consumers"]) for r in body["per_broker"]] == [
        (A, True, 0),
        (B, False, 2),
        (C, False, 1),
    ]
    private = QueueSnapshot.objects.get(broker=brokers[C], name="mine")
    body = api.get(f"/api/v1/queues/{private.pk}/").json()
    assert [r["broker"] for r in body["per_broker"]] == [C]


def test_the_master_row_wins_after_a_root_change_and_a_proxy_stands_in_without_one(
    brokers: dict[str, Broker],
) -> None:
    def shown() -> list[tuple[str, bool]]:
        return [(q.broker.name, q.master) for q in objects.queues().filter(name="jobs")]

    assert shown() == [(A, True)]
    # B became root; A (the old root) still looks up and reported earlier
    later = timezone.now() + dt.timedelta(seconds=1)
    QueueSnapshot.objects.filter(broker__name=B, name="jobs").update(master=True, updated_at=later)
    assert shown() == [(B, True)]
    # two up masters: the fresher one; a master on a broker marked down loses to an up one
    QueueSnapshot.objects.filter(broker__name=A, name="jobs").update(
        updated_at=later + dt.timedelta(seconds=5)
    )
    assert shown() == [(A, True)]
    Broker.objects.filter(name=A).update(state="down")
    assert shown() == [(B, True)]
    # nobody reports mastering it: one up proxy's row stands in, saying so
    QueueSnapshot.objects.filter(name="jobs").update(master=False)
    assert shown() == [(B, False)]
    assert objects.counts()["shared_queues"] == 1


def test_shared_wiring_is_listed_once_with_the_brokers_that_have_it(
    api: APIClient, brokers: dict[str, Broker]
) -> None:
    rows = listed(api, "/api/v1/exchanges/?name=work")
    shared = [x for x in rows if x["shared"]]
    assert [(x["broker"], x["servers"]) for x in shared] == [(A, 3)]  # the root's copy
    assert [(x["broker"], x["servers"]) for x in rows if not x["shared"]] == [(S, 1)]
    # `broker` lists what a broker has: shared wiring included
    assert [(x["shared"], x["broker"]) for x in listed(api, f"/api/v1/exchanges/?broker={B}")] == [
        (True, A)
    ]
    assert [x["broker"] for x in listed(api, f"/api/v1/exchanges/?broker={S}")] == [S]
    copy = ExchangeSnapshot.objects.get(broker=brokers[C], name="work")
    body = api.get(f"/api/v1/exchanges/{copy.pk}/").json()
    assert body["servers"] == 3
    assert [(r["broker"], r["state"]) for r in body["per_broker"]] == [
        (A, "up"),
        (B, "up"),
        (C, "up"),
    ]

    bindings = listed(api, "/api/v1/bindings/?source=work")
    assert sorted((b["destination"], b["shared"], b["servers"]) for b in bindings) == [
        ("jobs", True, 3),
        ("mine", False, 1),
    ]
    assert len(listed(api, f"/api/v1/bindings/?broker={C}")) == 1  # the shared one only
    assert len(listed(api, "/api/v1/bindings/?shared=false")) == 1
    body = api.get(f"/api/v1/bindings/{bindings[0]['id']}/").json()
    assert len(body["per_broker"]) == body["servers"]


def test_without_a_root_shared_wiring_is_shown_from_an_up_broker(
    brokers: dict[str, Broker],
) -> None:
    Broker.objects.filter(name=A).update(is_root=False, state="down")
    [shown] = objects.exchanges().filter(name="work", shared=True)
    assert shown.broker.name == B  # up, and the oldest row of the up ones


def test_cluster_counts_count_shared_objects_once(
    api: APIClient, brokers: dict[str, Broker]
) -> None:
    state = api.get("/api/v1/cluster/").json()
    assert (state["queues"], state["shared_queues"]) == (3, 1)
    assert (state["exchanges"], state["bindings"]) == (2, 2)
    assert state["messages_ready"] == 4 + 0 + 1 + 2
    held = {b["name"]: b["queues_held"] for b in listed(api, "/api/v1/brokers/")}
    assert held == {A: 1, B: 1, C: 1, S: 0}
    assert api.get(f"/api/v1/brokers/{B}/").json()["queues_held"] == 1
    # the shared queue counts on its owner only; B's private queue is not shared
    owned = {b["name"]: b["shared_owned"] for b in listed(api, "/api/v1/brokers/")}
    assert owned == {A: 1, B: 0, C: 0, S: 0}


# -- the dashboard shows the same ------------------------------------------------------------


@pytest.fixture
def page() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("reader", password="pw-reader-1"))
    return client


def rows_of(html: str, attribute: str, value: str) -> list[str]:
    """The opening tags of the table rows with ``attribute="value"``."""
    return re.findall(rf'<tr {attribute}="{re.escape(value)}"[^>]*>', html)


def test_the_queues_page_lists_a_shared_queue_once_with_where_its_consumers_are(
    page: Client, brokers: dict[str, Broker]
) -> None:
    html = page.get("/queues/").content.decode()
    [jobs] = rows_of(html, "data-queue", "jobs")
    assert f'data-broker="{A}"' in jobs and 'data-master="true"' in jobs
    assert len(rows_of(html, "data-queue", "mine")) == 2  # private: per broker
    assert f'<span class="spread" data-broker="{B}">' in html
    assert "3 queues across the cluster" in html
    # the same filters as the API: consumers on C is the shared queue only
    html = page.get(f"/queues/?consumers_on={C}").content.decode()
    assert len(rows_of(html, "data-queue", "jobs")) == 1 and "mine" not in html


def test_a_queue_page_shows_the_master_and_every_proxy(
    page: Client, brokers: dict[str, Broker]
) -> None:
    proxy = QueueSnapshot.objects.get(broker=brokers[C], name="jobs")
    html = page.get(f"/queues/{proxy.pk}/").content.decode()
    assert "shared: one queue for the whole cluster" in html
    assert re.search(rf'id="queue-master"><a href="/brokers/{re.escape(A)}/">', html)
    assert 'id="queue-ready">4<' in html
    table = html[html.index('id="per-broker"') :]
    roles = re.findall(r'<td class="role">(\w+)</td>', table)
    assert roles == ["master", "proxy", "proxy"]
    assert 'ws-connect="/ws/dashboard/?page=queue&amp;id=' in html
    assert page.get("/queues/999999/").status_code == 404
    assert page.get("/queues/99999999999999999999/").status_code == 404
    anonymous = Client().get(f"/queues/{proxy.pk}/")
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]


def test_wiring_pages_list_shared_objects_once_with_their_brokers(
    page: Client, brokers: dict[str, Broker]
) -> None:
    html = page.get("/exchanges/?name=work").content.decode()
    assert len(rows_of(html, "data-exchange", "work")) == 2  # the shared one, and S's own
    assert ">3 brokers</a>" in html
    shared = ExchangeSnapshot.objects.get(broker=brokers[B], name="work")
    html = page.get(f"/exchanges/{shared.pk}/").content.decode()
    assert "3 brokers</caption>" in html and 'id="not-reported"' not in html
    ExchangeSnapshot.objects.filter(broker=brokers[C], name="work").delete()
    html = page.get(f"/exchanges/{shared.pk}/").content.decode()
    assert f"Not reported by {C}" in html  # not replicated there (yet)
    html = page.get("/bindings/").content.decode()
    assert len(rows_of(html, "data-binding", "work|jobs|j")) == 1
    assert len(rows_of(html, "data-binding", "work|mine|m")) == 1


def test_overview_and_broker_pages_count_shared_queues_once(
    page: Client, brokers: dict[str, Broker]
) -> None:
    html = page.get("/").content.decode()
    assert 'id="overview-queues">3<' in html and "1 shared, each counted once" in html
    assert 'id="overview-wiring">2 exchanges<' in html
    assert re.findall(r'<td class="num queues-held">(\d+)</td>', html) == ["1", "1", "1", "0"]
    html = page.get(f"/brokers/{B}/").content.decode()
    assert "1 of them is a proxy" in html
    assert re.search(r'<tr data-queue="jobs"[^>]*data-master="false"', html)


# -- a replicated queue's replica set, as its master reports it ------------------------------

REPLICAS = [
    {"spid": "spid-3", "in_sync": False, "behind": 12},
    {"spid": "<b>gone</b>", "in_sync": True, "behind": 0},  # not linked to the console
    {"spid": "spid-2", "in_sync": True, "behind": 0},
]


def test_the_api_lists_the_replicas_by_broker_with_their_sync_state(
    api: APIClient, brokers: dict[str, Broker]
) -> None:
    QueueSnapshot.objects.filter(broker=brokers[A], name="jobs").update(
        queue_type="replicated", replicas=REPLICAS
    )
    expected = [
        {"broker": B, "spid": "spid-2", "in_sync": True, "behind": 0},
        {"broker": C, "spid": "spid-3", "in_sync": False, "behind": 12},
        {"broker": None, "spid": "<b>gone</b>", "in_sync": True, "behind": 0},
    ]
    [jobs] = listed(api, "/api/v1/queues/?name=jobs")
    assert jobs["replicas"] == expected
    master = QueueSnapshot.objects.get(broker=brokers[A], name="jobs")
    assert api.get(f"/api/v1/queues/{master.pk}/").json()["replicas"] == expected
    proxy = QueueSnapshot.objects.get(broker=brokers[B], name="jobs")
    assert api.get(f"/api/v1/queues/{proxy.pk}/").json()["replicas"] == []  # not known there
    assert [q["replicas"] for q in listed(api, "/api/v1/queues/?name=mine")] == [[], []]


def test_the_pages_show_the_replicas_in_sync_escaped(
    page: Client, brokers: dict[str, Broker]
) -> None:
    QueueSnapshot.objects.filter(broker=brokers[A], name="jobs").update(
        queue_type="replicated", replicas=REPLICAS
    )
    html = page.get("/queues/").content.decode()
    assert re.search(r'class="replica-summary state state-warn"[^>]*>3 replicas, 2 in sync<', html)
    proxy = QueueSnapshot.objects.get(broker=brokers[C], name="jobs")
    html = page.get(f"/queues/{proxy.pk}/").content.decode()
    assert 'id="queue-type">replicated<' in html
    assert "its owner (one of the primaries), copied to the other primaries" in html
    replicas = html[html.index('id="queue-replicas"') : html.index("</ul>")]
    shown = re.findall(
        r'<li class="replica" data-broker="([^"]+)">.*?class="state (state-\w+)"', replicas, re.S
    )
    assert shown == [
        (B, "state-good"),
        (C, "state-warn"),
        ("&lt;b&gt;gone&lt;/b&gt;", "state-good"),
    ]
    assert "12 events behind" in replicas and "<b>gone</b>" not in html
    # all in sync: no warning in the list; a root alone: none
    QueueSnapshot.objects.filter(broker=brokers[A], name="jobs").update(replicas=REPLICAS[1:])
    html = page.get("/queues/").content.decode()
    assert re.search(r'class="replica-summary"[^>]*>2 replicas, 2 in sync<', html)
    QueueSnapshot.objects.filter(broker=brokers[A], name="jobs").update(replicas=[])
    html = page.get(f"/queues/{proxy.pk}/").content.decode()
    assert "the root holds the only copy" in html
    assert "replica-summary" not in page.get("/queues/").content.decode()
    # a classic shared queue: on its owner alone
    QueueSnapshot.objects.filter(name="jobs").update(queue_type="classic")
    html = page.get(f"/queues/{proxy.pk}/").content.decode()
    assert "its messages on its owner alone" in html and 'id="queue-replicas"' not in html
