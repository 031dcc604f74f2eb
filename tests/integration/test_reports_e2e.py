"""End to end: a running cluster's heartbeats -> archive -> Parquet lake -> Spark report -> API.

A real stack (Redis, Daphne, Celery worker + beat) with ``ARCHIVE_AFTER=0`` so
that every stored sample is old enough, three linked brokers with a 0.3 s
heartbeat and some traffic. An operator requests a report through the API; the
Celery task archives the samples into the lake under ``DATA_DIR/lake`` and runs
``python -m pipeline report`` (Spark ``local[2]``, the one real Spark run of the
console's tests); the run, its summary naming the three brokers, and its files
are then read back through the API.
"""

from __future__ import annotations

import io
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pika
import pyarrow.parquet as pq
import pytest

from pipeline import lake
from tests.console_stack import OPERATOR, VIEWER, Api, ConsoleStack, print_logs

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

REPORT_ENV = {
    "ARCHIVE_AFTER": "0",
    "SPARK_MASTER": "local[2]",
    "REPORT_NIGHTLY_AT": "off",
    "REPORT_TIMEOUT_SECONDS": "240",
}


@pytest.fixture(scope="module")
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleStack]:
    stack = ConsoleStack(tmp_path_factory.mktemp("reports"), extra_env=REPORT_ENV)
    failed_before = request.session.testsfailed
    try:
        stack.start()
        cluster = stack.start_cluster(3)
        cluster.wait_until(cluster.agreed_root, timeout=30)
        yield stack
    finally:
        if request.session.testsfailed > failed_before:
            print_logs(request, stack)
        stack.stop()


def publish(stack: ConsoleStack, count: int) -> None:
    """Some traffic on broker 0, so that the report has rates to show."""
    assert stack.cluster is not None
    params = pika.ConnectionParameters(
        "127.0.0.1", stack.cluster.ports[0], credentials=pika.PlainCredentials("guest", "guest")
    )
    conn = pika.BlockingConnection(params)
    try:
        channel = conn.channel()
        channel.queue_declare("report-e2e")
        for i in range(count):
            channel.basic_publish("", "report-e2e", f"m{i}".encode())
            if i % 50 == 49:
                time.sleep(0.1)
    finally:
        conn.close()


def heartbeats_per_broker(api: Api) -> dict[str, int]:
    counts: dict[str, int] = {}
    for sample in api.items("/api/v1/heartbeats/?page_size=1000"):
        counts[sample["broker"]] = counts.get(sample["broker"], 0) + 1
    return counts


def test_heartbeats_become_a_report_visible_through_the_api(stack: ConsoleStack) -> None:
    api = stack.api(OPERATOR)
    names = sorted(stack.broker_name(i) for i in range(3))
    publish(stack, 300)
    stack.wait(
        lambda: (c := heartbeats_per_broker(api)) and all(c.get(n, 0) >= 10 for n in names),
        30,
        "10 heartbeats from every broker",
    )

    # a read-only user may not start it; an operator may
    assert stack.api(VIEWER).post("/api/v1/reports/", {})[0] == 403
    status, run = api.post("/api/v1/reports/", {})
    assert status == 202, run
    assert run["state"] == "pending"

    def finished() -> dict[str, Any] | None:
        body = api.ok(f"/api/v1/reports/{run['id']}/")
        return body if body["state"] in ("succeeded", "failed") else None

    began = time.monotonic()
    done = stack.wait(finished, 200, f"report {run['id']} finished")
    took = time.monotonic() - began
    print(f"\nreport run {run['id']}: {done['state']} after {took:.1f} s (archive + Spark job)")
    assert done["state"] == "succeeded", done["error"]

    # the archive moved the samples into the lake under DATA_DIR/lake
    archived = lake.read_table(stack.data_dir / "lake", "broker_samples")
    assert sorted(set(archived.column("broker").to_pylist())) == names
    assert set(archived.column("spid").to_pylist()) == {
        stack.cluster.status(i)["spid"] for i in range(3)
    }
    assert lake.read_table(stack.data_dir / "lake", "peer_samples").num_rows > 0
    assert lake.read_table(stack.data_dir / "lake", "queue_samples").num_rows > 0

    summary = done["summary"]
    assert summary["brokers"] == names
    # the archived samples, and those that came in between the archive pass and the job
    # (the run's lake adds what the database still holds)
    assert summary["samples"]["broker_samples"] >= archived.num_rows >= 30
    assert summary["totals"]["published"] >= 300  # what publish() sent, at least
    assert summary["root"]["timeline"], summary["root"]
    assert summary["root"]["timeline"][-1]["root"] in names
    assert done["headline"]["brokers"] == names

    # downloads
    body = api.ok(f"/api/v1/reports/{run['id']}/summary.json")
    assert body["brokers"] == names
    url = done["downloads"]["tables"]["isr_xsr_minute"]
    req = urllib.request.Request(url, headers={"Authorization": f"Token {api.token}"})
    with urllib.request.urlopen(req, timeout=15) as resp:
        assert resp.headers["Content-Type"] == "application/vnd.apache.parquet"
        table = pq.read_table(io.BytesIO(resp.read()))
    assert {"scope", "minute", "isr", "xsr"} <= set(table.column_names)
    assert "cluster" in table.column("scope").to_pylist()
    status, missing = api.get(f"/api/v1/reports/{run['id']}/tables/nope.parquet")
    assert status == 404 and "no table" in missing["error"]

    listed = api.ok("/api/v1/reports/")
    assert [r["id"] for r in listed["results"]] == [run["id"]]
