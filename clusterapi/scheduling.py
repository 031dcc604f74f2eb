"""Celery work queued by task name.

The modules that queue work (``commands``, ``reports``) are the ones the tasks
call, so they cannot import ``clusterapi.tasks`` at the top without a cycle.
They queue by name instead, as the beat schedule does (``console/celery.py``):
the worker resolves the name to the task.
"""

from __future__ import annotations

from typing import Any

from celery import current_app

#: where the console's tasks live (their names are ``clusterapi.tasks.<function>``)
TASKS = "clusterapi.tasks"


def queue_task(name: str, *args: Any) -> None:
    """Queue ``clusterapi.tasks.<name>(*args)`` on Celery's broker."""
    current_app.send_task(f"{TASKS}.{name}", args=list(args))
