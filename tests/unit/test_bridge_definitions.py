"""Shovel URIs and definitions: RabbitMQ's syntax and defaults, errors that name the key."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokerd.bridges.definitions import (
    DEFAULT_PREFETCH,
    NEVER,
    ON_CONFIRM,
    DefinitionError,
    parse_shovel,
)
from brokerd.bridges.uri import AMQPS_PORT, UriError, parse_uri, redact

# -- URIs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "vhost"),
    [
        ("amqp://h", "/"),  # no path: the default vhost
        ("amqp://h/", ""),  # an empty segment: the vhost "" (RabbitMQ's URI spec)
        ("amqp://h/%2f", "/"),
        ("amqp://h/prod", "prod"),
        ("amqp://h/a%2Fb", "a/b"),
    ],
)
def test_the_vhost_is_read_as_rabbitmqs_uri_spec_says(raw: str, vhost: str) -> None:
    assert parse_uri(raw).vhost == vhost


def test_a_uri_without_a_host_means_this_broker() -> None:
    uri = parse_uri("amqp://")
    assert uri.local and uri.vhost == "/" and uri.redacted == "amqp://"
    assert parse_uri("amqp:///other").vhost == "other"


def test_users_ports_and_tls_options_are_read_and_the_password_never_shown() -> None:
    uri = parse_uri(
        "amqps://bridge:s%40cret@broker.example:5999/site?cacertfile=/ca.pem"
        "&server_name_indication=rabbit.example&heartbeat=10&auth_mechanism=external"
    )
    assert (uri.username, uri.password, uri.port, uri.vhost) == ("bridge", "s@cret", 5999, "site")
    assert uri.tls and uri.verify and uri.server_name == "rabbit.example"
    assert uri.heartbeat == 10 and uri.mechanism == "external"
    assert "s@cret" not in uri.redacted and "s%40cret" not in uri.redacted
    assert uri.redacted.startswith("amqps://bridge:***@broker.example:5999/site?")
    assert "s@cret" not in repr(uri)
    assert parse_uri("amqps://h").port == AMQPS_PORT


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("http://h", "scheme"),
        ("amqp://h:99999", "port"),
        ("amqp://h?hartbeat=1", "unknown query parameter 'hartbeat'"),
        ("amqp://h?cacertfile=/ca.pem", "needs amqps"),
        ("amqps://h?verify=maybe", "verify"),
        ("amqp://h/a/b", "one path segment"),
        ("amqp://h?heartbeat=-1", "heartbeat"),
        ("amqp://h?auth_mechanism=kerberos", "auth_mechanism"),
        ("", "non-empty"),
        ("amqp://h x", "spaces"),
    ],
)
def test_bad_uris_are_refused_with_the_part_named(raw: str, said: str) -> None:
    with pytest.raises(UriError, match=said):
        parse_uri(raw)


def test_redact_hides_the_password_even_of_a_uri_that_does_not_parse() -> None:
    assert redact("amqp://u:pw@h:99999") == "amqp://u:***@h:99999"
    assert "pw" not in redact("amqp://u:pw@h/x?nonsense=1")


@given(st.text(min_size=1, max_size=40))
def test_a_password_never_survives_redaction(password: str) -> None:
    from urllib.parse import quote

    raw = f"amqp://user:{quote(password, safe='')}@host/v"
    uri = parse_uri(raw)
    assert uri.password == password
    assert "***" in uri.redacted
    assert parse_uri(uri.redacted).password == "***"


# -- definitions ------------------------------------------------------------------------------

MINIMAL = {
    "src-uri": "amqp://",
    "src-queue": "in",
    "dest-uri": "amqp://remote",
    "dest-queue": "out",
}


def test_rabbitmqs_defaults_apply() -> None:
    shovel = parse_shovel("s", MINIMAL)
    assert shovel.ack_mode == ON_CONFIRM and shovel.prefetch == DEFAULT_PREFETCH
    assert shovel.reconnect_delay == 5.0 and shovel.delete_after == NEVER
    assert not shovel.add_forward_headers
    exchange = parse_shovel("e", {**MINIMAL, "src-queue": None, "src-exchange": "x"} | {})
    assert exchange.source.exchange_key == "#"  # every message of the exchange


def test_a_definition_from_rabbitmqs_documentation_is_accepted_unchanged() -> None:
    # the example of RabbitMQ's dynamic shovel guide, with the old key names too
    shovel = parse_shovel(
        "my-shovel",
        {
            "src-protocol": "amqp091",
            "src-uri": "amqp://",
            "src-queue": "source-queue",
            "dest-protocol": "amqp091",
            "dest-uri": "amqp://remote-server",
            "dest-queue": "destination-queue",
            "prefetch-count": 50,
            "add-forward-headers": True,
            "delete-after": "queue-length",
            "ack-mode": "on-publish",
            "reconnect-delay": 1,
        },
    )
    assert shovel.prefetch == 50 and shovel.add_forward_headers
    assert shovel.delete_after == "queue-length" and shovel.ack_mode == "on-publish"
    assert "prefetch-count" not in shovel.document and shovel.document["src-prefetch-count"] == 50


def test_public_form_hides_passwords_and_keeps_lists() -> None:
    shovel = parse_shovel("s", {**MINIMAL, "dest-uri": ["amqp://u:secret@a", "amqp://u:secret@b"]})
    public = shovel.public()
    assert public["dest-uri"] == ["amqp://u:***@a", "amqp://u:***@b"]
    assert "secret" not in repr(public) and "secret" in repr(shovel.document)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"src-uri": "http://x"}, "src-uri"),
        ({"dest-uri": []}, "dest-uri"),
        ({"ack-mode": "on-confirmation"}, "ack-mode"),
        ({"src-prefetch-count": 0}, "src-prefetch-count"),
        ({"src-prefetch-count": True}, "src-prefetch-count"),
        ({"reconnect-delay": -1}, "reconnect-delay"),
        ({"src-delete-after": "sometimes"}, "src-delete-after"),
        ({"src-delete-after": -3}, "src-delete-after"),
        ({"dest-add-forward-headers": "yes"}, "dest-add-forward-headers"),
        ({"src-protocol": "amqp10"}, "src-protocol"),
        ({"surprise": 1}, "surprise"),
        ({"src-exchange": "x"}, "src-exchange"),  # and src-queue: not both
        ({"dest-exchange-key": "k"}, "dest-exchange-key"),  # with dest-queue
        ({"dest-publish-properties": {"colour": "red"}}, "dest-publish-properties"),
        ({"prefetch-count": 5, "src-prefetch-count": 5}, "src-prefetch-count"),
    ],
)
def test_bad_definitions_name_the_key_at_fault(change: dict[str, object], field: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_shovel("s", {**MINIMAL, **change})
    assert caught.value.field == field, str(caught.value)


def test_a_source_and_a_uri_are_required() -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_shovel("s", {"src-uri": "amqp://", "dest-uri": "amqp://"})
    assert caught.value.field == "src-queue"
    with pytest.raises(DefinitionError) as caught:
        parse_shovel("s", {"src-queue": "q", "dest-uri": "amqp://"})
    assert caught.value.field == "src-uri"
    with pytest.raises(DefinitionError) as caught:
        parse_shovel("bad\nname", MINIMAL)
    assert caught.value.field == "name"
