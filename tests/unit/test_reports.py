"""Report runs: the service, the API and the dashboard pages, without Spark.

The real job (``python -m pipeline report``) takes ~25 s to start Spark, so it
runs once, in tests/integration/test_reports_e2e.py. Here ``REPORT_COMMAND``
points at a stand-in written below: a small pyarrow program that takes the
job's arguments, reads the (tiny, generated) lake and writes what the job
writes (Parquet directories of ``isr_xsr_minute`` and ``broker_minute`` and a
``summary.json``), or fails or hangs on request. Transactions roll back, so
the Celery task queued on commit never runs; tests call ``execute`` directly.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from clusterapi import reports
from clusterapi.models import AuditEntry, Broker, HeartbeatSample, QueueSample, ReportRun
from pipeline.generate import generate

pytestmark = pytest.mark.django_db

STAND_IN = r'''
"""Stand-in for `python -m pipeline report`: same arguments, same kind of output."""
import argparse, json, os, sys, time
from pathlib import Path
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
from pipeline import lake

mode = os.environ.get("STAND_IN_MODE", "")
if mode == "hang":
    time.sleep(600)
parser = argparse.ArgumentParser()
parser.add_argument("command")
for flag in ("--lake", "--out", "--from", "--to", "--master"):
    parser.add_argument(flag)
args = parser.parse_args()
out = Path(args.out)
(out / "argv.json").write_text(json.dumps(sys.argv[1:]))
if mode == "crash":
    raise RuntimeError("stand-in crashed")
if mode == "refuse":
    print("pipeline report: the stand-in refuses", file=sys.stderr)
    sys.exit(2)
samples = lake.read_table(args.lake, "broker_samples")
if samples.num_rows == 0:
    print("pipeline report: no broker samples in the lake for this period", file=sys.stderr)
    sys.exit(2)
minute = pc.floor_temporal(samples.column("ts"), unit="minute")
per = pa.table({"broker": samples.column("broker"), "minute": minute,
                "isr": samples.column("rate_routed"), "xsr": samples.column("rate_delivered"),
                "in": samples.column("rate_published")})
brokers = per.group_by(["broker", "minute"]).aggregate([("in", "mean"), ("isr", "mean")])
broker_minute = pa.table({"broker": brokers.column("broker"), "minute": brokers.column("minute"),
                          "in_avg": brokers.column("in_mean")})
cluster = per.group_by("minute").aggregate([("isr", "mean"), ("xsr", "mean")])
n = cluster.num_rows
isr_xsr = pa.table({"scope": ["cluster"] * n, "broker": pa.nulls(n, pa.string()),
                    "minute": cluster.column("minute"), "isr": cluster.column("isr_mean"),
                    "xsr": cluster.column("xsr_mean"), "brokers": [1] * n})
for name, table in (("broker_minute", broker_minute), ("isr_xsr_minute", isr_xsr)):
    (out / name).mkdir()
    pq.write_table(table, out / name / "part-00000.parquet")
    (out / name / "_SUCCESS").write_text("")
names = sorted(set(samples.column("broker").to_pylist()))
summary = {
    "period": {"from": args.__dict__["from"], "to": args.to},
    "brokers": names,
    "samples": {"broker_samples": samples.num_rows},
    "totals": {"published": 10, "routed": 20, "delivered": 30, "per_broker": {}},
    "peaks": {"cluster_isr": {"value": 2.5, "minute": "x"}, "cluster_xsr": None},
    "root": {"timeline": [{"root": names[0], "start": "a", "end": "b"}], "changes": [],
             "no_root": [{"start": "n", "end": "r", "seconds": 4.0, "root_before": names[0],
                          "root_after": names[0]}], "no_root_seconds": 4.0},
    "console_gaps": [{"start": "s", "end": "e", "seconds": 40.0, "missed_intervals": 40}],
    "incidents": [{"kind": "console_gap", "broker": None, "start": "s", "end": "e",
                   "details": {"seconds": 40.0, "brokers": names}},
                  {"kind": "no_root", "broker": names[0], "start": "n", "end": "r",
                   "details": {"seconds": 4.0, "root_before": names[0],
                               "root_after": names[0]}},
                  {"kind": "crash_restart", "broker": names[0], "start": "s", "end": "e",
                   "details": {"spid": "new", "old_spid": "old"}}],
    "tables": {"broker_minute": str(out / "broker_minute"),
               "isr_xsr_minute": str(out / "isr_xsr_minute"),
               "../../etc": "/etc", "restarts": str(out / "restarts")},
}
(out / "summary.json").write_text(json.dumps(summary))
'''

#: the tests that run the stand-in job (a Python process) through the real runner
runs_the_job = pytest.mark.integration


@pytest.fixture(scope="module")
def generated_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lake")
    generate(root, brokers=3, queues=2, hours=0.1, seed=7, interval=1.0)
    return root


@pytest.fixture(autouse=True)
def stand_in(tmp_path: Path, settings: Any, generated_lake: Path) -> Path:
    script = tmp_path / "stand_in_job.py"
    script.write_text(STAND_IN)
    settings.REPORT_COMMAND = [sys.executable, str(script)]
    settings.LAKE_PATH = generated_lake
    settings.REPORTS_DIR = tmp_path / "reports"
    settings.SPARK_MASTER = "local[2]"
    settings.REPORT_TIMEOUT_SECONDS = 60
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    return script


def api_for(user: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.fixture
def done(operator: User) -> ReportRun:
    """A run that went through the stand-in job."""
    start = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)
    run = reports.request_run(operator, start, start + dt.timedelta(days=1))
    assert reports.execute(run.pk) == ReportRun.STATE_SUCCEEDED
    run.refresh_from_db()
    return run


# -- the service --------------------------------------------------------------------------------


@runs_the_job
def test_a_run_passes_the_settings_to_the_job_and_keeps_its_summary(
    done: ReportRun, settings: Any
) -> None:
    out = Path(done.output_path)
    assert out == Path(settings.REPORTS_DIR) / str(done.pk)
    argv = json.loads((out / "argv.json").read_text())
    assert argv == [
        "report",
        "--lake",
        str(out / "lake"),  # the run's own lake: the archive's files plus the database's
        "--out",
        str(out),
        "--from",
        "2026-01-05T00:00:00Z",
        "--to",
        "2026-01-06T00:00:00Z",
        "--master",
        "local[2]",
    ]
    assert done.state == "succeeded" and done.error == ""
    assert done.summary["brokers"] == ["10.0.0.1:5701", "10.0.0.2:5701", "10.0.0.3:5701"]
    assert done.started_at <= done.finished_at
    # only tables named by the summary, present on disk, and with a plain name
    assert reports.table_names(done) == ["broker_minute", "isr_xsr_minute"]
    assert reports.table(done, "../../etc") is None and reports.table(done, "restarts") is None
    entry = AuditEntry.objects.get(action="report.request")
    assert entry.username == "op" and entry.details["from"] == "2026-01-05T00:00:00Z"


@runs_the_job
def test_chart_series_come_from_the_output_tables(done: ReportRun) -> None:
    charts = reports.chart_series(done)
    cluster, brokers = charts["cluster"], charts["brokers"]
    assert len(cluster["t"]) == len(cluster["isr"]) == len(cluster["xsr"]) >= 3
    assert cluster["t"] == sorted(cluster["t"]) and all(t % 60 == 0 for t in cluster["t"])
    assert brokers["names"] == ["10.0.0.1:5701", "10.0.0.2:5701", "10.0.0.3:5701"]
    assert all(len(series) == len(brokers["t"]) for series in brokers["in"])
    assert any(v for series in brokers["in"] for v in series)


@runs_the_job
def test_a_failing_job_fails_the_run_with_its_message(
    operator: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STAND_IN_MODE", "refuse")
    run = reports.request_run(operator)
    assert reports.execute(run.pk) == "failed"
    run.refresh_from_db()
    assert run.error == "the stand-in refuses"
    assert run.summary is None and run.finished_at is not None
    assert reports.summary_path(run) is None and reports.table_names(run) == []


def test_a_period_without_samples_fails_at_once_saying_so(
    operator: User, tmp_path: Path, settings: Any
) -> None:
    settings.LAKE_PATH = tmp_path / "empty-lake"
    run = reports.request_run(operator)
    assert reports.execute(run.pk) == "failed"
    run.refresh_from_db()
    assert run.error.startswith("no broker samples at all: brokers report to the console")
    assert not (Path(run.output_path) / "argv.json").exists()  # no job (no Spark) started
    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    later = reports.request_run(operator, start, start + dt.timedelta(hours=1))
    assert reports.execute(later.pk) == "failed"
    later.refresh_from_db()
    assert "from 2030-01-01T00:00:00Z to 2030-01-01T01:00:00Z" in later.error


@runs_the_job
def test_a_fresh_install_reports_on_the_samples_not_archived_yet(
    operator: User, tmp_path: Path, settings: Any
) -> None:
    """The first hour: nothing is old enough to archive, the lake does not exist yet."""
    settings.LAKE_PATH = tmp_path / "no-lake-yet"
    now = dt.datetime.now(dt.UTC)
    broker = Broker.objects.create(name="127.0.0.1:5701", spid="s1", broker_type="primary")
    HeartbeatSample.objects.bulk_create(
        HeartbeatSample(
            broker=broker, time=now - dt.timedelta(seconds=s), spid="s1", rate_published=1.0
        )
        for s in range(1, 60)
    )
    QueueSample.objects.create(broker=broker, time=now, vhost="/", queue="jobs")
    run = reports.request_run(operator)
    assert reports.execute(run.pk) == "succeeded", ReportRun.objects.get(pk=run.pk).error
    run.refresh_from_db()
    assert run.summary["brokers"] == ["127.0.0.1:5701"]
    assert run.summary["samples"]["broker_samples"] == 59
    # nothing was moved out of the database (the dashboard's charts need the samples)
    assert HeartbeatSample.objects.count() == 59
    assert not (Path(run.output_path) / "lake").exists()  # the run's lake is gone, its tables stay


@runs_the_job
def test_a_crash_keeps_the_tail_of_the_log(operator: User, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAND_IN_MODE", "crash")
    run = reports.request_run(operator)
    assert reports.execute(run.pk) == "failed"
    run.refresh_from_db()
    assert run.error.startswith("the job exited with code 1")
    assert "RuntimeError: stand-in crashed" in run.error


@runs_the_job
def test_a_job_past_its_timeout_is_stopped(operator: User, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAND_IN_MODE", "hang")
    run = reports.request_run(operator)
    began = time.monotonic()
    assert reports.execute(run.pk, timeout=1.0) == "failed"
    assert time.monotonic() - began < 15
    run.refresh_from_db()
    assert "did not finish within 1 s" in run.error


@runs_the_job
def test_a_run_is_executed_once(done: ReportRun) -> None:
    finished = done.finished_at
    assert reports.execute(done.pk) == "succeeded"
    done.refresh_from_db()
    assert done.finished_at == finished


def test_an_empty_period_fails_without_a_job(
    operator: User, django_capture_on_commit_callbacks: Any
) -> None:
    start = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)
    with django_capture_on_commit_callbacks() as queued:
        run = reports.request_run(operator, start, start)
    assert run.state == "failed" and "choose a start before the end" in run.error
    assert queued == []  # no Celery task


def test_nightly_covers_the_previous_day_once() -> None:
    now = dt.datetime(2026, 2, 3, 0, 30, tzinfo=dt.UTC)
    run = reports.request_nightly(now)
    assert run is not None and run.trigger == "nightly" and run.requested_by is None
    assert (run.period_from, run.period_to) == (
        dt.datetime(2026, 2, 2, tzinfo=dt.UTC),
        dt.datetime(2026, 2, 3, tzinfo=dt.UTC),
    )
    assert reports.request_nightly(now + dt.timedelta(minutes=5)) is None  # beat fired twice
    ReportRun.objects.filter(pk=run.pk).update(state="failed")
    assert reports.request_nightly(now) is not None  # a failed one may be retried


def test_abandoned_runs_are_failed(operator: User, settings: Any) -> None:
    run = reports.request_run(operator)
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=settings.REPORT_TIMEOUT_SECONDS)
    ReportRun.objects.filter(pk=run.pk).update(
        state="running", started_at=long_ago - reports.ABANDON_GRACE
    )
    assert reports.fail_abandoned() == 1
    run.refresh_from_db()
    assert run.state == "failed" and "abandoned" in run.error


# -- the API -----------------------------------------------------------------------------------


@runs_the_job
def test_api_lists_and_shows_runs_with_their_summary(done: ReportRun, viewer: User) -> None:
    api = api_for(viewer)
    listed = api.get("/api/v1/reports/").json()
    assert listed["count"] == 1
    item = listed["results"][0]
    assert (item["id"], item["state"], item["state_text"], item["trigger"]) == (
        done.pk,
        "succeeded",
        "succeeded",
        "manual",
    )
    assert item["headline"]["brokers"] == done.summary["brokers"]
    assert item["headline"]["incidents"] == 3 and "summary" not in item
    detail = api.get(f"/api/v1/reports/{done.pk}/").json()
    assert detail["summary"] == done.summary and detail["requested_by"] == "op"
    assert detail["downloads"]["summary"].endswith(f"/api/v1/reports/{done.pk}/summary.json")
    assert sorted(detail["downloads"]["tables"]) == ["broker_minute", "isr_xsr_minute"]
    assert api.get("/api/v1/reports/?state=failed").json()["count"] == 0


@runs_the_job
def test_api_downloads(done: ReportRun, viewer: User) -> None:
    api = api_for(viewer)
    summary = api.get(f"/api/v1/reports/{done.pk}/summary.json")
    assert summary.status_code == 200 and summary["Content-Type"] == "application/json"
    assert json.loads(summary.content) == done.summary
    table = api.get(f"/api/v1/reports/{done.pk}/tables/isr_xsr_minute.parquet")
    assert table.status_code == 200
    assert table["Content-Type"] == "application/vnd.apache.parquet"
    data = pq.read_table(io.BytesIO(table.content))
    assert data.column_names == ["scope", "broker", "minute", "isr", "xsr", "brokers"]
    assert data.num_rows == len(reports.chart_series(done)["cluster"]["t"])


MISSING = [
    "/api/v1/reports/{pk}/tables/nope.parquet",
    "/api/v1/reports/{pk}/tables/restarts.parquet",  # in the summary, not on disk
    "/api/v1/reports/{pk}/tables/..%2F..%2Fetc.parquet",
    "/api/v1/reports/{pk}/tables/%2E%2E.parquet",
    "/api/v1/reports/{pk}/tables/../../summary.json",
    "/api/v1/reports/999/summary.json",
    "/api/v1/reports/999/",
]


@runs_the_job
def test_api_missing_files_are_json_404s(done: ReportRun, viewer: User) -> None:
    api = api_for(viewer)
    for path in MISSING:
        response = api.get(path.format(pk=done.pk))
        assert response.status_code == 404, path
        assert response["Content-Type"].startswith("application/json"), path
        assert response.json()["error"], path


def test_api_summary_of_a_failed_run_is_404(operator: User, tmp_path: Path, settings: Any) -> None:
    settings.LAKE_PATH = tmp_path / "nothing"
    run = reports.request_run(operator)
    reports.execute(run.pk)
    response = api_for(operator).get(f"/api/v1/reports/{run.pk}/summary.json")
    assert response.status_code == 404 and "no summary (failed)" in response.json()["error"]


def test_api_operators_request_runs(operator: User, viewer: User) -> None:
    response = api_for(operator).post(
        "/api/v1/reports/",
        {"period_from": "2026-01-05T00:00:00Z", "period_to": "2026-01-05T06:00:00Z"},
        format="json",
    )
    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "pending" and body["state_text"] == "waiting to start"
    assert body["period_from"] == "2026-01-05T00:00:00Z"
    assert ReportRun.objects.get(pk=body["id"]).requested_by == operator

    refused = api_for(viewer).post("/api/v1/reports/", {}, format="json")
    assert refused.status_code == 403 and "operator" in refused.json()["error"]
    anonymous = APIClient().post("/api/v1/reports/", {}, format="json")
    assert anonymous.status_code == 401
    assert ReportRun.objects.count() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"period_from": "yesterday"},
        {"period_to": 12},
        {"period_start": "2026-01-05T00:00:00Z"},
    ],
)
def test_api_bad_periods_are_400(operator: User, body: dict[str, Any]) -> None:
    response = api_for(operator).post("/api/v1/reports/", body, format="json")
    assert response.status_code == 400 and response.json()["error"]
    assert not ReportRun.objects.exists()


# -- the dashboard -------------------------------------------------------------------------------


def client_for(user: User, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


@runs_the_job
def test_reports_page_lists_runs_and_offers_the_button_to_operators(
    done: ReportRun, operator: User, viewer: User
) -> None:
    page = client_for(operator).get("/reports/")
    html = page.content.decode()
    assert page.status_code == 200
    assert f'href="/reports/{done.pk}/"' in html and "succeeded" in html
    assert "Run report now" in html and 'aria-current="page">Reports<' in html
    assert 'http-equiv="refresh"' not in html
    as_viewer = client_for(viewer).get("/reports/").content.decode()
    assert f"Report {done.pk}" in as_viewer and "Run report now" not in as_viewer


@runs_the_job
def test_report_page_shows_charts_incidents_and_downloads(done: ReportRun, viewer: User) -> None:
    page = client_for(viewer).get(f"/reports/{done.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="report-isr-xsr"' in html and "vendor/uPlot.iife.min.js" in html
    assert "reports.js" in html
    series = page.context["charts"]
    assert series == reports.chart_series(done)
    assert 'id="report-series"' in html
    assert 'title="crash_restart">Crash restart<' in html and "10.0.0.1:5701" in html
    # issue 45: readable kinds, and the root tile says what the incidents say
    assert 'title="console_gap">Console gap (no outage)<' in html
    assert '<span class="muted">console</span>' in html  # a console gap has no broker
    assert 'title="no_root">No root<' in html
    tile = html[html.index('id="report-root-tile"') :]
    tile = tile[: tile.index("</div>")]
    assert "no root for 4.0 s" in tile and "in 1 stretch," in tile
    assert 'id="report-console-tile"' in html
    assert f"/api/v1/reports/{done.pk}/summary.json" in html
    assert f"/api/v1/reports/{done.pk}/tables/isr_xsr_minute.parquet" in html
    assert client_for(viewer).get("/reports/999/").status_code == 404


def test_an_open_run_page_reloads_itself(operator: User) -> None:
    run = reports.request_run(operator)
    html = client_for(operator).get(f"/reports/{run.pk}/").content.decode()
    assert "waiting to start" in html and 'http-equiv="refresh"' in html
    assert 'http-equiv="refresh"' in client_for(operator).get("/reports/").content.decode()


def test_run_now_from_the_dashboard(operator: User, viewer: User, settings: Any) -> None:
    # the generated lake's day, reported up to now: allowed whatever year the test runs in
    settings.REPORT_MAX_PERIOD_DAYS = 100 * 366
    response = client_for(operator).post(
        "/reports/run/", {"period_from": "2026-01-05T00:00", "period_to": ""}
    )
    run = ReportRun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/reports/{run.pk}/"
    assert run.period_from == dt.datetime(2026, 1, 5, tzinfo=dt.UTC) and run.period_to is None

    bad = client_for(operator).post(
        "/reports/run/", {"period_from": "2026-01-05T00:00", "period_to": "2026-01-04T00:00"}
    )
    assert bad.status_code == 400 and "before its end" in bad.content.decode()
    assert client_for(viewer).post("/reports/run/", {}).status_code == 403
    # the form needs the CSRF token
    assert client_for(operator, csrf=True).post("/reports/run/", {}).status_code == 403
    assert ReportRun.objects.count() == 1


@runs_the_job
def test_the_celery_task_archives_then_runs_the_job(
    operator: User, settings: Any, tmp_path: Path
) -> None:
    from clusterapi import tasks
    from clusterapi.models import Broker, HeartbeatSample

    settings.ARCHIVE_AFTER = 0
    archive_lake = tmp_path / "console-lake"
    settings.LAKE_PATH = archive_lake
    broker = Broker.objects.create(name="127.0.0.1:5701", spid="s1", broker_type="primary")
    for seconds in (30, 20, 10):
        HeartbeatSample.objects.create(
            broker=broker, time=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
        )
    run = reports.request_run(operator)
    assert tasks.run_report.apply(args=[run.pk]).get() == "succeeded"
    run.refresh_from_db()
    # the job saw what the archive pass had just written
    assert run.summary["brokers"] == ["127.0.0.1:5701"]
    assert run.summary["samples"]["broker_samples"] == 3
    assert not HeartbeatSample.objects.exists()


def test_nightly_schedule_setting() -> None:
    from console.celery import app, nightly_schedule

    assert nightly_schedule("off") is None
    assert str(nightly_schedule("00:30")) == str(nightly_schedule(" 0:30 "))
    for bad in ("25:00", "0030", "noon", "12:60"):
        with pytest.raises(ValueError, match="REPORT_NIGHTLY_AT"):
            nightly_schedule(bad)
    app.loader.import_default_modules()
    names = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert {"clusterapi.tasks.nightly_report", "clusterapi.tasks.prune_heartbeats"} <= names


def test_api_reversed_period_is_refused_saying_why(operator: User) -> None:
    """Issue 25: a 400 and no run (tests/unit/test_report_periods.py has the rest)."""
    body = {"period_from": "2026-01-06T00:00:00Z", "period_to": "2026-01-05T00:00:00Z"}
    response = api_for(operator).post("/api/v1/reports/", body, format="json")
    assert response.status_code == 400
    assert "not before its end" in response.json()["error"]
    assert not ReportRun.objects.exists()
