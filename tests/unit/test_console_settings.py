"""The console's foundation: settings from the environment, checks, health, schema, auth."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import django
import pytest
from django.apps import apps

# pyproject.toml's [tool.pytest.ini_options] names the settings for the whole suite
# (DJANGO_SETTINGS_MODULE = "tests.settings", the console's with a fast hasher);
# this fallback keeps the module runnable without that line: pytest-django only
# sets Django up itself when the settings are named before collection.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
if not apps.ready:
    django.setup()

from console.environment import (
    SettingError,
    env_bool,
    env_list,
    env_str,
    load_or_create_secret_key,
    parse_database_url,
    resolve_path,
)
from tests.console_env import environ_without

REPO = Path(__file__).resolve().parents[2]


# -- the parsing helpers ------------------------------------------------------------------


class TestDatabaseUrl:
    def test_sqlite_relative_path_is_taken_from_the_checkout(self, tmp_path: Path) -> None:
        db = parse_database_url("sqlite:///var/console.sqlite3", tmp_path)
        assert db["ENGINE"] == "django.db.backends.sqlite3"
        assert db["NAME"] == tmp_path / "var" / "console.sqlite3"

    def test_sqlite_four_slashes_is_absolute(self, tmp_path: Path) -> None:
        db = parse_database_url("sqlite:////srv/rookery/console.sqlite3", tmp_path)
        assert db["NAME"] == Path("/srv/rookery/console.sqlite3")

    def test_sqlite_file_gets_concurrency_options(self, tmp_path: Path) -> None:
        options = parse_database_url("sqlite:///x.sqlite3", tmp_path)["OPTIONS"]
        assert options["transaction_mode"] == "IMMEDIATE"
        assert "journal_mode=WAL" in options["init_command"]

    def test_sqlite_file_connections_are_kept(self, tmp_path: Path) -> None:
        """A status arrives 50 times a second at 50 brokers: no new connection for each."""
        assert parse_database_url("sqlite:///x.sqlite3", tmp_path)["CONN_MAX_AGE"] > 0

    @pytest.mark.parametrize("url", ["sqlite://:memory:", "sqlite:///:memory:"])
    def test_sqlite_memory(self, url: str, tmp_path: Path) -> None:
        assert parse_database_url(url, tmp_path) == {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": ":memory:",
        }

    def test_postgres_full(self, tmp_path: Path) -> None:
        db = parse_database_url(
            "postgres://rookery:s%40cr%3At@db.internal:6543/console?sslmode=require", tmp_path
        )
        assert db == {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "console",
            "USER": "rookery",
            "PASSWORD": "s@cr:t",
            "HOST": "db.internal",
            "PORT": "6543",
            "OPTIONS": {"sslmode": "require"},
        }

    @pytest.mark.parametrize("scheme", ["postgres", "postgresql", "pgsql"])
    def test_postgres_without_port_or_password(self, scheme: str, tmp_path: Path) -> None:
        db = parse_database_url(f"{scheme}://rookery@localhost/console", tmp_path)
        assert db["ENGINE"] == "django.db.backends.postgresql"
        assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == (
            "rookery",
            "",
            "localhost",
            "",
        )
        assert "OPTIONS" not in db

    def test_postgres_needs_a_database_name_and_hides_the_password(self, tmp_path: Path) -> None:
        with pytest.raises(SettingError, match="must name one database") as info:
            parse_database_url("postgres://u:hunter2@host:5432/", tmp_path)
        assert "hunter2" not in str(info.value)

    def test_postgres_bad_port(self, tmp_path: Path) -> None:
        with pytest.raises(SettingError, match="bad port"):
            parse_database_url("postgres://u@host:port/db", tmp_path)

    @pytest.mark.parametrize("url", ["mysql://u:p@h/db", "console.sqlite3", ""])
    def test_unsupported_scheme(self, url: str, tmp_path: Path) -> None:
        with pytest.raises(SettingError, match="not supported"):
            parse_database_url(url, tmp_path)

    def test_sqlite_with_a_host_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(SettingError, match="no host"):
            parse_database_url("sqlite://var/console.sqlite3", tmp_path)


class TestEnvHelpers:
    def test_list_trims_and_drops_empty_items(self) -> None:
        env = {"ALLOWED_HOSTS": " console.example.com, 10.0.0.5,, "}
        assert env_list("ALLOWED_HOSTS", "127.0.0.1,localhost", env) == [
            "console.example.com",
            "10.0.0.5",
        ]

    def test_list_default_when_unset_or_blank(self) -> None:
        assert env_list("ALLOWED_HOSTS", "127.0.0.1,localhost", {}) == ["127.0.0.1", "localhost"]
        assert env_list("ALLOWED_HOSTS", "a", {"ALLOWED_HOSTS": "  "}) == ["a"]

    def test_str_default_when_empty(self) -> None:
        assert env_str("REDIS_URL", "redis://127.0.0.1:6379/0", {"REDIS_URL": ""}) == (
            "redis://127.0.0.1:6379/0"
        )
        assert env_str("REDIS_URL", "x", {"REDIS_URL": "redis://r:6380/2"}) == "redis://r:6380/2"

    @pytest.mark.parametrize(
        ("raw", "expected"),
        [("1", True), ("TRUE", True), ("on", True), ("0", False), ("no", False)],
    )
    def test_bool(self, raw: str, expected: bool) -> None:
        assert env_bool("DEBUG", not expected, {"DEBUG": raw}) is expected

    def test_bool_refuses_nonsense(self) -> None:
        with pytest.raises(SettingError, match="DEBUG='maybe' is not a boolean"):
            env_bool("DEBUG", False, {"DEBUG": "maybe"})

    def test_resolve_path(self, tmp_path: Path) -> None:
        assert resolve_path("var", tmp_path) == tmp_path / "var"
        assert resolve_path("/srv/data", tmp_path) == Path("/srv/data")


@pytest.mark.integration  # starts a Python process
def test_secret_key_is_generated_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "secret_key"
    key = load_or_create_secret_key(path)
    assert len(key) >= 50
    assert load_or_create_secret_key(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert list(path.parent.iterdir()) == [path]  # no temporary files left behind


# -- the settings module, imported fresh with a given environment -----------------------


def _settings_in_subprocess(env: dict[str, str]) -> dict:
    code = (
        "import json, console.settings as s\n"
        "print(json.dumps({k: getattr(s, k) for k in dir(s) if k.isupper()}, default=str))\n"
    )
    clean = environ_without()
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.integration  # starts a Python process
def test_settings_read_the_environment(tmp_path: Path) -> None:
    s = _settings_in_subprocess(
        {
            "DATA_DIR": str(tmp_path),
            "SECRET_KEY": "k" * 60,
            "DEBUG": "1",
            "ALLOWED_HOSTS": "console.example.com,10.0.0.5",
            "DATABASE_URL": "postgres://rookery:pw@db.internal:5432/console",
            "REDIS_URL": "redis://redis.internal:6380/2",
            "CONSOLE_BROKER_TOKEN": "broker-token",
            "SPARK_MASTER": "spark://spark.internal:7077",
        }
    )
    assert s["SECRET_KEY"] == "k" * 60
    assert s["DEBUG"] is True
    assert s["ALLOWED_HOSTS"] == ["console.example.com", "10.0.0.5"]
    db = s["DATABASES"]["default"]
    assert (db["ENGINE"], db["HOST"], db["PORT"], db["NAME"], db["USER"]) == (
        "django.db.backends.postgresql",
        "db.internal",
        "5432",
        "console",
        "rookery",
    )
    assert s["REDIS_URL"] == "redis://redis.internal:6380/2"
    assert s["CELERY_BROKER_URL"] == "redis://redis.internal:6380/2"
    layer = s["CHANNEL_LAYERS"]["default"]
    assert layer["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert layer["CONFIG"]["hosts"][0]["address"] == "redis://redis.internal:6380/2"
    assert s["CONSOLE_BROKER_TOKEN"] == "broker-token"
    assert s["SPARK_MASTER"] == "spark://spark.internal:7077"
    assert s["DATA_DIR"] == str(tmp_path)
    assert s["STATIC_ROOT"] == str(tmp_path / "static")
    # DEBUG without CONSOLE_HTTPS: plain-HTTP development, cookies not marked Secure
    assert s["SESSION_COOKIE_SECURE"] is False
    assert not (tmp_path / "secret_key").exists()


@pytest.mark.integration  # starts a Python process
def test_settings_defaults(tmp_path: Path) -> None:
    s = _settings_in_subprocess({"DATA_DIR": str(tmp_path)})
    assert s["DEBUG"] is False
    assert s["ALLOWED_HOSTS"] == ["127.0.0.1", "localhost"]
    assert s["DATABASES"]["default"]["ENGINE"] == "django.db.backends.sqlite3"
    assert s["DATABASES"]["default"]["NAME"] == str(tmp_path / "console.sqlite3")
    assert s["REDIS_URL"] == s["CELERY_BROKER_URL"] == "redis://127.0.0.1:6379/0"
    hosts = s["CHANNEL_LAYERS"]["default"]["CONFIG"]["hosts"]
    assert hosts == [{"address": "redis://127.0.0.1:6379/0", "socket_timeout": 30}]
    assert s["CONSOLE_BROKER_TOKEN"] == ""
    assert s["SPARK_MASTER"] == "local[*]"
    # no SECRET_KEY: generated, persisted under DATA_DIR, stable across starts
    assert s["SECRET_KEY"] == (tmp_path / "secret_key").read_text().strip()
    assert _settings_in_subprocess({"DATA_DIR": str(tmp_path)})["SECRET_KEY"] == s["SECRET_KEY"]
    # not DEBUG: served over HTTPS behind the proxy, cookies Secure
    assert s["SESSION_COOKIE_SECURE"] is True
    assert s["CSRF_COOKIE_SECURE"] is True
    assert s["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


@pytest.mark.integration  # starts a Python process
def test_bad_database_url_stops_the_console_with_a_clear_message(tmp_path: Path) -> None:
    clean = environ_without()
    result = subprocess.run(
        [sys.executable, "-c", "import console.settings"],
        cwd=REPO,
        env={**clean, "DATA_DIR": str(tmp_path), "DATABASE_URL": "mysql://u:p@h/db"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "DATABASE_URL scheme 'mysql' is not supported" in result.stderr


# -- Django itself ------------------------------------------------------------------------


def test_system_checks_pass() -> None:
    from django.core.management import call_command

    call_command("check", fail_level="WARNING")


@pytest.mark.django_db
def test_no_model_changes_without_migrations() -> None:
    from django.core.management import call_command

    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_installed_apps_and_api_defaults() -> None:
    from django.conf import settings

    assert settings.INSTALLED_APPS[0] == "daphne"
    for app in ("channels", "rest_framework", "rest_framework.authtoken", "drf_spectacular"):
        assert app in settings.INSTALLED_APPS
    assert settings.INSTALLED_APPS[-1] == "clusterapi"
    rf = settings.REST_FRAMEWORK
    assert rf["DEFAULT_AUTHENTICATION_CLASSES"] == [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ]
    assert rf["DEFAULT_PERMISSION_CLASSES"] == ["rest_framework.permissions.IsAuthenticated"]
    assert rf["DEFAULT_SCHEMA_CLASS"] == "clusterapi.api.schema.ApiSchema"
    assert rf["PAGE_SIZE"] > 0


def test_celery_app_is_configured_from_django_settings() -> None:
    from django.conf import settings

    from console import celery_app

    assert celery_app.main == "console"
    assert celery_app.conf.broker_url == settings.CELERY_BROKER_URL == settings.REDIS_URL


def test_healthz(client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"]
    assert client.post("/healthz").status_code == 405


def test_openapi_schema(client) -> None:
    response = client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Rookery admin API"
    assert "post" in schema["paths"]["/api/v1/auth/token/"]
    assert {"tokenAuth", "cookieAuth"} <= set(schema["components"]["securitySchemes"])


@pytest.mark.django_db
class TestAuthToken:
    URL = "/api/v1/auth/token/"

    @pytest.fixture
    def operator(self, django_user_model):
        return django_user_model.objects.create_user("operator", password="correct horse 42")

    def test_token_for_good_credentials(self, client, operator) -> None:
        from rest_framework.authtoken.models import Token

        response = client.post(
            self.URL,
            {"username": "operator", "password": "correct horse 42"},
            content_type="application/json",
        )
        assert response.status_code == 200
        body = response.json()
        assert set(body) == {"token"}
        assert body["token"] == Token.objects.get(user=operator).key
        # asking again returns the same token; a form post works as well
        again = client.post(self.URL, {"username": "operator", "password": "correct horse 42"})
        assert again.json() == body

    @pytest.mark.parametrize(
        "credentials",
        [
            {"username": "operator", "password": "wrong"},
            {"username": "nobody", "password": "correct horse 42"},
        ],
    )
    def test_bad_credentials_give_a_json_401(self, client, operator, credentials) -> None:
        response = client.post(self.URL, credentials, content_type="application/json")
        assert response.status_code == 401
        assert response["Content-Type"] == "application/json"
        assert response["WWW-Authenticate"] == "Token"
        body = response.json()
        assert "token" not in body
        assert body["error"] == "Unable to log in with provided credentials."

    def test_missing_password_names_the_field(self, client, operator) -> None:
        response = client.post(self.URL, {"username": "operator"}, content_type="application/json")
        assert response.status_code == 400
        body = response.json()
        assert body["error"].startswith("password:")
        assert "password" in body["detail"]

    def test_get_is_not_allowed(self, client) -> None:
        response = client.get(self.URL)
        assert response.status_code == 405
        assert "detail" in response.json()


# -- browser pages ------------------------------------------------------------------------


@pytest.mark.django_db
def test_login_page_renders_with_a_csrf_token(client) -> None:
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="csrfmiddlewaretoken"' in html
    assert 'name="username"' in html
    assert 'name="password"' in html
    assert "csrftoken" in response.cookies


@pytest.mark.django_db
def test_login_needs_the_csrf_token_then_lands_home(django_user_model) -> None:
    from django.test import Client

    django_user_model.objects.create_user("operator", password="correct horse 42")
    browser = Client(enforce_csrf_checks=True)
    credentials = {"username": "operator", "password": "correct horse 42"}
    assert browser.post("/accounts/login/", credentials).status_code == 403

    page = browser.get("/accounts/login/")
    token = page.context["csrf_token"]
    response = browser.post("/accounts/login/", {**credentials, "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert response["Location"] == "/"
    home = browser.get("/")
    assert home.status_code == 200
    assert "operator" in home.content.decode()

    logout = browser.post("/accounts/logout/", {"csrfmiddlewaretoken": home.context["csrf_token"]})
    assert logout.status_code == 302
    assert logout["Location"] == "/accounts/login/"
    assert browser.get("/").status_code == 302


@pytest.mark.django_db
def test_admin_and_home_require_login(client) -> None:
    admin = client.get("/admin/")
    assert admin.status_code == 302
    assert admin["Location"] == "/admin/login/?next=/admin/"
    home = client.get("/")
    assert home.status_code == 302
    assert home["Location"] == "/accounts/login/?next=/"


@pytest.mark.django_db
def test_bad_login_shows_an_error(client, django_user_model) -> None:
    django_user_model.objects.create_user("operator", password="correct horse 42")
    response = client.post("/accounts/login/", {"username": "operator", "password": "nope"})
    assert response.status_code == 200
    assert 'role="alert"' in response.content.decode()


# -- the ASGI application ----------------------------------------------------------------


async def test_asgi_serves_http() -> None:
    from channels.testing import HttpCommunicator

    from console.asgi import application

    communicator = HttpCommunicator(
        application, "GET", "/healthz", headers=[(b"host", b"127.0.0.1")]
    )
    response = await communicator.get_response()
    assert response["status"] == 200
    assert json.loads(response["body"]) == {"status": "ok"}


async def test_asgi_websocket_refuses_foreign_origins(settings) -> None:
    # The refusal goes through a consumer, which attaches to the channel layer:
    # use the in-memory one rather than needing Redis.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    from channels.testing import WebsocketCommunicator

    from console.asgi import application

    communicator = WebsocketCommunicator(
        application, "/ws/anything/", headers=[(b"origin", b"https://evil.example")]
    )
    connected, _ = await communicator.connect()
    assert connected is False
    await communicator.disconnect()
