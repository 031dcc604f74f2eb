"""Who may do what through the API: every signed-in user reads, operators change."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from clusterapi.roles import OPERATORS_GROUP, is_operator


class IsOperatorOrReadOnly(BasePermission):
    """GET/HEAD/OPTIONS for any authenticated user; anything else needs the operator role."""

    message = (
        "read-only account: sending commands and configurations needs the operator role "
        f"(a superuser or a member of the '{OPERATORS_GROUP}' group)"
    )

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        return request.method in SAFE_METHODS or is_operator(user)
