"""The console's settings for the test suite: ``console.settings`` with a fast
password hasher.

One PBKDF2 hash at Django's default cost takes about 0.9 s on the CI machine,
and dozens of fixtures create users and log in. The tests check what the
console does with users, not the hasher's cost, so they hash with MD5: never
a setting for a real deployment (``console/settings.py`` keeps Django's
default). The console stack's processes (Daphne, Celery) run with it too.
"""

from __future__ import annotations

from console.environment import env_bool
from console.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The console process's beat (clusterapi.presence) runs in the console stack's Daphne
# (tests/console_stack.py sets CONSOLE_BEAT=1), not in test processes that call the ASGI
# application in-process: they have no console to beat for.
CONSOLE_BEAT = env_bool("CONSOLE_BEAT", False)
