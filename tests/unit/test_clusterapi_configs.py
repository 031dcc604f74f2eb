"""Configuration versions: validation, push, acks, convergence, superseding, hello."""

from __future__ import annotations

import pytest

from brokerd.configdoc import document_checksum
from clusterapi import cluster, commands, configs
from clusterapi.errors import InvalidRequest
from clusterapi.models import Alarm, AuditEntry, Broker, Command, ConfigApplication, ConfigVersion

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer")]

DOCUMENT = {
    "heartbeat": {"interval": 0.5, "timeout": 2},
    "known_hosts": ["127.0.0.1:5701", "127.0.0.1:5702"],
    "vhosts": ["/"],
}


@pytest.fixture
def brokers() -> list[Broker]:
    return [
        Broker.objects.create(name=f"127.0.0.1:570{i}", state="up", connected=True) for i in (1, 2)
    ]


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user(
        "ops", is_superuser=True
    )  # no password: hashing is slow


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({"heartbeat": {"interval": "fast"}}, "heartbeat.interval"),
        ({"heartbeat": {"interval": 2, "timeout": 1}}, "heartbeat.timeout"),
        ({"bogus": 1}, "bogus"),
        ({"known_hosts": []}, "known_hosts"),
        ({"permissions": []}, "permissions"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_documents_are_refused_naming_the_key(operator, brokers, document, key) -> None:
    with pytest.raises(InvalidRequest, match=key):
        configs.create_version(document, operator)
    assert ConfigVersion.objects.count() == 0
    assert Command.objects.count() == 0


def test_comment_is_checked(operator) -> None:
    with pytest.raises(InvalidRequest, match="comment"):
        configs.create_version(DOCUMENT, operator, comment="x" * 501)


def test_a_version_is_saved_normalised_and_pushed_to_every_broker(
    operator, brokers, scheduled, django_capture_on_commit_callbacks
) -> None:
    assert configs.current() is None
    with django_capture_on_commit_callbacks(execute=True):
        version = configs.create_version(DOCUMENT, operator, comment="faster heartbeats")
    assert version.number == 1 and configs.current() == version
    assert version.document["heartbeat"] == {"interval": 0.5, "timeout": 2.0, "open_timeout": 10.0}
    assert version.checksum == document_checksum(version.document)
    assert len(version.checksum) == 16

    pushed = Command.objects.filter(name="config.apply")
    assert sorted(c.broker.name for c in pushed) == [b.name for b in brokers]
    assert all(c.args == {"version": 1, "config": version.document} for c in pushed)
    assert sorted(scheduled) == sorted(c.id for c in pushed)
    assert set(ConfigApplication.objects.values_list("state", flat=True)) == {"pending"}
    push = AuditEntry.objects.get(action="config.push")
    assert (push.username, push.target, push.details["checksum"]) == (
        "ops",
        "version 1",
        version.checksum,
    )
    # password hashes never go to the audit log: the command entries carry the version only
    assert all(
        e.details == {"id": e.details["id"], "version": 1}
        for e in AuditEntry.objects.filter(action="command.config.apply")
    )
    assert configs.create_version(DOCUMENT, operator).number == 2


def test_convergence_follows_the_acks(operator, brokers, scheduled) -> None:
    version = configs.create_version(DOCUMENT, operator)
    first, second = (Command.objects.get(broker=b) for b in brokers)
    commands.acknowledge(
        brokers[0].pk,
        str(first.id),
        True,
        {"config_version": 1, "config_checksum": version.checksum, "applied": ["heartbeat"]},
        None,
    )
    commands.acknowledge(brokers[1].pk, str(second.id), False, None, "known_hosts: unknown host")
    assert configs.convergence(version) == [
        {"broker": brokers[0].name, "state": "acked", "checksum": version.checksum, "error": ""},
        {
            "broker": brokers[1].name,
            "state": "failed",
            "checksum": "",
            "error": "known_hosts: unknown host",
        },
    ]
    b0 = Broker.objects.get(pk=brokers[0].pk)
    assert (b0.config_version, b0.config_checksum) == (1, version.checksum)
    alarm = Alarm.objects.get(kind="config.failed", active=True)
    assert alarm.broker_id == brokers[1].pk and "known_hosts" in alarm.message

    # the next version, applied everywhere, clears the alarm
    newer = configs.create_version({**DOCUMENT, "vhosts": ["/", "prod"]}, operator)
    for broker in brokers:
        command = Command.objects.get(broker=broker, args__version=2)
        result = {"config_version": 2, "config_checksum": newer.checksum}
        commands.acknowledge(broker.pk, str(command.id), True, result, None)
    assert {c["state"] for c in configs.convergence(newer)} == {"acked"}
    assert not Alarm.objects.filter(kind="config.failed", active=True).exists()


def test_an_ack_with_another_checksum_is_not_convergence(operator, brokers, scheduled) -> None:
    version = configs.create_version(DOCUMENT, operator)
    command = Command.objects.get(broker=brokers[0])
    result = {"config_version": 1, "config_checksum": "0123456789abcdef"}
    commands.acknowledge(brokers[0].pk, str(command.id), True, result, None)
    row = configs.convergence(version)[0]
    assert row["state"] == "failed" and "expected " + version.checksum in row["error"]
    assert Alarm.objects.filter(kind="config.failed", broker=brokers[0], active=True).exists()


def test_a_newer_version_supersedes_what_is_still_on_its_way(operator, brokers, scheduled) -> None:
    configs.create_version(DOCUMENT, operator)
    configs.create_version({**DOCUMENT, "vhosts": ["/", "prod"]}, operator)
    old = Command.objects.filter(args__version=1)
    assert {(c.state, c.error) for c in old} == {("failed", "superseded by version 2")}
    assert set(
        ConfigApplication.objects.filter(version__number=1).values_list("state", flat=True)
    ) == {"failed"}
    assert set(Command.objects.filter(args__version=2).values_list("state", flat=True)) == {
        "pending"
    }


def test_hello_gets_the_current_version_once(operator, brokers, scheduled) -> None:
    version = configs.create_version(DOCUMENT, operator)
    away = Broker.objects.create(name="127.0.0.1:5703", state="up", connected=True)
    pushed = configs.reconcile(away)
    assert pushed is not None and pushed.args["version"] == 1 and pushed.created_by is None
    assert configs.reconcile(away) is None  # still on its way: no second command
    assert Command.objects.filter(broker=away).count() == 1

    # a broker that already runs the version is recorded as converged without a command
    Broker.objects.filter(pk=brokers[0].pk).update(
        config_version=1, config_checksum=version.checksum
    )
    assert configs.reconcile(Broker.objects.get(pk=brokers[0].pk)) is None
    assert ConfigApplication.objects.get(version=version, broker=brokers[0]).state == "acked"


def test_cluster_state(operator, brokers, scheduled) -> None:
    assert cluster.state() == {
        "root": None,
        "ready": False,
        "quorum": "",
        "brokers_up": 2,
        "brokers_total": 2,
        "config_version": None,
        "alarms_active": 0,
    }
    Broker.objects.filter(pk=brokers[1].pk).update(
        is_root=True, ready=True, spid="s2", quorum="quorum (2 of 2 primaries active)"
    )
    Broker.objects.filter(pk=brokers[0].pk).update(state="down")
    configs.create_version(DOCUMENT, operator)
    state = cluster.state()
    assert state["root"] == {"name": brokers[1].name, "spid": "s2"}
    assert state["ready"] is True and state["quorum"].startswith("quorum")
    assert (state["brokers_up"], state["config_version"]) == (1, 1)
