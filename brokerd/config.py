"""brokerd's own configuration file (TOML): users, vhosts, permissions, limits.

Read at start and again on SIGHUP. With no file, the broker behaves like a
fresh RabbitMQ: vhost ``/`` and user ``guest``/``guest``, loopback only.

    [limits]
    frame_max = 131072
    heartbeat = 60
    max_connections = 1000              # off unless set; also max_queues, max_exchanges
    vm_memory_high_watermark = 0.4      # or an absolute size: "2GiB"
    disk_free_limit = "50MB"

    [[vhosts]]
    name = "/"
    limits = { max_connections = 100, max_queues = 500, max_exchanges = 50, channel_max = 64 }

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

    [tls]                               # the AMQPS listener (--tls-port): brokerd.tls
    certfile = "server.pem"             # paths relative to this file's folder
    keyfile = "server.key"
    cafile = "ca.pem"
    verify = "peer"                     # none | peer | peer_required

SIGHUP reloads the ``[tls]`` certificates too (new handshakes use them;
established connections stay up).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from brokerd.model.auth import Permission, User, UserDatabase, hash_password, is_password_hash
from brokerd.model.limits import Limits, VhostLimits
from brokerd.tls import TLSConfigError, TLSSettings, parse_tls


class ConfigError(Exception):
    """The configuration cannot be used; the message names the problem."""


#: the largest value each limit may take: the AMQP field width, or a sane ceiling
LIMIT_MAXIMA: dict[str, int] = {
    "frame_max": 2**32 - 1,
    "channel_max": 65535,
    "heartbeat": 65535,
    "max_message_size": 512 * 1024 * 1024,
    "max_returns_per_second": 1_000_000,
}
#: AMQP's frame_min_size: no peer may be asked to use smaller frames
FRAME_MIN = 4096
USER_KEYS = frozenset({"name", "password_hash", "tags"})
PERMISSION_KEYS = frozenset({"user", "vhost", "configure", "write", "read"})
PERMISSION_KINDS = ("configure", "write", "read")


@dataclass
class StoreSettings:
    """``[store]``: how the disk store keeps messages (DATA_DIR/store)."""

    #: bytes of message bodies a queue keeps in memory before paging new ones to disk
    queue_memory_limit: int = 64 * 1024 * 1024
    #: size of a journal segment file
    segment_size: int = 16 * 1024 * 1024
    #: seconds between journal compaction passes
    compact_interval: float = 5.0


@dataclass
class BrokerConfig:
    vhosts: list[str] = field(default_factory=lambda: ["/"])
    users: list[User] = field(default_factory=list)
    permissions: list[tuple[str, str, Permission]] = field(default_factory=list)
    limits: Limits = field(default_factory=Limits)
    store: StoreSettings = field(default_factory=StoreSettings)
    #: per vhost name; vhosts not listed have no limits of their own
    vhost_limits: dict[str, VhostLimits] = field(default_factory=dict)
    #: ``[tls]``: the AMQPS listener's certificate and client verification (None: none)
    tls: TLSSettings | None = None
    #: what the file set itself ("limits.frame_max", "users", ...): the rest is default
    #: (``brokerd ctl status`` and the console say where each setting comes from)
    explicit: frozenset[str] = frozenset()

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
    return parse_config(raw, str(path), path.parent)


# -- the parts shared by brokerd.toml and the console's document (brokerd.configdoc) --
# ``key`` is where the value sits, e.g. "brokerd.toml: users[1]" or "users[1]";
# every message starts with it so the operator sees which entry is wrong.


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_keys(entry: dict[str, Any], allowed: frozenset[str], key: str) -> None:
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ConfigError(f"{key}: unknown key(s) {', '.join(map(repr, unknown))}")


#: sizes in brokerd.toml as RabbitMQ writes them: kB/MB/GB powers of 1000, k/K/KiB/M/MiB/...
#: powers of 1024
SIZE_UNITS = {
    "": 1,
    "B": 1,
    "kB": 1000,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    **{unit: 1024 for unit in ("k", "K", "kiB", "KiB")},
    **{unit: 1024**2 for unit in ("M", "MiB")},
    **{unit: 1024**3 for unit in ("G", "GiB")},
    **{unit: 1024**4 for unit in ("T", "TiB")},
}
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
#: limits that are off unless set (0 allows none, as in RabbitMQ)
COUNT_LIMITS = ("max_connections", "max_queues", "max_exchanges")
COUNT_MAX = 1_000_000_000
UNAUTHENTICATED_RANGE = (1024, 16 * 1024 * 1024)
#: the keys of [limits] (vm_memory_high_watermark_bytes is how a size watermark is kept)
LIMIT_KEYS = tuple(f.name for f in fields(Limits) if f.name != "vm_memory_high_watermark_bytes")
VHOST_LIMIT_KEYS = tuple(f.name for f in fields(VhostLimits))


def parse_size(value: object, key: str, *, minimum: int = 0) -> int:
    """Bytes from an integer or a string with a unit (``"50MB"``, ``"512MiB"``)."""
    size = None
    if _is_int(value):
        size = int(value)  # type: ignore[call-overload]
    elif isinstance(value, str):
        match = _SIZE.fullmatch(value)
        if match and match.group(2) in SIZE_UNITS:
            size = int(match.group(1)) * SIZE_UNITS[match.group(2)]
    if size is None or size < 0:
        raise ConfigError(
            f'{key}: must be a number of bytes or a size such as "50MB" or "512MiB" '
            f"(units: {', '.join(u for u in SIZE_UNITS if u)})"
        )
    if size < minimum:
        raise ConfigError(f"{key}: must be at least {minimum} bytes")
    return size


def _count(value: object, key: str) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value <= COUNT_MAX:  # type: ignore[operator]
        raise ConfigError(f"{key}: must be a non-negative integer (at most {COUNT_MAX})")
    return value  # type: ignore[return-value]


def _watermark(value: object, key: str, limits: Limits) -> None:
    """A fraction of memory (a number from 0 to 1) or an absolute size (a string)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0 <= value <= 1:
            raise ConfigError(
                f'{key}: a fraction of memory from 0 to 1 (e.g. 0.4), or a size such as "512MiB"'
            )
        limits.vm_memory_high_watermark = float(value)
        limits.vm_memory_high_watermark_bytes = None
    else:
        limits.vm_memory_high_watermark_bytes = parse_size(value, key)


