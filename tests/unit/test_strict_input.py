"""Client input is parsed strictly: tokens that look like options, and digits that
only look like ASCII digits (issue: random CI failures from both)."""

from __future__ import annotations

import secrets

import pytest
from django.contrib.auth.models import User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from brokerd.cli import build_parser, join_option_values
from brokerd.cluster.config import ClusterConfigError, parse_host
from brokerd.model.auth import check_password, hash_password, is_password_hash
from clusterapi.api.filters import broker_pk
from clusterapi.models import Broker
from console.celery import nightly_schedule
from console.environment import SettingError, ascii_int, env_int, new_token

#: digits that ``str.isdigit()`` or ``int()`` accept but that are not ASCII
#: (\U0001d7d9 is MATHEMATICAL DOUBLE-STRUCK DIGIT ONE)
NOT_ASCII = ["¹6", "١٢", "\U0001d7d9", "²", "٣"]


def parse(argv: list[str]):
    return build_parser().parse_args(join_option_values(argv, ("--console-token",)))


@pytest.mark.parametrize("token", ["-abc", "--abc", "-", "-x=y", "plain"])
def test_console_token_may_start_with_a_dash(token: str):
    spaced = parse(["--console", "ws://127.0.0.1:1/", "--console-token", token])
    equals = parse(["--console", "ws://127.0.0.1:1/", f"--console-token={token}"])
    assert spaced.console_token == equals.console_token == token


def test_join_option_values_leaves_other_arguments_alone():
    argv = ["--port", "5672", "--console-token", "-t", "--", "--console-token", "x"]
    assert join_option_values(argv, ("--console-token",)) == [
        "--port",
        "5672",
        "--console-token=-t",
        "--",
        "--console-token",
        "x",
    ]
    assert join_option_values(["--console-token"], ("--console-token",)) == ["--console-token"]


def test_new_token_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch):
    rolls = iter(["-first", "--second", "third"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(rolls))
    assert new_token(8) == "third"


def test_new_tokens_are_random_and_dashless():
    tokens = {new_token(3) for _ in range(2000)}  # 4 characters: '-' first ~1 in 64
    assert len(tokens) > 1900
    assert not any(t.startswith("-") for t in tokens)


@pytest.mark.parametrize("text", [*NOT_ASCII, " 1", "1 ", "1_000", "", "0x1", "1.0"])
def test_ascii_int_refuses_what_is_not_ascii_digits(text: str):
    with pytest.raises(ValueError):
        ascii_int(text)
    assert broker_pk(text) is None


def test_ascii_int_and_broker_pk_accept_ascii_digits():
    assert ascii_int("42") == 42 and ascii_int("-3") == -3
    assert broker_pk("16") == 16
    assert broker_pk("9" * 19) is None  # past the database's integer


@pytest.mark.parametrize("text", NOT_ASCII)
def test_environment_integers_are_ascii(text: str):
    with pytest.raises(SettingError):
        env_int("X", 1, {"X": text})


@pytest.mark.parametrize("text", ["¹2:00", "١٢:00", "12:\U0001d7d90", "12:0²"])
def test_nightly_schedule_refuses_unicode_digits(text: str):
    with pytest.raises(ValueError, match="REPORT_NIGHTLY_AT"):
        nightly_schedule(text)


@pytest.mark.parametrize("port", [*NOT_ASCII, "1_0", " 5672"])
def test_known_host_ports_are_ascii(port: str):
    with pytest.raises(ClusterConfigError, match="bad port"):
        parse_host(f"h:{port}", "known_hosts[0]")


@pytest.mark.parametrize("port", [*NOT_ASCII, "1_0"])
def test_cli_port_is_ascii(port: str, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        parse(["--port", port])
    assert "--port" in capsys.readouterr().err


@pytest.mark.parametrize("iterations", ["¹", "١٢", "\U0001d7d9", "0", "99999999999"])
def test_password_hash_iterations_are_strict(iterations: str):
    good = hash_password("pw", iterations=1000)
    bad = good.replace("$1000$", f"${iterations}$")
    assert is_password_hash(good) and check_password("pw", good)
    assert not is_password_hash(bad)
    assert not check_password("pw", bad)


@pytest.mark.django_db
@pytest.mark.usefixtures("in_memory_layer")
@pytest.mark.parametrize("value", NOT_ASCII)
def test_api_broker_ids_in_other_scripts_are_names_not_500s(value: str):
    user = User.objects.create_user("viewer", password="pw-viewer-1")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    Broker.objects.create(name="127.0.0.1:5701", spid="s1", address="127.0.0.1:5701")
    for path in ("bindings", "queues", "exchanges"):
        response = client.get(f"/api/v1/{path}/", {"broker": value})
        assert response.status_code == 200, response.content
        assert response.json()["count"] == 0
    response = client.get(f"/api/v1/brokers/{value}/")
    assert response.status_code == 404
    assert "error" in response.json()
