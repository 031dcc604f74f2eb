"""Stale-broker detection, alarms, sample retention and the beat schedule."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from clusterapi import alarms, cluster, ingest, presence
from clusterapi.models import (
    Alarm,
    AuditEntry,
    Broker,
    ConsoleProcess,
    HeartbeatSample,
    QueueSample,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def stale_settings(settings, in_memory_layer, console_hearing) -> None:
    settings.BROKER_STALE_INTERVALS = 3
    settings.BROKER_RECONNECT_GRACE = 6


def make_broker(name: str, silent_for: float, interval: float = 1.0) -> Broker:
    return Broker.objects.create(
        name=name,
        state="up",
        connected=True,
        heartbeat_interval=interval,
        last_seen=timezone.now() - dt.timedelta(seconds=silent_for),
    )


def test_a_silent_broker_goes_down_with_an_alarm_and_comes_back() -> None:
    silent = make_broker("127.0.0.1:5701", silent_for=3.5)
    make_broker("127.0.0.1:5702", silent_for=2.5)  # within 3 intervals
    make_broker("127.0.0.1:5703", silent_for=20, interval=10.0)  # slow heartbeats, fine

    assert cluster.detect_stale() == ["127.0.0.1:5701"]
    silent.refresh_from_db()
    assert silent.state == "down"
    alarm = Alarm.objects.get(kind="broker.down")
    assert alarm.active and alarm.broker == silent and "no status since" in alarm.message
    assert AuditEntry.objects.filter(action="broker.down", target=silent.name).exists()
    assert cluster.detect_stale() == []  # once
    assert Alarm.objects.filter(kind="broker.down").count() == 1

    # its hello brings it back: up, alarm cleared (kept as history), audited
    hello = ingest.parse_hello(
        {
            "v": 1,
            "type": "hello",
            "spid": "new-run",
            "name": silent.name,
            "broker_type": "primary",
            "heartbeat_interval": 1.0,
        }
    )
    _, came_back = ingest.register_hello(hello, "chan")
    assert came_back
    alarm.refresh_from_db()
    assert not alarm.active and alarm.cleared_at is not None
    assert Broker.objects.get(pk=silent.pk).state == "up"
    assert AuditEntry.objects.filter(action="broker.up", target=silent.name).exists()


def test_refused_link_alarms_clear_after_quiet_minutes() -> None:
    alarm, new = alarms.raise_alarm(
        alarms.LINK_REFUSED, "refused a broker link from x: wrong token"
    )
    again, new_again = alarms.raise_alarm(alarms.LINK_REFUSED, "refused a broker link from y")
    assert new and not new_again and again.pk == alarm.pk
    cluster.detect_stale(timezone.now() + dt.timedelta(seconds=60))
    assert Alarm.objects.get(pk=alarm.pk).active
    cluster.detect_stale(timezone.now() + dt.timedelta(seconds=301))
    assert not Alarm.objects.get(pk=alarm.pk).active


def test_retention_drops_old_samples(settings) -> None:
    settings.HEARTBEAT_RETENTION = 48
    broker = make_broker("127.0.0.1:5701", silent_for=0)
    now = timezone.now()
    for hours in (1, 47, 49, 100):
        time = now - dt.timedelta(hours=hours)
        HeartbeatSample.objects.create(broker=broker, time=time)
        QueueSample.objects.create(broker=broker, time=time, vhost="/", queue="q")
    assert cluster.prune_samples(now) == {"heartbeats": 2, "queue_samples": 2}
    assert HeartbeatSample.objects.count() == QueueSample.objects.count() == 2
    oldest = HeartbeatSample.objects.order_by("time").first()
    assert oldest is not None and now - oldest.time < dt.timedelta(hours=48)


def test_beat_schedules_the_housekeeping(settings) -> None:
    from console.celery import app

    schedule = {entry["task"]: entry["schedule"] for entry in app.conf.beat_schedule.values()}
    assert schedule["clusterapi.tasks.sweep_commands"] == float(settings.COMMAND_RETRY_SECONDS)
    assert schedule["clusterapi.tasks.detect_stale_brokers"] == float(settings.STALE_CHECK_SECONDS)
    assert schedule["clusterapi.tasks.prune_heartbeats"] == 3600.0


def test_tasks_run_the_plain_functions() -> None:
    from clusterapi import tasks

    make_broker("127.0.0.1:5701", silent_for=60)
    assert tasks.detect_stale_brokers.apply().get() == ["127.0.0.1:5701"]
    assert tasks.prune_heartbeats.apply().get() == {"heartbeats": 0, "queue_samples": 0}


# -- the console's own restarts (issue 45) ------------------------------------------------


def _processes(*rows: tuple[float, float]) -> None:
    """Console processes as (started, last beat), in seconds before now; replaces all."""
    now = timezone.now()
    ConsoleProcess.objects.all().delete()
    for index, (started, beat) in enumerate(rows):
        ConsoleProcess.objects.create(
            host="h",
            pid=index + 10,
            started_at=now - dt.timedelta(seconds=started),
            beat_at=now - dt.timedelta(seconds=beat),
        )


def test_nobody_is_judged_while_no_console_process_beats() -> None:
    make_broker("127.0.0.1:5701", silent_for=100)
    _processes((3600, 30))  # the console stopped 30 s ago: the silence is its own
    assert cluster.detect_stale() == []
    ConsoleProcess.objects.all().delete()  # or never ran
    assert cluster.detect_stale() == []


def test_a_console_that_stopped_before_the_broker_was_overdue_proves_nothing() -> None:
    make_broker("127.0.0.1:5701", silent_for=3.5)  # overdue 0.5 s ago
    _processes((3600, 2))  # last beat 2 s ago: still counted as beating, but not since
    assert cluster.detect_stale() == []
    _processes((3600, 0))
    assert cluster.detect_stale() == ["127.0.0.1:5701"]


def test_after_a_console_restart_brokers_get_their_reconnect_grace() -> None:
    """The console was away for 40 s and came back 2 s ago: a broker that has not
    linked again yet is not down until grace (6 s) + allowance (3 s) have passed since
    the restart, then it is, with the time it was last heard."""
    back = make_broker("127.0.0.1:5701", silent_for=0.5)  # linked again already
    dead = make_broker("127.0.0.1:5702", silent_for=42)  # died while the console was away
    _processes((3600, 40), (2, 0))
    assert cluster.detect_stale() == []
    later = timezone.now() + dt.timedelta(seconds=6)
    ConsoleProcess.objects.filter(pid=11).update(beat_at=later)
    Broker.objects.filter(pk=back.pk).update(last_seen=later)
    assert cluster.detect_stale(later) == []  # 8 s since the restart < 6 + 3
    latest = later + dt.timedelta(seconds=3.5)
    ConsoleProcess.objects.filter(pid=11).update(beat_at=latest)
    Broker.objects.filter(pk=back.pk).update(last_seen=latest)
    assert cluster.detect_stale(latest) == [dead.name]
    alarm = Alarm.objects.get(kind="broker.down")
    assert dead.last_seen is not None
    assert f"no status since {dead.last_seen:%H:%M:%S} UTC" in alarm.message
    assert "not linked again 6 s after the console's link restarted" in alarm.message


def test_brokers_of_a_console_process_that_stopped_move_to_another_in_their_grace() -> None:
    make_broker("127.0.0.1:5701", silent_for=7)  # was linked to the process that stopped
    _processes((3600, 0), (3600, 6))
    assert cluster.detect_stale() == []  # 7 s < 6 s (since its stop) + grace + allowance
    later = timezone.now() + dt.timedelta(seconds=10)
    ConsoleProcess.objects.filter(pid=10).update(beat_at=later)
    assert cluster.detect_stale(later) == ["127.0.0.1:5701"]


def test_the_beat_registers_once_and_forgets_old_processes() -> None:
    _processes((200_000, 100_000))  # silent for more than a day
    beat = presence.Beat()
    beat.beat()
    beat.beat()
    rows = list(ConsoleProcess.objects.all())
    assert len(rows) == 1 and rows[0].pk == beat.row.pk  # type: ignore[union-attr]
    assert presence.hearing().live