def parse_limits(raw: object, key: str, *, minimum: int = 0) -> Limits:
    """Limits from a table/object; missing ones keep their defaults.

    ``minimum`` applies to the negotiation limits (the console's document wants
    them positive); the count limits take null (the document's "no limit")."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: must be a table of limits")
    limits = Limits()
    for name, value in raw.items():
        where = f"{key}.{name}"
        if name not in LIMIT_KEYS:
            raise ConfigError(
                f"{where}: unknown limit '{name}' (known: {', '.join(sorted(LIMIT_KEYS))})"
            )
        if name in COUNT_LIMITS:
            setattr(limits, name, _count(value, where))
        elif name == "vm_memory_high_watermark":
            _watermark(value, where, limits)
        elif name == "disk_free_limit":
            limits.disk_free_limit = parse_size(value, where)
        elif name == "max_unauthenticated_bytes":
            low, high = UNAUTHENTICATED_RANGE
            if not _is_int(value) or not low <= value <= high:
                raise ConfigError(f"{where}: must be an integer from {low} to {high}")
            limits.max_unauthenticated_bytes = value
        else:
            maximum = LIMIT_MAXIMA[name]
            if not _is_int(value) or not minimum <= value <= maximum:
                kind = "non-negative" if minimum == 0 else "positive"
                raise ConfigError(
                    f"{where}: limit '{name}' must be a {kind} integer (at most {maximum})"
                )
            setattr(limits, name, value)
    if limits.frame_max and limits.frame_max < FRAME_MIN:
        raise ConfigError(f"{key}.frame_max: frame_max must be at least {FRAME_MIN}")
    return limits


def limits_document(limits: Limits) -> dict[str, Any]:
    """The limits as the console's document holds them (normalised: every key, a
    size watermark as a string of bytes, so that parsing it again gives the same)."""
    doc: dict[str, Any] = {name: getattr(limits, name) for name in LIMIT_KEYS}
    if limits.vm_memory_high_watermark_bytes is not None:
        doc["vm_memory_high_watermark"] = str(limits.vm_memory_high_watermark_bytes)
    return doc


def parse_vhost_limits(raw: object, key: str) -> VhostLimits:
    """One vhost's limits (``max_connections``, ``max_queues``, ``max_exchanges``,
    ``channel_max``); a missing one is no limit."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: must be a table of limits")
    limits = VhostLimits()
    for name, value in raw.items():
        if name not in VHOST_LIMIT_KEYS:
            raise ConfigError(
                f"{key}.{name}: unknown vhost limit '{name}' (known: {', '.join(VHOST_LIMIT_KEYS)})"
            )
        setattr(limits, name, _count(value, f"{key}.{name}"))
    return limits


