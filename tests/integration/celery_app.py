"""A tiny Celery app whose broker is brokerd (and whose results travel over AMQP too).

The worker subprocess reads the broker URL from ``ROOKERY_CELERY_BROKER_URL``;
the test process sets ``app.conf.broker_url`` itself before sending tasks.
"""

from __future__ import annotations

import os

from celery import Celery, Task

app = Celery(
    "rookery_integration",
    broker=os.environ.get("ROOKERY_CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    backend="rpc://",
)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_default_queue=os.environ.get("ROOKERY_CELERY_QUEUE", "rookery-integration"),
    task_acks_late=True,
    worker_prefetch_multiplier=4,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=3,
    result_expires=300,
)


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task
def fail(text: str) -> None:
    raise ValueError(text)


@app.task(bind=True, max_retries=3)
def flaky(self: Task, succeed_on: int) -> int:
    """Fails (and is retried with a countdown, i.e. an ETA message) until attempt ``succeed_on``."""
    if self.request.retries < succeed_on:
        raise self.retry(countdown=0.3)
    return self.request.retries
