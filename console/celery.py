"""The console's Celery app: configured from Django settings (``CELERY_*``)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Finds tasks.py in every installed app (clusterapi.tasks).
app.autodiscover_tasks()
