"""brokerd's own configuration file (TOML): users, vhosts, permissions, limits.

Read at start and again on SIGHUP. With no file, the broker behaves like a
fresh RabbitMQ: vhost ``/`` and user ``guest``/``guest``, loopback only.

    [limits]
    frame_max = 131072
    heartbeat = 60

    [[vhosts]]
    name = "/"

    [[users]]
    name = "app"
    password_hash = "pbkdf2_sha256$..."   # brokerd hash-password
    tags = ["administrator"]

    [[permissions]]
    user = "app"
    vhost = "/"
    configure = ".*"
    write = ".*"
    read = ".*"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from brokerd.model.auth import Permission, User, UserDatabase, hash_password
from brokerd.model.broker import Limits


class ConfigError(Exception):
    """The configuration cannot be used; the message names the problem."""


@dataclass
class BrokerConfig:
    vhosts: list[str] = field(default_factory=lambda: ["/"])
    users: list[User] = field(default_factory=list)
    permissions: list[tuple[str, str, Permission]] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)

    def user_database(self) -> UserDatabase:
        db = UserDatabase()
        for user in self.users:
            db.add_user(user)
        for user_name, vhost, permission in self.permissions:
            db.set_permission(user_name, vhost, permission)
        return db


def default_config() -> BrokerConfig:
    """RabbitMQ's out-of-the-box state: guest/guest on ``/``, from loopback only."""
    return BrokerConfig(
        vhosts=["/"],
        users=[User("guest", hash_password("guest"), ("administrator",), loopback_only=True)],
        permissions=[("guest", "/", Permission())],
    )


def load_config(path: Path | None) -> BrokerConfig:
    if path is None:
        return default_config()
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    return parse_config(raw, str(path))


def parse_config(raw: dict[str, Any], where: str = "config") -> BrokerConfig:
    unknown = set(raw) - {"limits", "vhosts", "users", "permissions"}
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {', '.join(sorted(unknown))}")
    config = BrokerConfig(vhosts=[], users=[], permissions=[])
    limits = raw.get("limits", {})
    if not isinstance(limits, dict):
        raise ConfigError(f"{where}: [limits] must be a table")
    for section in ("vhosts", "users", "permissions"):
        entries = raw.get(section, [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ConfigError(f"{where}: '{section}' must be an array of tables ([[{section}]])")
    known = {f.name for f in fields(Limits)}
    for key, value in limits.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown limit '{key}' (known: {', '.join(sorted(known))})")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{where}: limit '{key}' must be a non-negative integer")
        setattr(config.limits, key, value)
    if config.limits.frame_max and config.limits.frame_max < 4096:
        raise ConfigError(f"{where}: frame_max must be at least 4096")
    for entry in raw.get("vhosts", [{"name": "/"}]):
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: every [[vhosts]] entry needs a non-empty 'name'")
        config.vhosts.append(name)
    for entry in raw.get("users", []):
        name, pw_hash = entry.get("name"), entry.get("password_hash")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: every [[users]] entry needs a 'name'")
        if not isinstance(pw_hash, str) or not pw_hash.startswith("pbkdf2_sha256$"):
            raise ConfigError(
                f"{where}: user '{name}' needs a 'password_hash' made by 'brokerd hash-password'"
            )
        tags = entry.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ConfigError(f"{where}: user '{name}' tags must be a list of strings")
        config.users.append(
            User(
                name,
                pw_hash,
                tuple(tags),
                loopback_only=bool(entry.get("loopback_only", name == "guest")),
            )
        )
    users = {u.name for u in config.users}
    for entry in raw.get("permissions", []):
        user, vhost = entry.get("user"), entry.get("vhost", "/")
        if user not in users:
            raise ConfigError(f"{where}: permission for unknown user '{user}'")
        if vhost not in config.vhosts:
            raise ConfigError(f"{where}: permission on unknown vhost '{vhost}'")
        perm = Permission(*(entry.get(k, ".*") for k in ("configure", "write", "read")))
        for kind in ("configure", "write", "read"):
            try:
                perm.allows(kind, "")
            except Exception as exc:
                raise ConfigError(f"{where}: bad {kind} pattern for '{user}': {exc}") from None
        config.permissions.append((user, vhost, perm))
    if not config.users:
        defaults = default_config()
        config.users = defaults.users
        config.permissions += [p for p in defaults.permissions if p[1] in config.vhosts]
    return config
