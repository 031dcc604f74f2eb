"""The audit log: who did what to which broker or configuration."""

from __future__ import annotations

from typing import Any

from clusterapi.models import AuditEntry


def known_user(user: Any) -> Any:
    """``user`` if it is a logged-in user, else None (anonymous, or the console itself)."""
    return user if user is not None and getattr(user, "is_authenticated", False) else None


def record(
    user: Any, action: str, target: str = "", details: dict[str, Any] | None = None
) -> AuditEntry:
    """Append one entry; ``user`` may be None (the console itself, a broker's ack)."""
    known = known_user(user)
    return AuditEntry.objects.create(
        user=known,
        username=known.get_username() if known is not None else "",
        action=action,
        target=target,
        details=details or {},
    )