def parse_user(entry: object, key: str, *, strict: bool) -> User:
    """One user; ``strict`` refuses keys other than name, password_hash and tags."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{key}: must be a table/object")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key}.name: every user needs a non-empty 'name'")
    if strict:
        _check_keys(entry, USER_KEYS, key)
    if not is_password_hash(entry.get("password_hash")):
        raise ConfigError(
            f"{key}.password_hash: user '{name}' needs a 'password_hash' made by "
            "'brokerd hash-password' (plaintext passwords are refused)"
        )
    tags = entry.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(f"{key}.tags: user '{name}' tags must be a list of strings")
    loopback_only = entry.get("loopback_only", name == "guest")
    if not isinstance(loopback_only, bool):
        raise ConfigError(f"{key}.loopback_only: must be true or false")
    return User(name, entry["password_hash"], tuple(tags), loopback_only=loopback_only)


def parse_permission(
    entry: object, key: str, users: set[str], vhosts: list[str], *, strict: bool
) -> tuple[str, str, Permission]:
    """One permission of a defined user on a defined vhost; patterns must compile."""
    if not isinstance(entry, dict):
        raise ConfigError(f"{key}: must be a table/object")
    if strict:
        _check_keys(entry, PERMISSION_KEYS, key)
    user, vhost = entry.get("user"), entry.get("vhost", "/")
    if not isinstance(user, str) or user not in users:
        raise ConfigError(f"{key}.user: permission for unknown user {user!r}")
    if not isinstance(vhost, str) or vhost not in vhosts:
        raise ConfigError(f"{key}.vhost: permission on unknown vhost {vhost!r}")
    patterns = []
    for kind in PERMISSION_KINDS:
        pattern = entry.get(kind, ".*")
        if not isinstance(pattern, str):
            raise ConfigError(f"{key}.{kind}: bad {kind} pattern for '{user}': not a string")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{key}.{kind}: bad {kind} pattern for '{user}': {exc}") from None
        patterns.append(pattern)
    return user, vhost, Permission(*patterns)


def parse_vhost_name(value: object, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: a vhost name must be a non-empty string")
    return value


def parse_store(raw: object, key: str) -> StoreSettings:
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: must be a table")
    _check_keys(raw, frozenset({"queue_memory_limit", "segment_size", "compact_interval"}), key)
    settings = StoreSettings()
    if "queue_memory_limit" in raw:
        settings.queue_memory_limit = parse_size(
            raw["queue_memory_limit"], f"{key}.queue_memory_limit", minimum=0
        )
    if "segment_size" in raw:
        settings.segment_size = parse_size(
            raw["segment_size"], f"{key}.segment_size", minimum=64 * 1024
        )
    if "compact_interval" in raw:
        value = raw["compact_interval"]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not 0.1 <= value <= 3600:
            raise ConfigError(f"{key}.compact_interval: seconds from 0.1 to 3600, not {value!r}")
        settings.compact_interval = float(value)
    return settings


def parse_config(
    raw: dict[str, Any], where: str = "config", base: Path | None = None
) -> BrokerConfig:
    """``base``: the folder relative paths (``[tls]`` files) are read from."""
    unknown = set(raw) - {"limits", "vhosts", "users", "permissions", "store", "tls"}
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {', '.join(sorted(unknown))}")
    for section in ("vhosts", "users", "permissions"):
        entries = raw.get(section, [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ConfigError(f"{where}: '{section}' must be an array of tables ([[{section}]])")
    config = BrokerConfig(vhosts=[], users=[], permissions=[])
    config.limits = parse_limits(raw.get("limits", {}), f"{where}: limits")
    config.store = parse_store(raw.get("store", {}), f"{where}: store")
    if "tls" in raw:
        try:
            config.tls = parse_tls(raw["tls"], f"{where}: tls", base)
        except TLSConfigError as exc:
            raise ConfigError(str(exc)) from None
    for i, entry in enumerate(raw.get("vhosts", [{"name": "/"}])):
        name = parse_vhost_name(entry.get("name"), f"{where}: vhosts[{i}].name")
        config.vhosts.append(name)
        if "limits" in entry:
            config.vhost_limits[name] = parse_vhost_limits(
                entry["limits"], f"{where}: vhosts[{i}].limits"
            )
    for i, entry in enumerate(raw.get("users", [])):
        config.users.append(parse_user(entry, f"{where}: users[{i}]", strict=False))
    users = {u.name for u in config.users}
    for i, entry in enumerate(raw.get("permissions", [])):
        config.permissions.append(
            parse_permission(
                entry, f"{where}: permissions[{i}]", users, config.vhosts, strict=False
            )
        )
    limits_raw = raw.get("limits", {})
    set_here = {f"limits.{key}" for key in limits_raw} if isinstance(limits_raw, dict) else set()
    set_here |= {part for part in ("vhosts", "users", "permissions") if raw.get(part)}
    if config.vhost_limits:
        set_here.add("vhost_limits")
    config.explicit = frozenset(set_here)
    if not config.users:
        defaults = default_config()
        config.users = defaults.users
        config.permissions += [p for p in defaults.permissions if p[1] in config.vhosts]
    return config
