"""The console's configuration document: validation, normalisation, checksum."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from brokerd.config import limits_document
from brokerd.configdoc import ConfigDocumentError, document_checksum, validate_document
from brokerd.model.auth import hash_password
from brokerd.model.broker import Limits

HASH = hash_password("s3cret", iterations=1000)

FULL = {
    "heartbeat": {"interval": 1, "timeout": 3.0, "open_timeout": 10},
    "known_hosts": ["127.0.0.1:5701", "LOCALHOST:5702", "127.0.0.1:5701"],
    "limits": {
        "frame_max": 131072,
        "heartbeat": 30,
        "max_queues": 1000,
        "vm_memory_high_watermark": "512MiB",
        "disk_free_limit": "1GB",
    },
    "vhosts": ["/", "app", "/"],
    "vhost_limits": {"app": {"max_connections": 5, "channel_max": 0}},
    "users": [{"name": "app", "password_hash": HASH, "tags": ["monitoring"]}],
    "permissions": [{"user": "app", "vhost": "app", "read": "^app\\."}],
}


def test_empty_document_is_valid_and_changes_nothing():
    assert validate_document({}) == {}


def test_full_document_is_normalised():
    doc = validate_document(copy.deepcopy(FULL))
    assert doc["heartbeat"] == {"interval": 1.0, "timeout": 3.0, "open_timeout": 10.0}
    assert all(isinstance(v, float) for v in doc["heartbeat"].values())
    assert doc["known_hosts"] == ["127.0.0.1:5701", "localhost:5702"]
    assert doc["limits"] == {
        **limits_document(Limits()),
        "frame_max": 131072,
        "heartbeat": 30,
        "max_queues": 1000,
        "vm_memory_high_watermark": str(512 * 1024 * 1024),
        "disk_free_limit": 10**9,
    }
    assert doc["vhost_limits"] == {
        "app": {"max_connections": 5, "max_queues": None, "max_exchanges": None, "channel_max": 0}
    }
    assert doc["vhosts"] == ["/", "app"]
    assert doc["users"] == [{"name": "app", "password_hash": HASH, "tags": ["monitoring"]}]
    assert doc["permissions"] == [
        {"user": "app", "vhost": "app", "configure": ".*", "write": ".*", "read": "^app\\."}
    ]


def test_normalising_twice_changes_nothing():
    once = validate_document(copy.deepcopy(FULL))
    assert validate_document(copy.deepcopy(once)) == once
    assert document_checksum(validate_document(once)) == document_checksum(once)


def test_partial_heartbeat_gets_the_cluster_file_defaults():
    assert validate_document({"heartbeat": {"interval": 0.5}})["heartbeat"] == {
        "interval": 0.5,
        "timeout": 3.0,
        "open_timeout": 10.0,
    }


def test_checksum_is_sha256_of_canonical_json():
    doc = {"vhosts": ["/"], "heartbeat": {"timeout": 3.0, "interval": 1.0}}
    canonical = '{"heartbeat":{"interval":1.0,"timeout":3.0},"vhosts":["/"]}'
    assert document_checksum(doc) == hashlib.sha256(canonical.encode()).hexdigest()[:16]
    assert len(document_checksum(doc)) == 16
    # key order does not matter, values do
    assert document_checksum(json.loads(json.dumps(doc))) == document_checksum(
        {"heartbeat": {"interval": 1.0, "timeout": 3.0}, "vhosts": ["/"]}
    )
    assert document_checksum(doc) != document_checksum({"vhosts": ["/", "x"]})


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "must be a JSON object"),
        ({"bogus": 1}, "bogus: unknown key"),
        ({"heartbeat": 1}, "heartbeat: must be an object"),
        ({"heartbeat": {"interval": 0}}, "heartbeat.interval must be greater than 0"),
        ({"heartbeat": {"interval": -1}}, "heartbeat.interval must be greater than 0"),
        ({"heartbeat": {"interval": "1"}}, "heartbeat.interval must be a number"),
        ({"heartbeat": {"interval": True}}, "heartbeat.interval must be a number"),
        (
            {"heartbeat": {"interval": 2, "timeout": 2}},
            "heartbeat.timeout must be greater than heartbeat.interval",
        ),
        ({"heartbeat": {"open_timeout": 0}}, "heartbeat.open_timeout must be greater than 0"),
        ({"heartbeat": {"interval": 1e9}}, "heartbeat.interval must be greater than 0 and at most"),
        ({"heartbeat": {"every": 1}}, "heartbeat: unknown key(s) 'every'"),
        ({"known_hosts": []}, "known_hosts: must be a non-empty list"),
        ({"known_hosts": "a:1"}, "known_hosts: must be a non-empty list"),
        ({"known_hosts": ["a:1", 5]}, "known_hosts[1]"),
        ({"known_hosts": ["a:99999"]}, "known_hosts[0]: known host 'a:99999' port is out of range"),
        ({"known_hosts": [":5672"]}, "known_hosts[0]: known host ':5672' has no host name"),
        ({"limits": []}, "limits: must be a table"),
        ({"limits": {"frame_mux": 1}}, "limits.frame_mux: unknown limit"),
        ({"limits": {"frame_max": 1000}}, "limits.frame_max: frame_max must be at least 4096"),
        ({"limits": {"heartbeat": 0}}, "limits.heartbeat: limit 'heartbeat' must be a positive"),
        ({"limits": {"channel_max": 70000}}, "limits.channel_max: limit 'channel_max' must be"),
        ({"limits": {"heartbeat": 1.5}}, "limits.heartbeat"),
        ({"limits": {"heartbeat": True}}, "limits.heartbeat"),
        ({"vhosts": []}, "vhosts: must be a non-empty list"),
        ({"vhosts": ["/", ""]}, "vhosts[1]: a vhost name must be a non-empty string"),
        ({"vhosts": ["/", 3]}, "vhosts[1]"),
        ({"users": []}, "users: must be a non-empty list"),
        ({"users": ["app"]}, "users[0]: must be a table/object"),
        ({"users": [{"password_hash": HASH}]}, "users[0].name"),
        (
            {"users": [{"name": "a", "password_hash": HASH}, {"name": "b", "password": "x"}]},
            "users[1]: unknown key(s) 'password'",
        ),
        (
            {"users": [{"name": "a", "password_hash": HASH}, {"name": "b", "password_hash": "pw"}]},
            "users[1].password_hash: user 'b' needs a 'password_hash' made by",
        ),
        (
            {"users": [{"name": "a", "password_hash": "pbkdf2_sha256$x$salt$abc="}]},
            "users[0].password_hash",
        ),
        (
            {"users": [{"name": "a", "password_hash": "pbkdf2_sha256$1000$salt$not base64!"}]},
            "users[0].password_hash",
        ),
        (
            {"users": [{"name": "a", "password_hash": HASH, "tags": "admin"}]},
            "users[0].tags",
        ),
        (
            {"users": [{"name": "a", "password_hash": HASH, "loopback_only": False}]},
            "users[0]: unknown key(s) 'loopback_only'",
        ),
        (
            {"users": [{"name": "a", "password_hash": HASH}, {"name": "a", "password_hash": HASH}]},
            "users[1].name: user 'a' is defined twice",
        ),
        (
            {"vhosts": ["/"], "permissions": [{"user": "a", "vhost": "/"}]},
            "permissions: need 'users'",
        ),
        (
            {"users": [{"name": "a", "password_hash": HASH}], "permissions": []},
            "permissions: need 'vhosts'",
        ),
        (
            {
                "vhosts": ["/"],
                "users": [{"name": "a", "password_hash": HASH}],
                "permissions": [{"user": "b", "vhost": "/"}],
            },
            "permissions[0].user: permission for unknown user 'b'",
        ),
        (
            {
                "vhosts": ["/"],
                "users": [{"name": "a", "password_hash": HASH}],
                "permissions": [{"user": ["a"], "vhost": "/"}],
            },
            "permissions[0].user",
        ),
        (
            {
                "vhosts": ["/"],
                "users": [{"name": "a", "password_hash": HASH}],
                "permissions": [{"user": "a", "vhost": "x"}],
            },
            "permissions[0].vhost: permission on unknown vhost 'x'",
        ),
        (
            {
                "vhosts": ["/"],
                "users": [{"name": "a", "password_hash": HASH}],
                "permissions": [{"user": "a", "vhost": "/", "write": "(unclosed"}],
            },
            "permissions[0].write: bad write pattern for 'a'",
        ),
        (
            {
                "vhosts": ["/"],
                "users": [{"name": "a", "password_hash": HASH}],
                "permissions": [{"user": "a", "vhost": "/", "read": 5}],
            },
            "permissions[0].read",
        ),
        (
            {
                "vhosts": ["/"],
                "users": [{"name": "a", "password_hash": HASH}],
                "permissions": [{"user": "a", "vhost": "/"}, {"user": "a", "vhost": "/"}],
            },
            "permissions[1]: a second permission for user 'a' on vhost '/'",
        ),
        (
            {
                "vhosts": ["/"],
                "users": [{"name": "a", "password_hash": HASH}],
                "permissions": [{"user": "a", "vhost": "/", "all": ".*"}],
            },
            "permissions[0]: unknown key(s) 'all'",
        ),
    ],
)
def test_bad_documents_name_the_key(doc, message):
    with pytest.raises(ConfigDocumentError) as info:
        validate_document(doc)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_plaintext_password_is_refused_even_if_it_looks_close():
    doc = {"users": [{"name": "a", "password_hash": "pbkdf2_sha256$s3cret"}]}
    with pytest.raises(ConfigDocumentError, match=r"^users\[0\]\.password_hash"):
        validate_document(doc)


def test_validation_does_not_modify_the_input():
    doc = copy.deepcopy(FULL)
    validate_document(doc)
    assert doc == FULL


def test_memory_watermark_is_a_fraction_or_a_size():
    assert (
        validate_document({"limits": {"vm_memory_high_watermark": 0.5}})["limits"][
            "vm_memory_high_watermark"
        ]
        == 0.5
    )
    assert (
        validate_document({"limits": {"vm_memory_high_watermark": 1}})["limits"][
            "vm_memory_high_watermark"
        ]
        == 1.0
    )
    for bad in (1.5, -0.1, True, "12 parsecs", "-5MB", [1]):
        with pytest.raises(ConfigDocumentError, match=r"^limits\.vm_memory_high_watermark: "):
            validate_document({"limits": {"vm_memory_high_watermark": bad}})


@pytest.mark.parametrize(
    ("limits", "error"),
    [
        ({"max_connections": -1}, "limits.max_connections: must be a non-negative integer"),
        ({"max_queues": "many"}, "limits.max_queues: must be a non-negative integer"),
        ({"max_unauthenticated_bytes": 10}, "limits.max_unauthenticated_bytes: must be an"),
        ({"disk_free_limit": "50 furlongs"}, "limits.disk_free_limit: must be a number of bytes"),
        ({"vm_memory_high_watermark_bytes": 5}, "unknown limit"),
    ],
)
def test_bad_new_limits_name_the_key(limits, error):
    with pytest.raises(ConfigDocumentError, match=error):
        validate_document({"limits": limits})


def test_count_limits_take_null_for_no_limit():
    doc = validate_document({"limits": {"max_connections": None, "max_exchanges": 0}})
    assert doc["limits"]["max_connections"] is None
    assert doc["limits"]["max_exchanges"] == 0


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        ({"vhost_limits": {"/": {}}}, "vhost_limits: need 'vhosts'"),
        ({"vhosts": ["/"], "vhost_limits": {"x": {}}}, "vhost_limits.x: limits for unknown"),
        ({"vhosts": ["/"], "vhost_limits": {"/": {"max_q": 1}}}, "unknown vhost limit 'max_q'"),
        ({"vhosts": ["/"], "vhost_limits": {"/": {"max_queues": 1.5}}}, "vhost_limits./.max_"),
        ({"vhosts": ["/"], "vhost_limits": ["/"]}, "vhost_limits: must be an object"),
    ],
)
def test_bad_vhost_limits_name_the_key(doc, error):
    with pytest.raises(ConfigDocumentError, match=error):
        validate_document(doc)


SHOVEL = {
    "src-uri": "amqp://",
    "src-queue": "in",
    "dest-uri": "amqp://u:s3cret@far",
    "dest-queue": "out",
}


def test_bridges_are_rabbitmq_shovel_parameters_stored_normalised():
    doc = validate_document(
        {
            "bridges": [
                {
                    "name": "b",
                    "vhost": "/",
                    "component": "shovel",
                    "value": dict(SHOVEL, **{"prefetch-count": 10}),
                }
            ]
        }
    )
    (bridge,) = doc["bridges"]
    assert bridge["name"] == "b" and bridge["vhost"] == "/"
    assert bridge["value"]["src-prefetch-count"] == 10  # the old key name, renamed
    assert validate_document(doc) == doc  # normalising twice changes nothing


@pytest.mark.parametrize(
    ("bridges", "message"),
    [
        ({}, "bridges: must be a list"),
        ([{"vhost": "/", "value": SHOVEL}], "bridges[0].name:"),
        (
            [{"name": "b", "value": dict(SHOVEL, **{"ack-mod": "no-ack"})}],
            "bridges[0].value.ack-mod:",
        ),
        (
            [{"name": "b", "value": dict(SHOVEL, **{"dest-uri": "amqp://u:s3cret@far:x"})}],
            "bridges[0].value.dest-uri:",
        ),
        ([{"name": "b", "value": "amqp://"}], "bridges[0].value:"),
        (
            [{"name": "b", "value": SHOVEL}, {"name": "b", "value": SHOVEL}],
            "bridges[1].name: bridge 'b' is defined twice",
        ),
        (
            [{"name": "b", "value": SHOVEL, "component": "federation-upstream"}],
            "bridges[0].component:",
        ),
        ([{"name": "b", "vhost": "elsewhere", "value": SHOVEL}], "bridges[0].vhost: unknown vhost"),
    ],
)
def test_bad_bridges_name_the_key_and_never_a_password(bridges, message):
    doc = {"bridges": bridges}
    if message.endswith("unknown vhost"):
        doc["vhosts"] = ["/"]
    with pytest.raises(ConfigDocumentError) as raised:
        validate_document(doc)
    assert str(raised.value).startswith(message), str(raised.value)
    assert "s3cret" not in str(raised.value)


def test_a_redacted_document_shows_no_bridge_password():
    from brokerd.configdoc import redacted_document

    doc = validate_document({"bridges": [{"name": "b", "value": SHOVEL}]})
    shown = redacted_document(doc)
    assert "s3cret" not in json.dumps(shown) and "s3cret" in json.dumps(doc)
    assert shown["bridges"][0]["value"]["dest-uri"].startswith("amqp://u:")
