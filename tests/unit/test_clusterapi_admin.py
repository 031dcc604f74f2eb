"""The admin lists every clusterapi model; what brokers report cannot be edited there."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.utils import timezone

from clusterapi import models

pytestmark = pytest.mark.django_db

MODELS = [
    models.Broker,
    models.HeartbeatSample,
    models.QueueSample,
    models.QueueSnapshot,
    models.ExchangeSnapshot,
    models.BindingSnapshot,
    models.ConfigVersion,
    models.ConfigApplication,
    models.Command,
    models.AuditEntry,
    models.Alarm,
]


@pytest.fixture
def data() -> models.Broker:
    now = timezone.now()
    broker = models.Broker.objects.create(name="127.0.0.1:5701", state="up")
    models.HeartbeatSample.objects.create(broker=broker, time=now)
    models.QueueSample.objects.create(broker=broker, time=now, vhost="/", queue="q")
    models.QueueSnapshot.objects.create(broker=broker, vhost="/", name="q", updated_at=now)
    models.ExchangeSnapshot.objects.create(
        broker=broker, vhost="/", name="x", type="direct", updated_at=now
    )
    models.BindingSnapshot.objects.create(
        broker=broker,
        vhost="/",
        source="x",
        destination="q",
        destination_type="queue",
        updated_at=now,
    )
    version = models.ConfigVersion.objects.create(number=1, document={}, checksum="0" * 16)
    models.ConfigApplication.objects.create(version=version, broker=broker)
    models.Command.objects.create(broker=broker, name="state.dump", deadline=now)
    models.AuditEntry.objects.create(action="config.push", target="version 1")
    models.Alarm.objects.create(broker=broker, kind="broker.down", raised_at=now)
    return broker


@pytest.fixture
def admin_client(client, django_user_model):
    """A logged-in superuser without a password (hashing one per test is slow)."""
    user = django_user_model.objects.create_user("root", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def test_every_model_is_registered() -> None:
    assert all(admin.site.is_registered(model) for model in MODELS)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_changelists_render_and_refuse_additions(admin_client, data, model) -> None:
    meta = model._meta
    page = admin_client.get(f"/admin/{meta.app_label}/{meta.model_name}/")
    assert page.status_code == 200
    assert admin_client.get(f"/admin/{meta.app_label}/{meta.model_name}/add/").status_code == 403
    obj = model.objects.first()
    detail = admin_client.get(f"/admin/{meta.app_label}/{meta.model_name}/{obj.pk}/change/")
    assert detail.status_code == 200
    # read-only: the page offers no save button
    assert 'name="_save"' not in detail.content.decode()
