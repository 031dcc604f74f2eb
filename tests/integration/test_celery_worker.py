"""A real Celery worker (solo pool) whose broker and result transport is brokerd.

Set ``ROOKERY_REFERENCE_AMQP_PORT=5672`` to run against a real RabbitMQ instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import group
from celery.result import AsyncResult

from tests.brokerd_process import BrokerProcess
from tests.integration import celery_app

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    """``celery worker`` as a subprocess, logging to a file."""

    def __init__(self, broker_url: str, queue: str, log_path: Path) -> None:
        self.log_path = log_path
        self.name = f"rookery-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
        env = dict(
            os.environ,
            ROOKERY_CELERY_BROKER_URL=broker_url,
            ROOKERY_CELERY_QUEUE=queue,
            PYTHONUNBUFFERED="1",
        )
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.celery_app",
            "worker",
            "--pool=solo",
            "--concurrency=1",
            "-l",
            "info",
            "-n",
            self.name,
        ]
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"worker exited with {self.proc.returncode}:\n{self.log_text()}")
            if " ready." in self.log_text():
                return
            time.sleep(0.1)
        pytest.fail(f"worker not ready after {timeout}s:\n{self.log_text()[-5000:]}")

    def stop(self, timeout: float = 20.0) -> int:
        """Warm shutdown (SIGTERM), killing only if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


@pytest.fixture(scope="module")
def amqp_port(broker: BrokerProcess) -> int:
    """A standalone broker only: the test process's Celery app is module-global and
    cannot be reopened for a second variant (the cluster runs Celery in
    test_cluster_routing.py, worker and client on two servers)."""
    return int(os.environ.get("ROOKERY_REFERENCE_AMQP_PORT") or broker.port)


@pytest.fixture(scope="module")
def broker_url(amqp_port: int) -> str:
    return f"amqp://guest:guest@127.0.0.1:{amqp_port}//"


@pytest.fixture(scope="module")
def worker(
    broker_url: str, broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    queue = f"rookery-integration-{uuid.uuid4().hex[:8]}"
    app = celery_app.app
    app.conf.update(broker_url=broker_url, task_default_queue=queue)
    proc = Worker(broker_url, queue, tmp_path_factory.mktemp("celery") / "worker.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
        # close the client side: the rpc result consumer and the pooled connections
        with contextlib.suppress(AttributeError):  # no consumer if no result was awaited
            app.backend.result_consumer.stop()
        app.pool.force_close_all()
        app.close()
    log = proc.log_text()
    assert code == 0, f"worker exit code {code}:\n{log[-5000:]}"
    unexpected = [
        line
        for line in log.splitlines()
        if ("ERROR/" in line or "WARNING/" in line or "CRITICAL/" in line)
        and "raised unexpected: ValueError('boom')" not in line
    ]
    assert not unexpected, log[-5000:]
    assert broker.alive(), broker.log_text()[-5000:]


def test_add_task_round_trip(worker: Worker) -> None:
    result = celery_app.add.delay(2, 3)
    assert result.get(timeout=30) == 5
    assert result.successful()


def test_many_tasks_and_a_group(worker: Worker) -> None:
    results = [celery_app.add.delay(i, i) for i in range(20)]
    assert [r.get(timeout=30) for r in results] == [2 * i for i in range(20)]
    grouped = group(celery_app.add.s(i, 1) for i in range(5))()
    assert grouped.get(timeout=30) == [1, 2, 3, 4, 5]


def test_task_exception_propagates(worker: Worker) -> None:
    result: AsyncResult = celery_app.fail.delay("boom")
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=30)
    assert result.failed()


def test_retry_with_countdown(worker: Worker) -> None:
    # a countdown makes an ETA message the worker holds unacked while it waits
    result = celery_app.flaky.delay(2)
    assert result.get(timeout=30) == 2


def test_control_ping_over_pidbox(worker: Worker) -> None:
    # broadcast over the pidbox fanout exchange, replies via a reply queue
    replies = celery_app.app.control.ping(destination=[worker.name], timeout=10)
    assert replies == [{worker.name: {"ok": "pong"}}]
