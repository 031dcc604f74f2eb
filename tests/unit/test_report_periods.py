"""Report periods a run cannot cover are refused up front (issue 25): a 400 in the
API's error shape, a form error on the dashboard, and no run recorded."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from clusterapi import reports
from clusterapi.models import Broker, HeartbeatSample, ReportRun
from pipeline.generate import generate

pytestmark = pytest.mark.django_db

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    generate(root, brokers=3, queues=1, hours=0.1, seed=3, interval=1.0)
    return root


@pytest.fixture(autouse=True)
def samples(tmp_path: Path, settings: Any, lake: Path) -> None:
    """Samples in the database for the last hour, an archived lake on 2026-01-05."""
    settings.LAKE_PATH = lake
    settings.REPORTS_DIR = tmp_path / "reports"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    broker = Broker.objects.create(name="127.0.0.1:5701", spid="s1", broker_type="primary")
    HeartbeatSample.objects.bulk_create(
        HeartbeatSample(broker=broker, time=NOW - dt.timedelta(minutes=m), spid="s1")
        for m in range(1, 60)
    )


def api_for(user: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def iso(value: dt.datetime) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


HOUR_AGO = iso(NOW - dt.timedelta(hours=1))
TOMORROW = iso(NOW + dt.timedelta(days=1))


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"period_from": "0001-01-01T00:00:00Z"}, "out of range"),
        ({"period_from": "0001-01-01T00:30:00+01:00"}, ""),
        ({"period_to": "1999-12-31T00:00:00Z"}, "out of range"),
        ({"period_from": HOUR_AGO, "period_to": iso(NOW - dt.timedelta(hours=2))}, "empty"),
        ({"period_from": HOUR_AGO, "period_to": HOUR_AGO}, "before the end"),
        ({"period_from": TOMORROW}, "in the future"),
        ({"period_from": HOUR_AGO, "period_to": TOMORROW}, "leave period_to empty"),
        ({"period_from": "2024-01-01T00:00:00Z"}, "longer than 366 days"),
        ({"period_from": "2026-01-06T00:00:00Z", "period_to": "2026-01-07T00:00:00Z"}, "no broker"),
    ],
)
def test_api_refuses_periods_it_cannot_report_on(
    operator: User, body: dict[str, Any], said: str
) -> None:
    response = api_for(operator).post("/api/v1/reports/", body, format="json")
    assert response.status_code == 400, response.content
    payload = response.json()
    assert set(payload) == {"error", "detail"} and said in payload["error"]
    assert not ReportRun.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"period_from": HOUR_AGO},
        {"period_from": "2026-01-05T00:00:00Z", "period_to": "2026-01-05T01:00:00Z"},
    ],
)
def test_api_accepts_periods_with_samples(operator: User, body: dict[str, Any]) -> None:
    """Samples in the database or only in the archived lake both count."""
    response = api_for(operator).post("/api/v1/reports/", body, format="json")
    assert response.status_code == 202, response.content
    assert response.json()["state"] == "pending"


def test_no_samples_at_all_is_refused(operator: User, tmp_path: Path, settings: Any) -> None:
    settings.LAKE_PATH = tmp_path / "no-lake"
    HeartbeatSample.objects.all().delete()
    response = api_for(operator).post("/api/v1/reports/", {}, format="json")
    assert response.status_code == 400 and "no broker samples at all" in response.json()["error"]


def test_the_limit_follows_the_setting(settings: Any) -> None:
    settings.REPORT_MAX_PERIOD_DAYS = 1
    with pytest.raises(reports.InvalidRequest, match="longer than 1 days"):
        reports.check_period(NOW - dt.timedelta(days=2), None)
    reports.check_period(NOW - dt.timedelta(hours=2), None)


def test_the_dashboard_form_shows_the_same_refusal(operator: User) -> None:
    client = Client()
    client.force_login(operator)
    response = client.post("/reports/run/", {"period_from": "0001-01-01T00:00"})
    assert response.status_code == 400
    assert "out of range" in response.content.decode()
    future = client.post("/reports/run/", {"period_from": TOMORROW[:16]})
    assert future.status_code == 400 and "in the future" in future.content.decode()
    assert not ReportRun.objects.exists()
    ok = client.post("/reports/run/", {"period_from": HOUR_AGO[:16]})
    assert ok.status_code == 302 and ReportRun.objects.count() == 1


def test_a_year_one_run_already_recorded_fails_cleanly(operator: User) -> None:
    """A run stored before the check (or by hand) must still end, not crash the task."""
    start = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
    run = reports.request_run(operator, start, dt.datetime(1, 1, 2, tzinfo=dt.UTC))
    assert reports.execute(run.pk) == ReportRun.STATE_FAILED
    run.refresh_from_db()
    assert "0001-01-01" in run.error and run.finished_at is not None
