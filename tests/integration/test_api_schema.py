"""Property-based API testing: schemathesis drives every operation of the OpenAPI schema.

The console's WSGI app runs in process over a test database holding a small
cluster, authenticated as an operator. Whatever schemathesis sends (valid and
invalid parameters, odd bodies), the API must never answer 5xx, and what it
answers must match the schema it publishes. Bounded: a few examples per operation.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import Group, User
from django.core.wsgi import get_wsgi_application
from django.utils import timezone
from hypothesis import HealthCheck, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from clusterapi.models import Alarm, Broker, HeartbeatSample, QueueSnapshot
from clusterapi.roles import OPERATORS_GROUP

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(autouse=True)
def _in_memory_layer(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def operator_token(db: None) -> str:
    """An operator and a small cluster to read, so responses carry real objects."""
    user = User.objects.create_user("schema-op", password="pw-schema-op-1")
    user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    now = timezone.now()
    for i in (1, 2):
        broker = Broker.objects.create(
            name=f"127.0.0.1:590{i}",
            address=f"127.0.0.1:590{i}",
            broker_type="primary",
            state="up",
            connected=True,
            ready=True,
            is_root=i == 1,
            last_seen=now,
        )
        HeartbeatSample.objects.create(broker=broker, time=now)
        QueueSnapshot.objects.create(broker=broker, vhost="/", name="jobs", updated_at=now)
        Alarm.objects.create(broker=broker, kind="checksum.mismatch", raised_at=now)
    return Token.objects.create(user=user).key


# Loaded at collection (the schema view needs no database); schemathesis's lazy
# ``from_fixture`` loader does not work with pytest 9.
schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", get_wsgi_application())
# Valid requests and invalid ones (wrong types, missing fields): both must get 2xx/4xx.
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
)


@schema.parametrize()
@settings(
    max_examples=20,
    # a failure must be a defect of the API, never of the machine or the generator:
    # no deadline (a loaded CI box is slow) and no health checks (filtering, size)
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_operation_answers_a_server_error(case: Any, operator_token: str) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Token {operator_token}"},
        checks=[not_a_server_error, response_schema_conformance, content_type_conformance],
    )
