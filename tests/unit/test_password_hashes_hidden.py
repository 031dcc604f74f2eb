"""Broker users' password hashes never leave the console (issue 46).

A configuration version with users (PBKDF2 hashes), pushed to a broker (a
``config.apply`` command carrying the document), audited: every page and every API
endpoint (each URL pattern, filled in with these objects' identifiers), read by a
read-only user and by a superuser, carries no ``pbkdf2_sha256$`` anywhere. The
broker link still gets the hash, and a document saved back without hashes keeps
them.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from brokerd.model.auth import hash_password
from clusterapi import configs, passwords
from clusterapi.errors import InvalidDocument
from clusterapi.models import AuditEntry, Broker, Command, ConfigVersion
from tests.support.urls import every_path, sample

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer", "scheduled")]

MARK = "pbkdf2_sha256$"
#: a bridge's password (issue 42): write-only too
SECRET = "far-s3cret-pw"
BRIDGE = {
    "name": "to-far",
    "vhost": "/",
    "value": {
        "src-uri": "amqp://",
        "src-queue": "in",
        "dest-uri": f"amqp://site:{SECRET}@far.example",
        "dest-queue": "out",
    },
}
DOCUMENT = {
    "vhosts": ["/"],
    "users": [{"name": "app", "password_hash": hash_password("app-secret", iterations=1000)}],
    "permissions": [{"user": "app", "vhost": "/"}],
    "bridges": [BRIDGE],
}


@pytest.fixture
def pushed(operator: Any) -> dict[str, Any]:
    # linked, and reporting the members: /cluster/members/ answers them, not a 503
    broker = Broker.objects.create(
        name="127.0.0.1:5701",
        broker_type="primary",
        state="up",
        connected=True,
        view={"members": {"version": 0, "members": [{"address": "127.0.0.1:5701"}]}},
    )
    saved = configs.save(DOCUMENT, operator, "with a user")
    command = Command.objects.get(name=Command.CONFIG_APPLY)
    assert MARK in str(command.args) and SECRET in str(command.args)  # the broker link's
    return {"broker": broker, "version": saved.version, "command": command}


def fill(objects: dict[str, Any]) -> Any:
    version: ConfigVersion = objects["version"]
    command: Command = objects["command"]
    by_model = {
        "configversion": str(version.pk),
        "command": str(command.pk),
        "broker": str(objects["broker"].pk),
        "auditentry": str(AuditEntry.objects.order_by("pk").values_list("pk", flat=True)[0]),
    }

    def value(pattern: str, name: str, kind: str) -> str:
        if pattern.startswith("admin/clusterapi/"):
            model = pattern.split("/")[2]
            if model in by_model:
                return by_model[model]
        if "config" in pattern and name == "number":
            return str(version.number)
        if "commands" in pattern:
            return command.pk.hex
        if "brokers" in pattern:
            return objects["broker"].name
        return sample(pattern, name, kind)

    return value


@pytest.mark.parametrize("who", ["viewer", "superuser"])
def test_no_page_or_endpoint_shows_a_password_hash(
    who: str, pushed: dict[str, Any], viewer: Any, django_user_model: Any
) -> None:
    if who == "superuser":
        user = django_user_model.objects.create_superuser("root", password="root-pass-1")
    else:
        user = viewer
    client = Client()
    client.force_login(user)
    paths = every_path(fill(pushed))
    assert f"/api/v1/configs/{pushed['version'].number}/" in paths
    assert f"/admin/clusterapi/command/{pushed['command'].pk}/change/" in paths
    shown = []
    for path in paths:
        if path.endswith(("/logout/", "/delete/")):
            continue  # a GET there changes nothing, but ends the session or asks to
        response = client.get(path, HTTP_ACCEPT="text/html,application/json")
        body = b"".join(response.streaming_content) if response.streaming else response.content
        if MARK.encode() in body or SECRET.encode() in body:
            shown.append(path)
        assert response.status_code < 500, (path, response.status_code)
    assert shown == []


def test_a_document_saved_back_without_hashes_keeps_them(
    pushed: dict[str, Any], operator: Any
) -> None:
    version = pushed["version"]
    shown = passwords.hidden(version.document)
    assert MARK not in str(shown)
    again = configs.save({**shown, "vhosts": ["/", "other"]}, operator, "a vhost more")
    assert again.outcome == configs.CREATED
    assert (
        again.version.document["users"][0]["password_hash"]
        == (DOCUMENT["users"][0]["password_hash"])
    )
    # the same document without hashes is the current version: nothing to save
    assert configs.save(passwords.hidden(again.version.document), operator).outcome == (
        configs.UNCHANGED
    )


def test_a_new_user_still_needs_a_hash(pushed: dict[str, Any], operator: Any) -> None:
    document = {**DOCUMENT, "users": [*DOCUMENT["users"], {"name": "new"}]}
    with pytest.raises(InvalidDocument, match=r"users\[1\]\.password_hash"):
        configs.save(document, operator)


def test_the_audit_of_a_push_names_the_version_not_the_document(
    pushed: dict[str, Any],
) -> None:
    assert not [e for e in AuditEntry.objects.all() if MARK in str(e.details)]


def test_a_bridge_saved_back_redacted_keeps_its_password(
    pushed: dict[str, Any], operator: Any
) -> None:
    shown = passwords.hidden(pushed["version"].document)
    assert SECRET not in str(shown)
    assert shown["bridges"][0]["value"]["dest-uri"] == "amqp://site:***@far.example"
    again = configs.save({**shown, "vhosts": ["/", "other"]}, operator, "a vhost more")
    assert again.version.document["bridges"][0]["value"]["dest-uri"].endswith(
        f"{SECRET}@far.example"
    )
    # a new bridge, or a URI changed, needs its password in full
    renamed = {**shown, "bridges": [{**shown["bridges"][0], "name": "other"}]}
    with pytest.raises(InvalidDocument, match=r"bridges\[0\]\.value\.dest-uri: the password"):
        configs.save(renamed, operator)
