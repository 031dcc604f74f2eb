"""Celery tasks of the console (found by ``app.autodiscover_tasks()``).

Thin wrappers: the work is in plain functions (``clusterapi.commands``,
``clusterapi.cluster``) that tests call directly. The periodic ones are
scheduled in ``console.celery``.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from clusterapi import cluster, commands


@shared_task(ignore_result=True)
def deliver_command(command_id: str) -> bool:
    """First delivery of a freshly issued command; retries come from :func:`sweep_commands`."""
    return commands.deliver(command_id)


@shared_task(ignore_result=True)
def sweep_commands() -> dict[str, Any]:
    """Re-send unacknowledged commands and time out those past their deadline."""
    return commands.sweep()


@shared_task(ignore_result=True)
def detect_stale_brokers() -> list[str]:
    """Mark down brokers whose heartbeats stopped and raise ``broker.down``."""
    return cluster.detect_stale()


@shared_task(ignore_result=True)
def prune_heartbeats() -> dict[str, int]:
    """Drop samples older than ``HEARTBEAT_RETENTION`` hours."""
    return cluster.prune_samples()
