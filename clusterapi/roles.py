"""Who may change the cluster: operators; everyone else who is logged in only reads."""

from __future__ import annotations

from typing import Any

OPERATORS_GROUP = "operators"


def is_operator(user: Any) -> bool:
    """True for an active superuser or a member of the "operators" group."""
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if not getattr(user, "is_active", False):
        return False
    if user.is_superuser:
        return True
    return user.groups.filter(name=OPERATORS_GROUP).exists()
