"""Celery tasks of the console (found by ``app.autodiscover_tasks()``).

Thin wrappers: the work is in plain functions (``clusterapi.commands``,
``clusterapi.cluster``) that tests call directly. The periodic ones are
scheduled in ``console.celery``.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.utils import timezone

from clusterapi import archive, cluster, commands, reports


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
    """Archive, then drop samples older than ``HEARTBEAT_RETENTION`` hours.

    Retention never deletes a sample the lake does not have: the archive pass runs
    first with a cutoff no later than retention's (and logs what it moved); if it
    fails nothing is pruned (the exception fails the task).
    """
    # one clock for both: a pass that takes minutes must not let retention's cutoff
    # move past the archive's
    now = timezone.now()
    archive.archive_samples(archive.cutoff_before_prune(now))
    return cluster.prune_samples(now)


@shared_task(ignore_result=True)
def run_report(run_id: int) -> str:
    """Archive what is old enough, then run the report job for one :class:`ReportRun`."""
    return reports.archive_then_execute(run_id)


@shared_task(ignore_result=True)
def nightly_report() -> int | None:
    """Archive, then report the previous UTC day (beat, at ``REPORT_NIGHTLY_AT``)."""
    run = reports.request_nightly()
    if run is None:
        return None
    reports.archive_then_execute(run.pk)
    return run.pk
