"""deploy/quickstart.py without processes: environment, state files, cluster file."""

from __future__ import annotations

import importlib.util
import io
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quickstart", REPO / "deploy/quickstart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["quickstart"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


qs = _load()


def config(tmp_path: Path, **env: str):
    return qs.QuickstartConfig.from_env({"DATA_DIR": str(tmp_path), **env})


def test_defaults_keep_clear_of_rabbitmq_and_redis(tmp_path: Path) -> None:
    c = config(tmp_path)
    assert c.listen_ports() == {
        "console": 8000,
        "primary1": 5701,
        "primary2": 5702,
        "primary3": 5703,
        "secondary": 5704,
        "redis": 6390,
    }
    assert c.admin_user == "admin" and c.admin_password is None
    assert c.data_dir == tmp_path and c.celery_loglevel == "WARNING"


def test_environment_overrides_and_external_redis(tmp_path: Path) -> None:
    c = config(
        tmp_path,
        ROOKERY_CONSOLE_PORT="18000",
        ROOKERY_BROKER_PORTS="1, 2,3,4",
        REDIS_URL="redis://elsewhere:6379/1",
        ROOKERY_ADMIN_USER="ops",
        ROOKERY_ADMIN_PASSWORD="s3cret-pass",
    )
    assert c.broker_ports == (1, 2, 3, 4) and c.console_port == 18000
    assert "redis" not in c.listen_ports()  # no embedded Redis to start
    assert (c.admin_user, c.admin_password) == ("ops", "s3cret-pass")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ROOKERY_BROKER_PORTS": "5701,5702"}, "give 4 ports"),
        ({"ROOKERY_CONSOLE_PORT": "http"}, "not a port number"),
        ({"ROOKERY_REDIS_PORT": "70000"}, "1-65535"),
        ({"ROOKERY_CONSOLE_PORT": "5701"}, "must all differ"),
    ],
)
def test_bad_environment_is_a_clear_error(tmp_path: Path, env: dict, message: str) -> None:
    with pytest.raises(qs.QuickstartError, match=message):
        config(tmp_path, **env)


def test_secret_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "admin-password"
    value, created = qs.read_or_create_secret(path, lambda: "first")
    assert (value, created) == ("first", True)
    assert path.stat().st_mode & 0o777 == 0o600
    assert qs.read_or_create_secret(path, lambda: "second") == ("first", False)
    path.write_text("\n")
    with pytest.raises(qs.QuickstartError, match="is empty"):
        qs.read_or_create_secret(path, lambda: "third")


def test_cluster_file_is_reused_and_follows_moved_primaries(tmp_path: Path) -> None:
    out = qs.Output(io.StringIO())
    c = config(tmp_path)
    qs.ensure_cluster_file(c, out)
    first = c.cluster_file.read_text()
    parsed = tomllib.loads(first)
    assert parsed["known_hosts"] == ["127.0.0.1:5701", "127.0.0.1:5702", "127.0.0.1:5703"]
    assert len(parsed["secret"]) >= 24 and c.cluster_file.stat().st_mode & 0o777 == 0o600

    qs.ensure_cluster_file(c, out)
    assert c.cluster_file.read_text() == first  # same ports: untouched

    moved = config(tmp_path, ROOKERY_BROKER_PORTS="6701,6702,6703,6704")
    qs.ensure_cluster_file(moved, out)
    again = tomllib.loads(moved.cluster_file.read_text())
    assert again["known_hosts"] == ["127.0.0.1:6701", "127.0.0.1:6702", "127.0.0.1:6703"]
    assert again["secret"] == parsed["secret"] and again["name"] == parsed["name"]
    assert "rewriting known_hosts" in out.stream.getvalue()


def test_output_prefixes_every_line_and_survives_a_closed_reader() -> None:
    stream = io.StringIO()
    out = qs.Output(stream, qs.PROCESS_NAMES)  # labels as wide as the longest name
    out.line("primary1", "hello")
    out.say("two\nlines")
    assert stream.getvalue().splitlines() == [
        "primary1  | hello",
        "rookery   | two",
        "rookery   | lines",
    ]
    stream.close()
    out.line("console", "after the reader left")  # no exception
    assert out.closed


def test_admin_password_generated_once_then_only_pointed_to(tmp_path: Path) -> None:
    stream = io.StringIO()
    c = config(tmp_path)
    password, where = qs.choose_admin_password(c, True, qs.Output(stream))
    assert password == c.password_file.read_text().strip() and len(password) >= 16
    assert where == f"in {c.password_file}"
    assert password in stream.getvalue() and "shown this once" in stream.getvalue()

    stream = io.StringIO()  # next run: the admin exists, its password is left alone
    assert qs.choose_admin_password(c, False, qs.Output(stream)) == (None, f"in {c.password_file}")
    assert password not in stream.getvalue()

    # The database was deleted but the file kept: the new admin gets the same password.
    assert qs.choose_admin_password(c, True, qs.Output(io.StringIO()))[0] == password


