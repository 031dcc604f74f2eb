"""Fixtures the unit tests share: the console's users and channel layer, and the
in-memory cluster network."""

from __future__ import annotations

import pytest

OPERATOR_PASSWORD = "pw-op-1"
VIEWER_PASSWORD = "pw-viewer-1"


@pytest.fixture
def in_memory_layer(settings) -> None:
    """Channel-layer sends (dashboard notifications, command delivery) stay in process."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def scheduled(monkeypatch) -> list:
    """Command ids whose first delivery would be queued on Celery (not sent)."""
    from clusterapi import commands

    queued: list = []
    monkeypatch.setattr(commands, "schedule_delivery", queued.append)
    return queued


@pytest.fixture
def operator(django_user_model):
    """``op``, a member of the operators group. Cheap: the tests hash with MD5
    (``tests/settings.py``)."""
    from django.contrib.auth.models import Group

    from clusterapi.roles import OPERATORS_GROUP

    user = django_user_model.objects.create_user("op", password=OPERATOR_PASSWORD)
    user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    return user


@pytest.fixture
def viewer(django_user_model):
    """``viewer``: logged in, in no group, so it may read and never command."""
    return django_user_model.objects.create_user("viewer", password=VIEWER_PASSWORD)


@pytest.fixture
def net():
    """The in-memory message plane (``tests/unit/cluster_net.py``): primaries A, B
    and C, A elected root, shared queue ``q`` declared everywhere."""
    from tests.unit.cluster_net import Net

    net = Net()
    for spid in ("A", "B", "C"):
        net.add(spid)
    net.elect("A")
    net.declare("q")
    return net


@pytest.fixture
def console_hearing(db):
    """A console process that has beaten for an hour and beats now (stale detection
    judges brokers only while one does: ``clusterapi.presence``). Returns a function
    that makes it beat at a given time."""
    import datetime as dt

    from django.utils import timezone

    from clusterapi.models import ConsoleProcess

    now = timezone.now()
    row = ConsoleProcess.objects.create(
        host="test", pid=1, started_at=now - dt.timedelta(hours=1), beat_at=now
    )

    def beat(at: dt.datetime) -> None:
        ConsoleProcess.objects.filter(pk=row.pk).update(beat_at=at)

    return beat
