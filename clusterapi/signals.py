"""Reactions to changes of Django's own models.

A password change revokes the user's API token: a token is a second password,
and whoever changes a password (a leak, a colleague leaving) expects the old
credentials to stop working everywhere, scripts included. Django has no
"password changed" signal, so the user row's hash is compared before and after
its save; every way of changing a password (the admin, ``manage.py
changepassword``, ``set_password`` in code, the quickstart) goes through it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models.signals import post_save, pre_save
from rest_framework.authtoken.models import Token

from clusterapi import audit

log = logging.getLogger(__name__)


def remember_password_change(sender: Any, instance: Any, **kwargs: Any) -> None:
    """pre_save: note whether this save changes the stored password hash."""
    if instance.pk is None or kwargs.get("raw"):
        instance._rookery_password_changed = False
        return
    before = sender._default_manager.filter(pk=instance.pk).values_list("password", flat=True)
    old = before.first()
    instance._rookery_password_changed = old is not None and old != instance.password


def revoke_tokens_on_password_change(sender: Any, instance: Any, **kwargs: Any) -> None:
    """post_save: the password changed, so the user's API token goes (audited)."""
    if not getattr(instance, "_rookery_password_changed", False):
        return
    instance._rookery_password_changed = False
    revoked, _ = Token.objects.filter(user_id=instance.pk).delete()
    if revoked:
        log.info("password of %s changed: API token revoked", instance.get_username())
        audit.record(None, "token.revoke", instance.get_username(), {"why": "password changed"})


def connect() -> None:
    user_model = get_user_model()
    pre_save.connect(remember_password_change, sender=user_model, dispatch_uid="rookery-pw-pre")
    post_save.connect(
        revoke_tokens_on_password_change, sender=user_model, dispatch_uid="rookery-pw-post"
    )
