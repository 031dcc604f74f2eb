"""Accounts: a password change revokes API tokens; failed logins are rate limited."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from clusterapi.models import AuditEntry

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer")]


@pytest.fixture
def user() -> User:
    return User.objects.create_user("alice", password="first-pass-1")


def test_a_password_change_revokes_the_api_token(user: User) -> None:
    token = Token.objects.create(user=user).key
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert api.get("/api/v1/brokers/").status_code == 200
    user.first_name = "Alice"
    user.save()  # not a password change: the token stays
    assert api.get("/api/v1/brokers/").status_code == 200
    user.set_password("second-pass-2")
    user.save()
    refused = api.get("/api/v1/brokers/")
    assert refused.status_code == 401 and "Invalid token" in refused.json()["error"]
    assert not Token.objects.filter(user=user).exists()
    assert AuditEntry.objects.filter(action="token.revoke", target="alice").exists()


def test_failed_logins_lock_out_the_user_at_that_address(user: User, settings) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    api = APIClient()
    url = "/api/v1/auth/token/"
    for _ in range(2):
        wrong = api.post(url, {"username": "alice", "password": "nope"}, format="json")
        assert wrong.status_code == 401
    locked = api.post(url, {"username": "alice", "password": "nope"}, format="json")
    assert locked.status_code == 429
    assert "too many failed logins" in locked.json()["error"]
    assert int(locked["Retry-After"]) > 0
    # even the right password is refused while locked
    right = api.post(url, {"username": "alice", "password": "first-pass-1"}, format="json")
    assert right.status_code == 429
    # the dashboard's login form shares the count
    page = Client().post("/accounts/login/", {"username": "alice", "password": "first-pass-1"})
    assert page.status_code == 429 and "Too many failed logins" in page.content.decode()
