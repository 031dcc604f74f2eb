"""Stale-broker detection, alarms, sample retention and the beat schedule."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from clusterapi import alarms, cluster, ingest
from clusterapi.models import Alarm, AuditEntry, Broker, HeartbeatSample, QueueSample

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def stale_settings(settings, in_memory_layer) -> None:
    settings.BROKER_STALE_INTERVALS = 3


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
    assert alarm.active and alarm.broker == silent and "no status for" in alarm.message
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
