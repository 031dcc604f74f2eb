"""The console's Celery app: configured from Django settings (``CELERY_*``).

Beat runs the cluster housekeeping of ``clusterapi.tasks``: command retries and
stale-broker detection every ``STALE_CHECK_SECONDS``, the sample archive and
retention hourly, the traffic report of the previous day nightly.
"""

from __future__ import annotations

import os
import re
from typing import Any

from celery import Celery
from celery.schedules import crontab

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Finds tasks.py in every installed app (clusterapi.tasks).
app.autodiscover_tasks()


@app.on_after_configure.connect
def schedule_housekeeping(sender: Celery, **kwargs: Any) -> None:
    """Periodic tasks, with intervals from Django settings (read once configured)."""
    from django.conf import settings

    every = float(settings.STALE_CHECK_SECONDS)
    retry = float(settings.COMMAND_RETRY_SECONDS)
    # a periodic task that has not run within its own interval is pointless: let it expire
    sender.add_periodic_task(
        retry, sender.signature("clusterapi.tasks.sweep_commands", expires=retry), name="commands"
    )
    sender.add_periodic_task(
        every,
        sender.signature("clusterapi.tasks.detect_stale_brokers", expires=every),
        name="stale brokers",
    )
    # archive (samples older than ARCHIVE_AFTER into the lake), then retention
    sender.add_periodic_task(
        3600.0, sender.signature("clusterapi.tasks.prune_heartbeats"), name="heartbeat retention"
    )
    nightly = nightly_schedule(settings.REPORT_NIGHTLY_AT)
    if nightly is not None:
        sender.add_periodic_task(
            nightly, sender.signature("clusterapi.tasks.nightly_report"), name="nightly report"
        )


def nightly_schedule(value: str) -> crontab | None:
    """``REPORT_NIGHTLY_AT``: ``HH:MM`` in UTC (Celery's timezone), or ``off``."""
    if value.strip().lower() in ("off", "no", "0", "none"):
        return None
    match = re.fullmatch(r"([0-9]{1,2}):([0-9]{1,2})", value.strip())
    hour, minute = (int(match[1]), int(match[2])) if match else (24, 60)
    if not (hour < 24 and minute < 60):
        raise ValueError(f"REPORT_NIGHTLY_AT={value!r}: expected HH:MM (UTC) or off")
    return crontab(hour=hour, minute=minute)
