"""Configuration versions: validation, saving and pushing again, convergence from what
brokers report, drift, superseding, hello."""

from __future__ import annotations

import pytest

from brokerd.configdoc import document_checksum
from clusterapi import cluster, commands, configs, convergence
from clusterapi.errors import Conflict, InvalidDocument, InvalidRequest
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


def ack(broker: Broker, version: ConfigVersion, ok: bool = True, error: str = "") -> None:
    """The broker answers its open config.apply of ``version``."""
    command = Command.objects.get(broker=broker, args__version=version.number, state="pending")
    result = {"config_version": version.number, "config_checksum": version.checksum}
    commands.acknowledge(broker.pk, str(command.id), ok, result if ok else None, error or None)


def reports(broker: Broker, version: ConfigVersion | None) -> None:
    """A status of ``broker`` saying it runs ``version`` (None: its own files)."""
    Broker.objects.filter(pk=broker.pk).update(
        config_version=version.number if version else None,
        config_checksum=version.checksum if version else "",
    )
    convergence.check_drift(Broker.objects.get(pk=broker.pk))


def states(version: ConfigVersion) -> list[str]:
    return [row["state"] for row in convergence.broker_rows(version)]


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
    with pytest.raises(InvalidDocument, match=key):
        configs.save(document, operator)
    assert ConfigVersion.objects.count() == 0
    assert Command.objects.count() == 0


def test_comment_is_checked(operator) -> None:
    with pytest.raises(InvalidRequest, match="comment"):
        configs.save(DOCUMENT, operator, comment="x" * 501)


def test_a_version_is_saved_normalised_and_pushed_to_every_broker_that_is_up(
    operator, brokers, scheduled, django_capture_on_commit_callbacks
) -> None:
    down = Broker.objects.create(name="127.0.0.1:5709", state="down")
    assert configs.current() is None
    with django_capture_on_commit_callbacks(execute=True):
        saved = configs.save(DOCUMENT, operator, comment="faster heartbeats")
    version = saved.version
    assert saved.outcome == configs.CREATED
    assert version.number == 1 and configs.current() == version
    assert version.document["heartbeat"] == {"interval": 0.5, "timeout": 2.0, "open_timeout": 10.0}
    assert version.checksum == document_checksum(version.document)

    pushed = Command.objects.filter(name="config.apply")
    assert sorted(c.broker.name for c in pushed) == [b.name for b in brokers]  # not the down one
    assert not pushed.filter(broker=down).exists()
    serial = version.push_serial
    assert all(
        c.args == {"version": 1, "config": version.document, "serial": serial} for c in pushed
    )
    assert sorted(scheduled) == sorted(c.id for c in pushed)
    push = AuditEntry.objects.get(action="config.push")
    assert (push.username, push.target, push.details["checksum"]) == (
        "op",
        "version 1",
        version.checksum,
    )
    # password hashes never go to the audit log: the command entries carry the version only
    assert all(
        e.details == {"id": e.details["id"], "version": 1}
        for e in AuditEntry.objects.filter(action="command.config.apply")
    )
    # unset keys are stated with what they mean
    assert [u["key"] for u in convergence.unset_keys(version.document)] == [
        "limits",
        "vhost_limits",
        "users",
        "permissions",
        "bridges",
        "federation_upstreams",
        "policies",
    ]


def test_the_same_document_is_not_a_new_version_and_an_older_one_is_pushed_again(
    operator, brokers, scheduled
) -> None:
    first = configs.save(DOCUMENT, operator).version
    again = configs.save({**DOCUMENT, "heartbeat": {"timeout": 2, "interval": 0.5}}, operator)
    assert (again.version, again.outcome) == (first, configs.UNCHANGED)
    assert Command.objects.count() == 2  # nothing pushed the second time

    second = configs.save({**DOCUMENT, "vhosts": ["/", "prod"]}, operator).version
    assert configs.current() == second
    back = configs.save(DOCUMENT, operator, comment="back to 1")
    assert (back.version, back.outcome) == (first, configs.REPUSHED)
    assert ConfigVersion.objects.count() == 2
    assert configs.current() == first  # the version pushed last is current
    first.refresh_from_db()
    assert first.push_serial > second.push_serial
    # version 2's pushes stopped, shown as superseded; version 1 went out again
    assert set(Command.objects.filter(args__version=2).values_list("state", flat=True)) == {
        "superseded"
    }
    open_first = Command.objects.filter(args__version=1, state="pending")
    assert {c.args["serial"] for c in open_first} == {first.push_serial}
    assert AuditEntry.objects.filter(action="config.repush", target="version 1").exists()


def test_a_new_version_starts_from_the_current_one(operator, brokers, scheduled) -> None:
    assert configs.derive({"vhosts": ["/"]}) == {"vhosts": ["/"]}  # nothing saved yet
    configs.save(DOCUMENT, operator)
    changed = configs.derive({"vhosts": ["/", "prod"], "known_hosts": None})
    assert changed == {
        "heartbeat": DOCUMENT["heartbeat"] | {"open_timeout": 10.0},
        "vhosts": ["/", "prod"],
    }
    with pytest.raises(InvalidDocument, match=r"changes\.bogus"):
        configs.derive({"bogus": 1})
    # an edit that started from another version than the current one is refused
    with pytest.raises(Conflict, match="current configuration is version 1"):
        configs.save(changed, operator, base=7)
    assert configs.save(changed, operator, base=1).version.number == 2


