"""Dashboard pages and actions, in process with a test database.

Transactions roll back, so Celery deliveries and live notifications scheduled on
commit never run; the browser tests (tests/browser/) cover the live stack.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client
from django.utils import timezone

from clusterapi.models import (
    Alarm,
    AuditEntry,
    Broker,
    Command,
    ConfigVersion,
    HeartbeatSample,
    QueueSnapshot,
)
from clusterapi.roles import OPERATORS_GROUP
from console.dashboard.charts import message_rates
from console.dashboard.readable import absolute, detail_items, relative

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer")]

PAGES = ["/", "/brokers/", "/queues/", "/exchanges/", "/bindings/", "/config/", "/commands/"]
PAGES += ["/audit/", "/alarms/"]


@pytest.fixture
def operator(operator: User) -> Client:
    """The shared operator (``tests/unit/conftest.py``), logged in."""
    client = Client()
    client.force_login(operator)
    return client


@pytest.fixture
def viewer(viewer: User) -> Client:
    """The shared viewer, logged in, with CSRF checks on."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(viewer)
    return client


@pytest.fixture
def brokers() -> list[Broker]:
    now = timezone.now()
    out = []
    for i in range(1, 5):
        out.append(
            Broker.objects.create(
                name=f"127.0.0.1:580{i}",
                spid=f"spid-{i}",
                broker_type="secondary" if i == 4 else "primary",
                state="up",
                connected=True,
                last_seen=now - dt.timedelta(seconds=2),
                is_root=i == 1,
                ready=True,
                quorum="3 of 3 primaries",
                counts={"connections": i, "messages_ready": 10 * i},
                view={
                    "peers": [
                        {"spid": "spid-2", "type": "primary", "active": True, "rtt_ms": 1.24},
                        {"spid": "gone", "address": "10.0.0.9:5672", "active": False},
                    ]
                },
            )
        )
    return out


def test_pages_need_login(client: Client) -> None:
    for url in [*PAGES, "/brokers/127.0.0.1:5801/"]:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/"), url


def test_every_page_renders_with_the_cluster_bar_and_live_link(
    operator: Client, brokers: list[Broker]
) -> None:
    for url in [*PAGES, "/brokers/127.0.0.1:5801/"]:
        response = operator.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert 'id="cluster-bar"' in html, url
        assert 'data-root="127.0.0.1:5801"' in html, url
        assert 'ws-connect="/ws/dashboard/?page=' in html, url
        assert "X-CSRFToken" in html, url  # htmx requests carry the CSRF token


def test_overview_shows_brokers_root_states_in_words_and_relative_times(
    operator: Client, brokers: list[Broker]
) -> None:
    brokers[3].state = "down"
    brokers[3].save()
    html = operator.get("/").content.decode()
    for broker in brokers:
        assert f'data-broker="{broker.name}"' in html
    assert ">down</span>" in html and ">up</span>" in html
    assert ">root</span>" in html and "3 of 3 primaries" in html
    assert "2 s ago</time>" in html and 'title="20' in html  # absolute time on hover
    assert 'id="rate-series"' in html and "uPlot.iife.min.js" in html


def test_broker_page_shows_peer_links_objects_and_the_dump(
    operator: Client, brokers: list[Broker]
) -> None:
    QueueSnapshot.objects.create(
        broker=brokers[0], vhost="/", name="orders", messages=7, updated_at=timezone.now()
    )
    Command.objects.create(
        broker=brokers[0],
        name=Command.STATE_DUMP,
        state=Command.STATE_ACKED,
        result={"dump": "broker spid-1 state: root"},
        deadline=timezone.now(),
        finished_at=timezone.now(),
    )
    html = operator.get("/brokers/127.0.0.1:5801/").content.decode()
    assert 'href="/brokers/127.0.0.1:5802/">127.0.0.1:5802</a>' in html  # peer named
    assert "1.2 ms" in html and "inactive" in html and "10.0.0.9:5672" in html
    assert 'data-queue="orders"' in html
    assert "broker spid-1 state: root" in html
    assert "Disable root" in html and "Dump state" in html
    assert operator.get("/brokers/127.0.0.1:9999/").status_code == 404


