"""Celery tasks of the console (found by ``app.autodiscover_tasks()``): none yet.

Command delivery, stale-broker detection, heartbeat retention and archiving,
and scheduled reports will live here.
"""
