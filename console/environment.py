"""Read the console's configuration from the environment.

Plain functions with no Django import, so that ``console.settings`` stays a
flat list of assignments and the parsing can be tested on its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}

POSTGRES_SCHEMES = {"postgres", "postgresql", "pgsql"}
SQLITE_SCHEMES = {"sqlite"}


_ASCII_INT = re.compile(r"[+-]?[0-9]+")


class SettingError(ValueError):
    """A setting in the environment cannot be used; the message names it."""


def ascii_int(text: str) -> int:
    """Parse a decimal integer of ASCII digits only.

    ``int()`` also takes other scripts' digits ('١٢'), blanks and underscores,
    and ``str.isdigit()`` takes superscripts ('¹') that ``int()`` then refuses:
    client input is held to ``[+-]?[0-9]+``. Raises ValueError otherwise."""
    if not isinstance(text, str) or not _ASCII_INT.fullmatch(text):
        raise ValueError(f"{text!r} is not a decimal integer")
    return int(text)


def new_token(nbytes: int = 32) -> str:
    """A URL-safe random token that never starts with '-', so that it can follow
    an option on any command line without being read as an option itself."""
    while True:
        token = secrets.token_urlsafe(nbytes)
        if not token.startswith("-"):
            return token


def env_str(name: str, default: str, environ: Mapping[str, str] | None = None) -> str:
    """``environ[name]`` with surrounding blanks removed; ``default`` if unset or empty."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or default


def env_bool(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SettingError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, environ: Mapping[str, str] | None = None) -> int:
    raw = env_str(name, "", environ)
    if not raw:
        return default
    try:
        return ascii_int(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not an integer") from None


def env_list(name: str, default: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """A comma-separated list (``"a, b,,c"`` -> ``["a", "b", "c"]``)."""
    return split_list(env_str(name, default, environ))


def split_list(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def resolve_path(value: str | os.PathLike[str], base: Path) -> Path:
    """``value`` as an absolute path; a relative one is taken from ``base`` (the checkout)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path)


def parse_database_url(url: str, base_dir: Path) -> dict[str, Any]:
    """Turn ``DATABASE_URL`` into one entry of Django's ``DATABASES``.

    - ``sqlite:///var/console.sqlite3``: a path relative to ``base_dir``;
      ``sqlite:////srv/console.sqlite3`` (four slashes): an absolute path;
      ``sqlite://:memory:`` or ``sqlite:///:memory:``: an in-memory database.
    - ``postgres://user:password@host:5432/dbname?sslmode=require``
      (also ``postgresql://``, ``pgsql://``): user and password are
      percent-decoded; query parameters become ``OPTIONS``; host and port
      may be left out (libpq defaults, including a Unix socket).
    """
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme in SQLITE_SCHEMES:
        return _sqlite(url, parts.netloc, parts.path, base_dir)
    if scheme in POSTGRES_SCHEMES:
        return _postgres(url, parts)
    shown = scheme or url
    raise SettingError(
        f"DATABASE_URL scheme {shown!r} is not supported "
        "(use sqlite:///path/to/file.sqlite3 or postgres://user:password@host:port/dbname)"
    )


#: seconds a SQLite connection is kept for reuse (a local file: no server holds it)
SQLITE_CONN_MAX_AGE = 600


def _sqlite(url: str, netloc: str, path: str, base_dir: Path) -> dict[str, Any]:
    if netloc == ":memory:" or path in ("/:memory:", ":memory:"):
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}
    if netloc:
        raise SettingError(
            f"DATABASE_URL {url!r}: a SQLite URL has no host; write sqlite:///relative/path "
            "or sqlite:////absolute/path"
        )
    # urlsplit keeps the leading slash of the path: "sqlite:///var/x" -> "/var/x" (relative),
    # "sqlite:////srv/x" -> "//srv/x" (absolute).
    name = unquote(path[1:] if path.startswith("/") else path)
    if not name:
        raise SettingError(f"DATABASE_URL {url!r} names no SQLite file")
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": resolve_path(name, base_dir),
        # kept open between requests and broker statuses: opening one (with the pragmas
        # below) cost Daphne a tenth of its time at 50 statuses a second (issue 43)
        "CONN_MAX_AGE": SQLITE_CONN_MAX_AGE,
        # Daphne, the Celery worker and beat share the file: WAL lets readers run
        # beside the writer, IMMEDIATE transactions avoid "database is locked"
        # on lock upgrades, busy_timeout waits instead of failing at once.
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }


def ensure_sqlite_directory(database: Mapping[str, Any]) -> None:
    """Create the directory of a SQLite database file (a fresh checkout has no ``var/``),
    0700, and the file itself, 0600, before SQLite does.

    The database holds the console's password hashes, API tokens and configuration
    documents: SQLite would create it with the process's umask (0644 by default),
    and its ``-wal`` and ``-shm`` files take the database file's mode, so creating
    it private keeps all three private from the first write. A file that exists is
    left as it is. Failure is left for the database layer to report.
    """
    if database["ENGINE"].endswith("sqlite3") and str(database["NAME"]) != ":memory:":
        path = Path(database["NAME"])
        with contextlib.suppress(OSError):
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _postgres(url: str, parts: Any) -> dict[str, Any]:
    name = unquote(parts.path.lstrip("/"))
    if not name or "/" in name:
        raise SettingError(
            f"DATABASE_URL {_redact(url)!r} must name one database: postgres://user:pass@host:port/db"
        )
    try:
        port = parts.port
    except ValueError:
        raise SettingError(f"DATABASE_URL {_redact(url)!r} has a bad port") from None
    config: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": unquote(parts.hostname or ""),
        "PORT": str(port) if port else "",
    }
    options = dict(parse_qsl(parts.query, keep_blank_values=False))
    if options:
        config["OPTIONS"] = options
    return config


def _redact(url: str) -> str:
    """``url`` with its password replaced, for error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def load_or_create_secret_key(path: Path) -> str:
    """The secret key persisted at ``path``, creating it (mode 0600) on first use.

    Safe when several processes (Daphne, Celery worker, beat) start together:
    the key is written to a private temporary file and linked into place, so
    the first process wins and everyone reads the same complete key.
    """
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = ""
    if key:
        return key
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".secret_key.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as tmp:  # mkstemp creates the file with mode 0600
            tmp.write(new_token(50) + "\n")
        with contextlib.suppress(FileExistsError):  # another process won: use its key
            os.link(tmp_name, path)
    finally:
        os.unlink(tmp_name)
    key = path.read_text().strip()
    if not key:
        raise SettingError(f"secret key file {path} is empty; delete it or set SECRET_KEY")
    return key
