"""Drift shown as the difference (issue 25): the console's version against the
configuration a broker reports in force, key by key, with each value's source."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from clusterapi import configs, convergence, inforce, ingest
from clusterapi.ingest import LinkProtocolError, LinkState
from clusterapi.models import Broker
from tests.support.linkmessages import hello as link_hello

NAME = "10.0.0.1:5701"
#: brokerd hash-password x (a real one: the console validates documents with brokerd's rules)
HASH = "pbkdf2_sha256$120000$fff5187b873224a2e638770b$T9Q4Msu1KH+lgJqpaW0CePg3O48ppd6q8ZMqQOLf/hM="

VERSION = {
    "heartbeat": {"interval": 1.0, "timeout": 3.0, "open_timeout": 10.0},
    "limits": {"frame_max": 131072, "channel_max": 2047},
    "vhosts": ["/"],
    "users": [{"name": "app", "password_hash": HASH, "tags": []}],
    "permissions": [{"user": "app", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
}

IN_FORCE = {
    "document": {
        "heartbeat": {"interval": 1.0, "timeout": 3.0, "open_timeout": 10.0},
        "known_hosts": ["10.0.0.2:5701", "10.0.0.1:5701"],
        "limits": {"frame_max": 65536, "channel_max": 2047},
        "vhosts": ["/"],
        "users": [{"name": "app", "tags": []}, {"name": "ops", "tags": ["administrator"]}],
        "permissions": [],
    },
    "sources": {
        "heartbeat": "file",
        "known_hosts": "file",
        "limits.frame_max": "file",
        "limits.channel_max": "default",
        "vhosts": "default",
        "users": "file",
        "permissions": "file",
    },
}


def by_key(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in rows}


def test_the_diff_says_what_differs_and_where_the_broker_value_comes_from() -> None:
    rows = by_key(inforce.diff(VERSION, IN_FORCE))
    frame = rows["limits.frame_max"]
    assert (frame["status"], frame["version"], frame["broker"], frame["source"]) == (
        "changed",
        131072,
        65536,
        "file",
    )
    assert rows["limits.channel_max"]["status"] == "same"
    assert rows["limits.channel_max"]["source"] == "default"
    assert rows["heartbeat.timeout"] == {**rows["heartbeat.timeout"], "status": "same"}
    assert rows["heartbeat.timeout"]["source"] == "file"  # per part when not per key
    ops = rows["users.ops"]
    assert (ops["status"], ops["broker"], ops["source"]) == (
        "added",
        {"tags": ["administrator"]},
        "file",
    )
    assert rows["users.app"]["status"] == "same"  # the version's hash is not compared
    perm = rows["permissions.app@/"]
    assert perm["status"] == "removed" and perm["version"]["read"] == ".*"
    assert not perm["on_broker"] and perm["source"] == ""
    # parts the version leaves to the broker are its own, not differences
    assert rows["known_hosts"]["status"] == "own"
    assert rows["known_hosts"]["broker"] == ["10.0.0.1:5701", "10.0.0.2:5701"]
    view = inforce.view(VERSION, IN_FORCE)
    assert {r["key"] for r in view["differences"]} == {
        "limits.frame_max",
        "users.ops",
        "permissions.app@/",
    }
    assert inforce.view(VERSION, None) == {"reported": False}


def test_vhost_limits_are_compared_per_vhost_and_key() -> None:
    ours = {"vhost_limits": {"/": {"max_queues": 10, "max_connections": None}}}
    theirs = {"document": {"vhost_limits": {"/": {"max_queues": 20, "max_connections": None}}}}
    rows = by_key(inforce.diff(ours, {**theirs, "sources": {"vhost_limits": "console"}}))
    assert rows["vhost_limits./.max_queues"]["status"] == "changed"
    assert rows["vhost_limits./.max_queues"]["source"] == "console"
    assert rows["vhost_limits./.max_connections"]["status"] == "same"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ([], "in_force must be an object"),
        ({"document": [], "sources": {}}, "document must be an object"),
        ({"document": {}, "sources": []}, "sources must be an object"),
        ({"document": {}, "sources": {"limits.frame_max": "elsewhere"}}, "console, file or"),
    ],
)
def test_malformed_in_force_is_refused(value: Any, error: str) -> None:
    with pytest.raises(LinkProtocolError, match=error):
        inforce.parse(value, "hello")


def test_a_password_hash_is_never_kept() -> None:
    sent = copy.deepcopy(IN_FORCE)
    sent["document"]["users"][0]["password_hash"] = "pbkdf2_sha256$1$x$y"
    parsed = inforce.parse(sent, "hello")
    assert "password_hash" not in str(parsed)


# -- stored from the link ----------------------------------------------------------------------


def hello(spid: str = "spid-1", **over: Any) -> dict[str, Any]:
    return link_hello(NAME, spid, checksum=None, **over)


def status(seq: int, **over: Any) -> dict[str, Any]:
    msg = {
        "v": 1,
        "type": "status",
        "seq": seq,
        "time": time.time(),
        "full": True,
        "view": {"is_root": False, "ready": True, "root_enabled": True},
        "counts": {},
        "totals": {},
        "rates": {},
        "queues": [],
    }
    msg.update(over)
    return msg


@pytest.fixture(autouse=True)
def in_memory_layer(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.mark.django_db
def test_hello_stores_it_a_status_replaces_it_only_when_it_carries_it() -> None:
    broker, _ = ingest.register_hello(ingest.parse_hello(hello(in_force=IN_FORCE)), "c1")
    assert broker.in_force == IN_FORCE and broker.in_force_at is not None
    link = LinkState(broker.pk, broker.name, broker.broker_type, spid="spid-1")
    ingest.apply_status(link, status(0))
    assert Broker.objects.get().in_force == IN_FORCE
    changed = copy.deepcopy(IN_FORCE)
    changed["document"]["limits"]["frame_max"] = 4096
    outcome = ingest.apply_status(link, status(1, in_force=changed))
    assert outcome.config_changed
    assert Broker.objects.get().in_force["document"]["limits"]["frame_max"] == 4096
    with pytest.raises(LinkProtocolError, match=r"status\.in_force"):
        ingest.apply_status(link, status(2, in_force={"document": {}}))
    # a new run of an older brokerd: what the last run ran says nothing now
    broker, _ = ingest.register_hello(ingest.parse_hello(hello("spid-2")), "c2")
    assert broker.in_force is None and broker.in_force_at is None


# -- shown -----------------------------------------------------------------------------------


@pytest.fixture
def drifted(operator: User) -> Broker:
    """The current version, and a broker on its own files reporting what it runs."""
    configs.save(VERSION, operator)
    broker, _ = ingest.register_hello(ingest.parse_hello(hello(in_force=IN_FORCE)), "c1")
    return broker


@pytest.mark.django_db
def test_the_config_page_shows_the_drift_key_by_key(drifted: Broker, operator: User) -> None:
    [row] = convergence.broker_rows(configs.current())
    assert row["state"] == "drifted"
    client = Client()
    client.force_login(operator)
    html = client.get("/config/").content.decode()
    assert 'class="in-force-row" data-in-force-for="10.0.0.1:5701"' in html
    assert 'data-key="limits.frame_max" data-status="changed"' in html
    assert 'data-key="users.ops" data-status="added"' in html
    assert "<code>65536</code>" in html and "<code>131072</code>" in html
    # the editor's diff against what it runs: its document in force, not {}
    [group] = convergence.running_groups()
    assert group["document"] == IN_FORCE["document"]


@pytest.mark.django_db
def test_the_broker_page_shows_both_sides_with_sources(drifted: Broker, operator: User) -> None:
    client = Client()
    client.force_login(operator)
    html = client.get(f"/brokers/{NAME}/").content.decode()
    assert 'id="broker-in-force"' in html and "against version 1" in html
    start = html.index('data-key="limits.frame_max" data-status="changed"')
    row = html[start : html.index("</tr>", start)]
    assert "131072" in row and "65536" in row and '<td class="source">file</td>' in row
    assert 'data-key="permissions.app@/" data-status="removed"' in html


@pytest.mark.django_db
def test_the_api_shows_what_it_reports(drifted: Broker, viewer: User) -> None:
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(viewer)
    body = client.get(f"/api/v1/brokers/{NAME}/").json()
    assert body["in_force"]["sources"]["limits.frame_max"] == "file"


@pytest.mark.django_db
def test_the_api_convergence_lists_the_differences(drifted: Broker, viewer: User) -> None:
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(viewer)
    [row] = client.get("/api/v1/configs/1/").json()["convergence"]
    assert row["state"] == "drifted"
    frame = next(d for d in row["differences"] if d["key"] == "limits.frame_max")
    assert frame == {
        "key": "limits.frame_max",
        "status": "changed",
        "version": 131072,
        "broker": 65536,
        "source": "file",
    }


@pytest.mark.django_db
def test_what_the_brokers_run_diffs_only_the_parts_the_version_sets(drifted: Broker) -> None:
    """known_hosts is the broker's own (the version does not set it): kept, not a
    removal in the diff; a part both set that differs is a change."""
    from console.dashboard.config_context import running_diffs

    [group] = running_diffs(VERSION, "version 1")
    assert group["kept"] == ["known_hosts"]
    lines = [line for kind, line in group["changes"] if kind in ("add", "del")]
    assert not any("known_hosts" in line or "10.0.0.2:5701" in line for line in lines)
    assert any("65536" in line for line in lines) and any("131072" in line for line in lines)


@pytest.mark.django_db
def test_a_broker_page_without_a_version_shows_what_is_in_force_alone(operator: User) -> None:
    """No version saved: nothing to compare with, so no 'no difference' sentence, just
    the keys in force and their sources."""
    ingest.register_hello(ingest.parse_hello(hello(in_force=IN_FORCE)), "c1")
    client = Client()
    client.force_login(operator)
    html = client.get(f"/brokers/{NAME}/").content.decode()
    assert 'id="in-force-no-version"' in html
    assert "No difference in the keys the version sets" not in html
    assert 'data-key="limits.frame_max"' in html and "Against the version" not in html
