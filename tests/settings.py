"""The console's settings for the test suite: ``console.settings`` with a fast
password hasher.

One PBKDF2 hash at Django's default cost takes about 0.9 s on the CI machine,
and dozens of fixtures create users and log in. The tests check what the
console does with users, not the hasher's cost, so they hash with MD5: never
a setting for a real deployment (``console/settings.py`` keeps Django's
default). The console stack's processes (Daphne, Celery) run with it too.
"""

from __future__ import annotations

from console.settings import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
