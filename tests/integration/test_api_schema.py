"""Property-based API testing: schemathesis drives every operation of the OpenAPI schema
with every check it has (``--checks all``).

The console's WSGI app runs in process over a test database holding a small
cluster (a root, a secondary, a broker that is down, alarms, a configuration
version), authenticated as an operator. Whatever schemathesis sends, valid or
not, the API must answer as its schema says: no 5xx, documented status codes and
bodies, invalid input refused (400), valid input accepted, authentication
enforced, other methods answered 405.

Bounded and repeatable: a fixed number of examples per operation, drawn
derandomized (the same requests every run), so the test fails only when the API
or its schema changed, never by the luck of a draw. Nothing leaves the process:
command deliveries and report runs are queued on commit, and the test's
transaction never commits.
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
from schemathesis.config import OperationConfig
from schemathesis.config._checks import POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES

from clusterapi import configs, groups, members
from clusterapi.models import (
    Alarm,
    BindingSnapshot,
    Broker,
    ExchangeSnapshot,
    HeartbeatSample,
    QueueSnapshot,
)
from clusterapi.roles import OPERATORS_GROUP

# each operation's test gets its own id from tests/conftest.py (_name_the_operation):
# xdist schedules by id, and schemathesis gives them all the same one under pytest 9
pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(240),
]

#: examples per operation: 37 operations x this many requests, plus the checks' probes
EXAMPLES = 25
MEMBERS = {
    "version": 1,
    "term": 2,
    "committed": True,
    "root": "spid-1",
    "members": [
        {"address": "127.0.0.1:5901", "spid": "spid-1", "type": "primary", "state": "self"},
        {"address": "127.0.0.1:5903", "spid": "spid-3", "type": "primary", "state": "down"},
    ],
    "forgotten": [{"address": "127.0.0.1:5909", "node": "0123456789abcdef"}],
}


@pytest.fixture(autouse=True)
def _forgets_wait_briefly(monkeypatch: pytest.MonkeyPatch) -> None:
    """No broker acks a cluster.forget or queues.grow|shrink in process: the API gives
    up at once (504)."""
    monkeypatch.setattr(members, "FORGET_WAIT_SECONDS", 0.05)
    monkeypatch.setattr(groups, "WAIT_SECONDS", 0.05)


@pytest.fixture(autouse=True)
def _in_memory_layer(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def operator_token(db: None) -> str:
    """An operator and a small cluster to read, so responses carry real objects."""
    user = User.objects.create_user("schema-op", password="pw-schema-op-1")
    user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    now = timezone.now()
    for i, (kind, state) in enumerate(
        [("primary", "up"), ("secondary", "up"), ("primary", "down")], start=1
    ):
        broker = Broker.objects.create(
            name=f"127.0.0.1:590{i}",
            address=f"127.0.0.1:590{i}",
            broker_type=kind,
            state=state,
            connected=state == "up",
            ready=state == "up",
            is_root=i == 1,
            last_seen=now,
            spid=f"spid-{i}",
            # the members as brokerd reports them (view.members): GET .../members/ reads them
            view={"members": MEMBERS} if state == "up" else {},
        )
        HeartbeatSample.objects.create(broker=broker, time=now)
        QueueSnapshot.objects.create(broker=broker, vhost="/", name="jobs", updated_at=now)
        # a shared queue: the master on the root (consumers there and on a server the
        # console does not know), proxies elsewhere; shared wiring on every broker
        QueueSnapshot.objects.create(
            broker=broker,
            vhost="/",
            name="shared",
            shared=True,
            master=i == 1,
            consumers=3 if i == 1 else 0,
            consumer_servers={"spid-1": 1, "spid-unknown": 2} if i == 1 else {},
            updated_at=now,
        )
        ExchangeSnapshot.objects.create(
            broker=broker, vhost="/", name="work", type="topic", shared=True, updated_at=now
        )
        BindingSnapshot.objects.create(
            broker=broker,
            vhost="/",
            source="work",
            destination="shared",
            destination_type="queue",
            routing_key="#",
            shared=True,
            updated_at=now,
        )
        Alarm.objects.create(broker=broker, kind="checksum.mismatch", raised_at=now)
    Alarm.objects.create(kind="link.refused", raised_at=now, active=False, cleared_at=now)
    configs.save({"vhosts": ["/"]}, user, "first")
    return Token.objects.create(user=user).key


# Loaded at collection (the schema view needs no database); schemathesis's lazy
# ``from_fixture`` loader does not work with pytest 9.
schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", get_wsgi_application())
# Valid requests and invalid ones (wrong types, missing or unknown fields).
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
)
# A configuration document has rules JSON Schema cannot state (a heartbeat timeout above
# its interval, permissions naming users of the same document: docs/protocol.md). A
# schema-valid document that breaks one is refused with the documented 422, which is
# right, so for this one operation 422 counts as an answer to valid data too.
schema.config.operations.operations.append(
    OperationConfig.from_dict(
        {
            "include-name": "POST /api/v1/configs/",
            "checks": {
                "positive_data_acceptance": {
                    "expected-statuses": [*POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES, "422"]
                }
            },
        }
    )
)

# Likewise a report period is checked against the data (no sample in it, a bound in the
# future, longer than REPORT_MAX_PERIOD_DAYS), and a decommission against the broker's
# name typed again: refused with the documented 400, no run recorded, nothing retired.
for name in ("POST /api/v1/reports/", "POST /api/v1/brokers/{id}/decommission/"):
    schema.config.operations.operations.append(
        OperationConfig.from_dict(
            {
                "include-name": name,
                "checks": {
                    "positive_data_acceptance": {
                        "expected-statuses": [*POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES, "400"]
                    }
                },
            }
        )
    )


# A forget, a grow or a shrink waits for the broker's ack, which nothing sends in process:
# a well-formed address ends in the documented 504 (the command stays open), and the
# address is checked beyond what the schema states (HOST:PORT, the port's range), refused
# with a 400.
for waiting in (
    "POST /api/v1/cluster/members/forget/",
    "POST /api/v1/queues/grow/",
    "POST /api/v1/queues/shrink/",
):
    schema.config.operations.operations.append(
        OperationConfig.from_dict(
            {
                "include-name": waiting,
                "checks": {
                    "not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "504"]},
                    "positive_data_acceptance": {
                        "expected-statuses": [*POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES, "400"]
                    },
                },
            }
        )
    )


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    # the same examples every run: a failure is a defect, never a new draw
    derandomize=True,
    # nor a slow machine or the generator's own limits
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_conforms_to_its_schema_under_every_check(
    case: Any, operator_token: str
) -> None:
    # no ``checks=``: schemathesis's default is every built-in check (``--checks all``)
    case.call_and_validate(headers={"Authorization": f"Token {operator_token}"})