def test_convergence_is_what_brokers_report_running(operator, brokers, scheduled) -> None:
    version = configs.save(DOCUMENT, operator).version
    assert states(version) == ["pending", "pending"]
    ack(brokers[0], version)
    ack(brokers[1], version, ok=False, error="known_hosts: unknown host")
    rows = convergence.broker_rows(version)
    assert [r["state"] for r in rows] == ["running", "failed"]
    assert rows[0]["running"] == "version 1" and rows[1]["running"] == "its own configuration files"
    assert rows[1]["error"] == "known_hosts: unknown host"
    assert not convergence.converged(rows)
    assert Alarm.objects.get(kind="config.failed", active=True).broker_id == brokers[1].pk
    assert not Alarm.objects.filter(kind="config.drift", active=True).exists()

    # pushed again: the broker running it still runs it; applied everywhere: converged,
    # the failure alarm cleared
    configs.repush(version, operator)
    assert states(version) == ["running", "pending"]
    for broker in brokers:
        ack(broker, version)
    assert convergence.converged(convergence.broker_rows(version))
    assert not Alarm.objects.filter(kind="config.failed", active=True).exists()


def test_a_broker_that_stops_running_the_version_has_drifted_until_pushed_again(
    operator, brokers, scheduled
) -> None:
    version = configs.save(DOCUMENT, operator).version
    for broker in brokers:
        ack(broker, version)
    # a reload (or a restart the console did not push to) puts it back on its own files
    reports(brokers[1], None)
    assert states(version) == ["running", "drifted"]
    drift = Alarm.objects.get(kind="config.drift", active=True)
    assert drift.broker_id == brokers[1].pk
    assert "runs its own configuration files, not version 1" in drift.message
    configs.repush(version, operator)
    assert states(version) == ["running", "pending"]
    assert Alarm.objects.filter(kind="config.drift", active=True).exists()  # until it runs it
    ack(brokers[1], version)
    assert states(version) == ["running", "running"]
    assert not Alarm.objects.filter(kind="config.drift", active=True).exists()


def test_a_down_broker_is_not_converged(operator, brokers, scheduled) -> None:
    version = configs.save(DOCUMENT, operator).version
    for broker in brokers:
        ack(broker, version)
    Broker.objects.filter(pk=brokers[0].pk).update(state="down")
    rows = convergence.broker_rows(version)
    assert [r["state"] for r in rows] == ["down", "running"]
    assert not convergence.converged(rows)
    assert convergence.summary(rows) == "1 down, 1 running it"


def test_an_ack_with_another_checksum_is_a_failure(operator, brokers, scheduled) -> None:
    version = configs.save(DOCUMENT, operator).version
    command = Command.objects.get(broker=brokers[0])
    result = {"config_version": 1, "config_checksum": "0123456789abcdef"}
    commands.acknowledge(brokers[0].pk, str(command.id), True, result, None)
    row = convergence.broker_rows(version)[0]
    assert row["state"] == "failed" and "expected " + version.checksum in row["error"]
    assert row["running"] == "an unknown configuration (checksum 0123456789abcdef)"
    assert Alarm.objects.filter(kind="config.failed", broker=brokers[0], active=True).exists()


def test_a_newer_push_supersedes_what_is_still_on_its_way(operator, brokers, scheduled) -> None:
    configs.save(DOCUMENT, operator)
    configs.save({**DOCUMENT, "vhosts": ["/", "prod"]}, operator)
    old = Command.objects.filter(args__version=1)
    assert {(c.state, c.error) for c in old} == {
        ("superseded", "superseded by the push of version 2")
    }
    assert set(
        ConfigApplication.objects.filter(version__number=1).values_list("state", flat=True)
    ) == {"superseded"}
    assert set(Command.objects.filter(args__version=2).values_list("state", flat=True)) == {
        "pending"
    }
    # a late ack of the superseded push is recorded as what the broker runs, and no alarm
    late = old.first()
    result = {"config_version": 1, "config_checksum": ConfigVersion.objects.get(number=1).checksum}
    commands.acknowledge(late.broker_id, str(late.id), True, result, None)
    late.refresh_from_db()
    assert late.state == "superseded"
    assert not Alarm.objects.filter(kind="config.failed").exists()


def test_hello_gets_the_current_version_once(operator, brokers, scheduled) -> None:
    version = configs.save(DOCUMENT, operator).version
    away = Broker.objects.create(name="127.0.0.1:5703", state="up", connected=True)
    pushed = configs.reconcile(away)
    assert pushed is not None and pushed.args["version"] == 1 and pushed.created_by is None
    assert configs.reconcile(away) is None  # still on its way: no second command
    assert Command.objects.filter(broker=away).count() == 1

    # a broker that already runs the version gets no command
    Broker.objects.filter(pk=brokers[0].pk).update(
        config_version=1, config_checksum=version.checksum
    )
    before = Command.objects.count()
    assert configs.reconcile(Broker.objects.get(pk=brokers[0].pk)) is None
    assert Command.objects.count() == before


def test_cluster_state(operator, brokers, scheduled) -> None:
    clustered = any(b.broker_type != Broker.TYPE_STANDALONE for b in brokers)
    assert cluster.state() == {
        "clustered": clustered,
        "root": None,
        "ready": False,
        "quorum": "",
        "brokers_up": 2,
        "brokers_total": 2,
        "config_version": None,
        "alarms_active": 0,
        "alarms_unacknowledged": 0,
    }
    Broker.objects.filter(pk=brokers[1].pk).update(
        is_root=True, ready=True, spid="s2", quorum="quorum (2 of 2 primaries active)"
    )
    Broker.objects.filter(pk=brokers[0].pk).update(state="down")
    configs.save(DOCUMENT, operator)
    state = cluster.state()
    assert state["clustered"] is True  # a root reports: a cluster, whatever the types
    assert state["root"] == {"name": brokers[1].name, "spid": "s2"}
    assert state["ready"] is True and state["quorum"].startswith("quorum")
    assert (state["brokers_up"], state["config_version"]) == (1, 1)
