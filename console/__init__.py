"""The Rookery console: Django project (settings, ASGI app, URLs, Celery app)."""

# Load the Celery app whenever Django starts so that @shared_task binds to it
# (Celery's "First steps with Django").
from console.celery import app as celery_app

__all__ = ("celery_app",)
