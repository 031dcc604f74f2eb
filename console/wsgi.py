"""WSGI entry point, for tools that want one. The console itself runs on Daphne
(``console.asgi``), which it needs for its websockets."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

application = get_wsgi_application()