def test_admin_password_from_the_environment_replaces_the_file(tmp_path: Path) -> None:
    qs.read_or_create_secret(tmp_path / "admin-password", lambda: "generated-before")
    c = config(tmp_path, ROOKERY_ADMIN_PASSWORD="from-env-123")
    assert qs.choose_admin_password(c, False, qs.Output(io.StringIO())) == (
        "from-env-123",
        "from ROOKERY_ADMIN_PASSWORD",
    )
    assert not c.password_file.exists()  # stale: no later run points to it
    unset = config(tmp_path)
    password, where = qs.choose_admin_password(unset, False, qs.Output(io.StringIO()))
    assert password is None and "unchanged" in where


def test_the_closing_summary_says_where_the_password_is_in_every_case(tmp_path: Path) -> None:
    """After ROOKERY_ADMIN_PASSWORD (file removed), or a change in the console, the
    summary must not point to a file that is gone or no longer holds the password."""
    quiet = qs.Output(io.StringIO())
    from_env = config(tmp_path, ROOKERY_ADMIN_PASSWORD="from-env-123")
    _, where = qs.choose_admin_password(from_env, False, quiet)
    assert "from ROOKERY_ADMIN_PASSWORD" in qs.summary(from_env, where)
    # the next run without it: no file to point to
    plain = config(tmp_path)
    _, where = qs.choose_admin_password(plain, False, quiet)
    text = qs.summary(plain, where)
    assert str(plain.password_file) not in text and "unchanged" in text
    # a generated password that still works / that was changed in the console since
    fresh = config(tmp_path / "fresh")
    generated, where = qs.choose_admin_password(fresh, True, quiet)
    _, where = qs.choose_admin_password(fresh, False, quiet, works=lambda p: p == generated)
    assert where == f"in {fresh.password_file}"
    _, where = qs.choose_admin_password(fresh, False, quiet, works=lambda p: False)
    assert where.startswith("changed in the console") and "holds the old one" in where


def test_rookery_tls_rewrites_the_cluster_file_with_tls_links(tmp_path: Path) -> None:
    out = qs.Output(io.StringIO())
    plain = config(tmp_path)
    qs.ensure_cluster_file(plain, out)
    secret = tomllib.loads(plain.cluster_file.read_text())["secret"]
    tls = config(tmp_path, ROOKERY_TLS="1")
    assert tls.tls and tls.console_url.startswith("https://")
    qs.ensure_tls_files(tls, out)
    qs.ensure_cluster_file(tls, out)
    doc = tomllib.loads(tls.cluster_file.read_text())
    assert doc["secret"] == secret
    assert doc["tls"]["links"] == "required"
    assert Path(doc["tls"]["cafile"]) == tls.tls_dir / "ca.pem"
    assert (tls.tls_dir / "server.key").stat().st_mode & 0o777 == 0o600
    assert "links over TLS" in out.stream.getvalue()
    # back to plain: the [tls] table goes
    qs.ensure_cluster_file(plain, out)
    assert "tls" not in tomllib.loads(plain.cluster_file.read_text())


def test_only_the_brokers_stay_stopped_after_a_clean_exit(tmp_path: Path) -> None:
    """Brokers exit 0 after SIGTERM (a planned stop, to decommission); the console,
    Celery and Redis are restarted after any exit (operators restart them that way)."""
    c = config(tmp_path, REDIS_URL="redis://127.0.0.1:1/0")
    services = qs.build_services(c, {"CONSOLE_BROKER_TOKEN": "t"})
    kept = {s.name: s.keep_stopped for s in services}
    assert kept == {
        "console": False,
        "primary1": True,
        "primary2": True,
        "primary3": True,
        "secondary": True,
        "worker": False,
        "beat": False,
    }


def test_the_ctl_command_reaches_this_runs_data_dir(tmp_path: Path) -> None:
    c = config(tmp_path)
    assert c.control_socket == tmp_path / "quickstart.sock"
    command = c.ctl_command()
    assert command.startswith(f"DATA_DIR={tmp_path} ") and command.endswith(
        " deploy/quickstart.py ctl"
    )
    default = qs.QuickstartConfig.from_env({})
    assert default.ctl_command().endswith(" deploy/quickstart.py ctl")
    assert not default.ctl_command().startswith("DATA_DIR=")
    assert f"One service: {command} status | stop NAME" in qs.summary(c, "in a file")


def test_ctl_without_a_running_quickstart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    assert qs.ctl(["status"]) == 2
    assert f"no running `make run` with DATA_DIR={tmp_path}" in capsys.readouterr().err
    assert qs.ctl(["stop"]) == 2 and qs.ctl(["halt", "primary1"]) == 2
    assert "ctl status | stop NAME | start NAME | restart NAME" in capsys.readouterr().err
