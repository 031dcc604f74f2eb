"""Commands: validation, delivery through the channel layer, acks, retries, timeouts."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from clusterapi import commands
from clusterapi.cluster import broker_group
from clusterapi.errors import Conflict, InvalidRequest
from clusterapi.models import AuditEntry, Broker, Command

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer")]


@pytest.fixture
def broker() -> Broker:
    return Broker.objects.create(
        name="127.0.0.1:5701", state="up", connected=True, broker_type="primary"
    )


@pytest.fixture
def link_channel(broker: Broker) -> str:
    """A channel in the broker's group, standing in for its link consumer."""
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(broker_group(broker.pk), channel)
    return channel


def received(channel: str) -> dict:
    return async_to_sync(get_channel_layer().receive)(channel)


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("root.explode", None, "command: unknown command 'root.explode'"),
        ("root.enable", [1], "args: must be an object"),
        ("root.disable", {"now": True}, "args: root.disable takes no arguments"),
        ("config.apply", {}, "args.version"),
        ("config.apply", {"version": 7}, "there is no configuration version 7"),
        ("config.apply", {"version": 1, "force": True}, "args.force"),
    ],
)
def test_bad_requests_are_refused_with_the_field(broker, operator, name, args, message) -> None:
    with pytest.raises(InvalidRequest, match=message):
        commands.issue(broker, name, args, operator)
    assert Command.objects.count() == 0


@pytest.mark.parametrize(
    ("changes", "name", "reason"),
    [
        ({"broker_type": "secondary"}, "root.enable", "secondaries are never root"),
        ({"broker_type": "standalone"}, "root.disable", "no cluster to be root of"),
        ({"state": "down"}, "state.dump", "is down: it cannot run state.dump"),
        ({"root_enabled": True}, "root.enable", "root is enabled"),
        ({"root_enabled": False}, "root.disable", "root is disabled"),
    ],
)
def test_what_the_broker_cannot_do_is_refused_with_the_reason(
    broker, operator, changes, name, reason
) -> None:
    for field, value in changes.items():
        setattr(broker, field, value)
    broker.save()
    with pytest.raises(Conflict, match=reason):
        commands.issue(broker, name, None, operator)
    assert Command.objects.count() == 0


def test_issue_records_audits_and_schedules(
    broker, operator, scheduled, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        command = commands.issue(broker, "root.disable", None, operator)
    assert command.state == "pending" and command.attempts == 0
    assert command.created_by == operator
    remaining = (command.deadline - command.created_at).total_seconds()
    assert 59 < remaining <= 60
    assert scheduled == [command.id]
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.target, entry.username) == (
        "command.root.disable",
        broker.name,
        "op",
    )
    assert entry.details == {"id": str(command.id)}


def test_delivery_goes_to_the_broker_group_and_retries(
    broker, operator, scheduled, link_channel
) -> None:
    command = commands.issue(broker, "state.dump", None, operator)
    now = dt.datetime.now(dt.UTC)
    assert commands.deliver(command.id, now)
    assert received(link_channel) == {
        "type": "broker.command",
        "id": str(command.id),
        "command": "state.dump",
        "args": {},
    }
    command.refresh_from_db()
    assert (command.state, command.attempts, command.sent_at) == ("sent", 1, now)
    # sent a moment ago: not again yet; the sweep re-sends after COMMAND_RETRY_SECONDS
    assert not commands.deliver(command.id, now + dt.timedelta(seconds=0.5))
    assert commands.sweep(now + dt.timedelta(seconds=1))["sent"] == 0
    assert commands.sweep(now + dt.timedelta(seconds=2.5)) == {"timed_out": 0, "sent": 1}
    assert received(link_channel)["id"] == str(command.id)
    command.refresh_from_db()
    assert command.attempts == 2 and command.sent_at == now  # sent_at: the first send


def test_delivery_waits_while_the_broker_is_away(broker, operator, scheduled) -> None:
    Broker.objects.filter(pk=broker.pk).update(connected=False)
    command = commands.issue(broker, "state.dump", None, operator)
    assert not commands.deliver(command.id)
    command.refresh_from_db()
    assert (command.state, command.attempts) == ("pending", 0)


def test_acks_finish_commands_and_record_what_changed(broker, operator, scheduled) -> None:
    disable = commands.issue(broker, "root.disable", None, operator)
    commands.deliver(disable.id)
    done = commands.acknowledge(broker.pk, str(disable.id), True, {"root_enabled": False}, None)
    assert done is not None and done.state == "acked"
    disable.refresh_from_db()
    assert disable.result == {"root_enabled": False} and disable.finished_at is not None
    assert Broker.objects.get(pk=broker.pk).root_enabled is False
    assert AuditEntry.objects.filter(action="command.acked", target=broker.name).exists()

    dump = commands.issue(broker, "state.dump", None, operator)
    commands.acknowledge(broker.pk, str(dump.id), False, None, "control socket busy")
    dump.refresh_from_db()
    assert (dump.state, dump.error) == ("failed", "control socket busy")
    assert AuditEntry.objects.filter(action="command.failed").exists()


def test_acks_for_unknown_or_foreign_commands_are_ignored(broker, operator, scheduled) -> None:
    other = Broker.objects.create(name="127.0.0.1:5702", state="up", connected=True)
    command = commands.issue(broker, "state.dump", None, operator)
    assert commands.acknowledge(other.pk, str(command.id), True, {}, None) is None
    assert commands.acknowledge(broker.pk, str(uuid.uuid4()), True, {}, None) is None
    assert commands.acknowledge(broker.pk, "not-a-uuid", True, {}, None) is None
    command.refresh_from_db()
    assert command.state == "pending"


def test_timeout_at_the_deadline_and_late_acks_do_not_revive(
    broker, operator, scheduled, link_channel
) -> None:
    command = commands.issue(broker, "state.dump", None, operator)
    commands.deliver(command.id)
    late = command.deadline + dt.timedelta(seconds=1)
    assert commands.sweep(late) == {"timed_out": 1, "sent": 0}
    command.refresh_from_db()
    assert command.state == "timed_out" and "1 attempt" in command.error
    assert AuditEntry.objects.filter(action="command.timed_out").exists()
    commands.acknowledge(broker.pk, str(command.id), True, {"root_enabled": True}, None)
    command.refresh_from_db()
    assert command.state == "timed_out"
    assert not commands.deliver(command.id)


def test_deliver_after_the_deadline_times_out(broker, operator, scheduled) -> None:
    command = commands.issue(broker, "state.dump", None, operator)
    assert not commands.deliver(command.id, command.deadline)
    command.refresh_from_db()
    assert command.state == "timed_out"


def test_celery_task_delivers(broker, operator, scheduled, link_channel) -> None:
    from clusterapi import tasks

    command = commands.issue(broker, "state.dump", None, operator)
    assert tasks.deliver_command.apply(args=[str(command.id)]).get() is True
    assert received(link_channel)["command"] == "state.dump"
    assert tasks.sweep_commands.apply().get() == {"timed_out": 0, "sent": 0}