def test_read_only_user_sees_no_command_buttons_and_cannot_post(
    viewer: Client, brokers: list[Broker]
) -> None:
    html = viewer.get("/brokers/127.0.0.1:5801/").content.decode()
    assert "Disable root" not in html and "Dump state" not in html
    assert "(read-only)" in html
    config_html = viewer.get("/config/").content.decode()
    assert "Save and push" not in config_html
    token = viewer.cookies["csrftoken"].value
    for url, data in [
        ("/brokers/127.0.0.1:5801/root/", {"enabled": "0"}),
        ("/brokers/127.0.0.1:5801/dump/", {}),
        ("/config/", {"document": "{}"}),
        ("/config/validate/", {"document": "{}"}),
    ]:
        assert viewer.post(url, data, HTTP_X_CSRFTOKEN=token).status_code == 403, url
    assert Command.objects.count() == 0 and ConfigVersion.objects.count() == 0


def test_post_without_csrf_token_is_refused(brokers: list[Broker]) -> None:
    user = User.objects.create_user("op2", password="pw-op-2")
    user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post("/brokers/127.0.0.1:5801/root/", {"enabled": "0"})
    assert response.status_code == 403
    assert Command.objects.count() == 0


def test_disable_root_issues_an_audited_command(operator: Client, brokers: list[Broker]) -> None:
    response = operator.post(
        "/brokers/127.0.0.1:5801/root/", {"enabled": "0"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    assert "root.disable" in response.content.decode()
    command = Command.objects.get()
    assert (command.name, command.broker, command.created_by.username) == (
        "root.disable",
        brokers[0],
        "op",
    )
    assert AuditEntry.objects.filter(action="command.root.disable", username="op").exists()
    plain = operator.post("/brokers/127.0.0.1:5802/dump/")
    assert plain.status_code == 302 and plain["Location"] == "/brokers/127.0.0.1:5802/"
    bad = operator.post("/brokers/127.0.0.1:5801/root/", {"enabled": "x"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "enabled" in bad.content.decode()
    assert operator.get("/brokers/127.0.0.1:5801/root/").status_code == 405


def test_config_validate_shows_errors_in_place_and_the_diff(
    operator: Client, brokers: list[Broker]
) -> None:
    broken = operator.post(
        "/config/validate/", {"document": '{"heartbeat": {"interval": -1}}'}, HTTP_HX_REQUEST="true"
    )
    html = broken.content.decode()
    assert broken.status_code == 200 and 'id="config-errors"' in html
    assert "heartbeat.interval" in html
    not_json = operator.post("/config/validate/", {"document": "{nope"}, HTTP_HX_REQUEST="true")
    assert "not valid JSON" in not_json.content.decode() and "line 1" in not_json.content.decode()
    good = operator.post(
        "/config/validate/", {"document": '{"vhosts": ["/", "staging"]}'}, HTTP_HX_REQUEST="true"
    )
    html = good.content.decode()
    assert 'id="config-valid"' in html and 'class="diff-add">+    &quot;staging&quot;' in html
    assert ConfigVersion.objects.count() == 0  # validating saves nothing


def test_config_push_saves_a_version_and_shows_convergence(
    operator: Client, brokers: list[Broker]
) -> None:
    document = {"vhosts": ["/", "staging"]}
    pushed = operator.post(
        "/config/",
        {"document": json.dumps(document), "comment": "staging vhost"},
        HTTP_HX_REQUEST="true",
    )
    assert pushed.status_code == 200
    version = ConfigVersion.objects.get()
    assert f"Version {version.number} saved" in pushed.content.decode()
    assert Command.objects.filter(name=Command.CONFIG_APPLY).count() == 4
    # convergence is what brokers report running (their statuses), not acks
    Broker.objects.filter(pk=brokers[0].pk).update(
        config_version=1, config_checksum=version.checksum
    )
    page = operator.get("/config/").content.decode()
    assert page.count(">running it</span>") == 1 and page.count(">pending</span>") == 3
    assert ">not converged</span>" in page and "1 of 4 brokers" in page
    assert "3 brokers</strong> (127.0.0.1:5802, 127.0.0.1:5803, 127.0.0.1:5804)" in page
    Broker.objects.update(config_version=1, config_checksum=version.checksum)
    page = operator.get("/config/").content.decode()
    assert ">converged</span>" in page and 'id="running-all"' in page
    # the editor opens on the current document, based on it, with the unset keys stated
    assert "&quot;staging&quot;" in page and 'name="base" value="1"' in page
    assert 'data-key="heartbeat"' in page and "each broker&#x27;s cluster file" in page
    # saving the same document again is not a new version
    same = operator.post(
        "/config/", {"document": json.dumps(document), "base": "1"}, HTTP_HX_REQUEST="true"
    )
    assert "No change: this document is version 1" in same.content.decode()
    assert ConfigVersion.objects.count() == 1
    # a bad document posted without htmx: the full page with the error in place
    bad = operator.post("/config/", {"document": '{"vhosts": 5}'})
    assert bad.status_code == 200 and 'id="config-errors"' in bad.content.decode()
    assert ConfigVersion.objects.count() == 1


def test_filters_use_the_api_semantics_and_bad_values_show_errors(
    operator: Client, brokers: list[Broker]
) -> None:
    for i, name in enumerate(["orders", "orders-dlq", "billing"]):
        QueueSnapshot.objects.create(
            broker=brokers[i], vhost="/", name=name, messages=i * 5, updated_at=timezone.now()
        )
    html = operator.get("/queues/?name_contains=orders").content.decode()
    assert 'data-queue="orders"' in html and 'data-queue="orders-dlq"' in html
    assert 'data-queue="billing"' not in html
    html = operator.get("/queues/?broker=127.0.0.1:5803").content.decode()
    assert 'data-queue="billing"' in html and 'data-queue="orders"' not in html
    bad = operator.get("/queues/?min_messages=lots")
    assert bad.status_code == 200 and 'role="alert"' in bad.content.decode()
    assert "No queues." in bad.content.decode()
    assert "min_messages=lots" in bad.content.decode()  # the live URL keeps the filters


def test_alarms_page_lists_active_and_history(operator: Client, brokers: list[Broker]) -> None:
    Alarm.objects.create(
        broker=brokers[3], kind="broker.down", message="silent", raised_at=timezone.now()
    )
    Alarm.objects.create(
        kind="link.refused", message="bad token", raised_at=timezone.now(), active=False
    )
    html = operator.get("/alarms/").content.decode()
    assert 'data-kind="broker.down"' in html and ">cleared</span>" in html
    assert ">1 active, 1 not acknowledged</strong>" in html  # the cluster bar
    alarm = Alarm.objects.get(active=True)
    acked = operator.post(
        f"/alarms/{alarm.pk}/acknowledge/", {"comment": "restarting it"}, HTTP_HX_REQUEST="true"
    )
    assert acked.status_code == 200
    assert (
        "acknowledged by op" in acked.content.decode() and "restarting it" in acked.content.decode()
    )
    assert AuditEntry.objects.filter(action="alarm.acknowledge", username="op").exists()
    html = operator.get("/alarms/").content.decode()
    assert "1 active, acknowledged" in html and ">Acknowledge</button>" not in html
    again = operator.post(f"/alarms/{alarm.pk}/acknowledge/", HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and "already" in again.content.decode()


def test_a_down_broker_is_never_shown_ready_and_offers_no_commands(
    operator: Client, brokers: list[Broker]
) -> None:
    Broker.objects.filter(pk=brokers[1].pk).update(state="down")  # ready stays True in the row
    html = operator.get("/brokers/").content.decode()
    row = html.split('data-broker="127.0.0.1:5802"')[1].split("</tr>")[0]
    assert ">unknown</span>" in row and ">ready</span>" not in row
    page = operator.get("/brokers/127.0.0.1:5802/").content.decode()
    assert "is down: it cannot run" in page and ">Dump state</button>" not in page
    secondary = operator.get("/brokers/127.0.0.1:5804/").content.decode()
    assert "secondaries are never root" in secondary and "Enable root</button>" not in secondary
    forged = operator.post(
        "/brokers/127.0.0.1:5804/root/", {"enabled": "1"}, HTTP_HX_REQUEST="true"
    )
    assert forged.status_code == 409 and "secondaries are never root" in forged.content.decode()


def test_relative_times() -> None:
    assert relative(dt.timedelta(seconds=0.2)) == "just now"
    assert relative(dt.timedelta(seconds=42)) == "42 s ago"
    assert relative(dt.timedelta(minutes=5, seconds=3)) == "5 min ago"
    assert relative(dt.timedelta(hours=3)) == "3 h ago"
    assert relative(dt.timedelta(days=2)) == "2 d ago"
    assert relative(dt.timedelta(seconds=-5)) == "in 5 s"


def test_message_rates_sum_brokers_per_bucket(brokers: list[Broker]) -> None:
    now = timezone.now().replace(microsecond=0)
    start = int(now.timestamp()) - 10
    for broker, rate in [(brokers[0], 10.0), (brokers[1], 4.0)]:
        for offset in range(5):
            HeartbeatSample.objects.create(
                broker=broker,
                time=dt.datetime.fromtimestamp(start + offset, dt.UTC),
                rate_published=rate,
                rate_delivered=rate / 2,
            )
    series = message_rates(now=now, bucket=1)
    assert series["t"] == [start + i for i in range(5)]
    assert series["published"] == [14.0] * 5 and series["delivered"] == [7.0] * 5
    # the bucket still filling is left out
    HeartbeatSample.objects.create(broker=brokers[0], time=now, rate_published=99.0)
    assert message_rates(now=now, bucket=1)["t"][-1] == start + 4


def test_latest_message_rates_extends_the_cached_series(
    brokers: list[Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.core.cache import cache

    from console.dashboard import charts

    cache.clear()
    base = int(timezone.now().timestamp()) - 20
    for offset in range(20):
        HeartbeatSample.objects.create(
            broker=brokers[0],
            time=dt.datetime.fromtimestamp(base + offset + 0.5, dt.UTC),
            rate_published=float(offset),
        )
    clock = [dt.datetime.fromtimestamp(base + 10.5, dt.UTC)]
    monkeypatch.setattr(charts.timezone, "now", lambda: clock[0])
    first = charts.latest_message_rates(window=8)
    assert first["t"] == list(range(base + 2, base + 10))
    clock[0] = dt.datetime.fromtimestamp(base + 13.2, dt.UTC)
    extended = charts.latest_message_rates(window=8)
    assert extended == charts.message_rates(
        8, now=dt.datetime.fromtimestamp(base + 13, dt.UTC), bucket=1
    )
    assert extended["t"] == list(range(base + 5, base + 13))
    assert extended["published"] == [float(i) for i in range(5, 13)]


def test_times_and_details_read_as_words() -> None:
    at = absolute("2026-01-05T14:03:07Z")
    assert at is not None and (at.text, at.iso) == (
        "5 Jan 2026 14:03:07 UTC",
        "2026-01-05T14:03:07Z",
    )
    assert absolute("not a time") is None and absolute(None) is None
    assert detail_items({"id": "c1", "version": 3, "hosts": ["a", "b"], "ok": True, "x": None}) == [
        ("id", "c1"),
        ("version", "3"),
        ("hosts", "a, b"),
        ("ok", "yes"),
    ]
    assert detail_items({"nested": {"b": 1, "a": [1, {"c": 2}]}}) == [
        ("nested", '{"a": [1, {"c": 2}], "b": 1}')
    ]


def test_broker_page_shows_flow_control_link_backlogs_and_echo_latency(
    operator: Client, brokers: list[Broker]
) -> None:
    broker = brokers[0]
    broker.view = {
        **broker.view,
        "flow": {
            "causes": {"link:spid-2": {"reason": "link to spid-2 is behind", "paused": 3}},
            "paused_connections": 3,
        },
        "lanes": {"spid-2": {"backlog": 5 * 1024 * 1024, "unsettled": 1234, "replica_lag": 77}},
        "echo_rtt": {"p99_ms": 12.5, "max_ms": 40.0},
        "loop": {"lag": {"p99_ms": 8.0}},
    }
    broker.save()
    html = operator.get("/brokers/127.0.0.1:5801/").content.decode()
    assert ">flow control</span>" in html and "link to spid-2 is behind (3 paused)" in html
    assert "5.0\xa0MB" in html and ">1234<" in html and ">77<" in html
    assert "status echo p99 12.5 ms" in html and "event loop lag p99 8.0 ms" in html
    # a broker with nothing reported shows no load line and dashes in the link columns
    html = operator.get("/brokers/127.0.0.1:5802/").content.decode()
    assert "status echo p99" not in html


def test_filter_selects_say_any_for_their_empty_choice(
    operator: Client, brokers: list[Broker]
) -> None:
    """The empty choice filters nothing: "Any", not django-filter's "Unknown" (yes/no)
    or "---------" (choices)."""
    for url in ("/queues/", "/exchanges/", "/bindings/", "/commands/", "/alarms/"):
        html = operator.get(url).content.decode()
        assert "Unknown" not in html and "---------" not in html, url
        assert '<option value="" selected>Any</option>' in html, url
    html = operator.get("/queues/?shared=true").content.decode()
    assert '<option value="true" selected>Yes</option>' in html


def shared_queue(brokers: list[Broker], **over: object) -> QueueSnapshot:
    values = {
        "broker": brokers[0],
        "vhost": "/",
        "name": "orders",
        "shared": True,
        "master": True,
        "queue_type": "quorum",
        "updated_at": timezone.now(),
    }
    values.update(over)
    return QueueSnapshot.objects.create(**values)


def test_the_move_form_starts_on_no_primary_and_asks_before_moving(
    operator: Client, brokers: list[Broker]
) -> None:
    queue = shared_queue(brokers)
    html = operator.get(f"/queues/{queue.pk}/").content.decode()
    start = html.rindex("<form", 0, html.index('id="move-form"'))
    form = html[start : html.index("</form>", start)]
    assert 'name="csrfmiddlewaretoken"' in form and f'hx-post="/queues/{queue.pk}/move/"' in form
    assert 'hx-confirm="Move the owner of queue orders to the primary chosen above?' in form
    select = form[form.index("<select") : form.index("</select>")]
    assert "required" in select.split(">", 1)[0]
    options = select.split("<option")[1:]
    assert options[0].startswith(' value="" selected>choose a primary<')
    assert [o.split('"')[1] for o in options[1:]] == ["spid-2", "spid-3"]  # not the owner
    assert all("selected" not in o for o in options[1:])
    # nothing chosen (a browser without htmx sends the empty choice): refused, nothing sent
    empty = operator.post(f"/queues/{queue.pk}/move/", {"to": ""}, HTTP_HX_REQUEST="true")
    assert empty.status_code == 400 and Command.objects.count() == 0


def test_the_root_tile_keeps_its_host_and_port_on_one_line(
    operator: Client, brokers: list[Broker]
) -> None:
    html = operator.get("/").content.decode()
    tile = html[html.index('class="tile tile-root"') :]
    tile = tile[: tile.index("</div>")]
    assert 'class="big host-name" title="127.0.0.1:5801"' in tile
    assert 'id="overview-root"' in tile and ">127.0.0.1:5801</a>" in tile
    css = (settings.BASE_DIR / "static" / "console.css").read_text()
    rule = css[css.index(".host-name {") :].split("}", 1)[0]
    assert "white-space: nowrap" in rule and "text-overflow: ellipsis" in rule


def test_the_queue_page_counts_on_across_an_owner_move(
    operator: Client, brokers: list[Broker]
) -> None:
    """What the queue page shows is the stored count (clusterapi.snapshots keeps it
    cumulative): after a move the new owner's row carries it on."""
    old = shared_queue(brokers, master=False, enqueued=500, delivered=480)
    shared_queue(brokers, broker=brokers[1], enqueued=512, delivered=490)
    html = operator.get(f"/queues/{old.pk}/").content.decode()
    assert "<dt>Enqueued</dt><dd>512</dd>" in html and "<dt>Delivered</dt><dd>490</dd>" in html
