"""The shared cluster file (TOML) and the known-hosts checksum.

    name = "rookery"
    vhost = "/"                     # the clustered vhost; links and clients use it
    secret = "..."                  # cluster user's password on every link
    user = "cluster"                # optional, default "cluster"
    known_hosts = ["h1:5672", "h2:5672", "h3:5672"]   # the primary servers
    default_queue_type = "quorum"   # optional: what a shared queue declared without
                                    # x-queue-type is (classic | quorum | replicated)
    queue_leader_locator = "balanced"   # optional: where a shared queue whose declare
                                    # names no locator is placed (client-local | balanced)
    recovery_wait = 30.0            # optional: after a whole-cluster restart, how long a
                                    # replicated queue waits for its last owner (seconds)

    [tls]                           # optional: cluster links over mutual TLS
    links = "required"              # required | off (default off), the same everywhere
    cafile = "ca.pem"               # the cluster CA: every server's certificate is its
    certfile = "server.pem"         # the default certificate and key of every server
    keyfile = "server.key"
    [tls.servers."h1:5671"]         # or one per server, by its known-host address
    certfile = "h1.pem"
    keyfile = "h1.key"

    [heartbeat]
    interval = 1.0                  # seconds between Cluster.Status messages
    timeout = 3.0                   # a peer is inactive after this long without one
    open_timeout = 10.0             # Connection.Open waits this long for a root, then 541

A server's type (primary/secondary) is on its command line, never here.
The secret may also come from the environment (``secret_env = "VAR"``).

``default_queue_type`` is the clustered vhost's default queue type, as
RabbitMQ 3.11+ keeps one per vhost. Without it, a durable shared queue
declared without ``x-queue-type`` is replicated and a transient one classic
(``cluster.queues.placement.kind_of``). Every server must resolve a queue's
type alike, so the checksum covers it when it is set.

With ``[tls] links = "required"`` every link runs over TLS: the known hosts
are the servers' AMQPS addresses (``--tls-port``), each server serves its
certificate there, and each end checks the other's against the cluster CA
(a link presents its server's certificate as a client certificate). A
cluster is all TLS or all plain, so the checksum covers the choice. Paths
are relative to the cluster file's folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PORT = re.compile(r"[0-9]{1,5}")
#: what ``default_queue_type`` may say (``replicated``: a shared queue on its owner,
#: copied to every primary, durable or not)
QUEUE_TYPES = ("classic", "quorum", "replicated")
#: what ``queue_leader_locator`` may say: RabbitMQ's values (the declaring primary, or
#: the primary owning the fewest shared queues)
LEADER_LOCATORS = ("client-local", "balanced")
#: after a whole-cluster restart, how long a recovered replicated queue waits for the
#: server that owned it before it goes to the most complete copy at hand (seconds):
#: ``recovery_wait``'s default
RECOVERY_WAIT = 30.0


class ClusterConfigError(Exception):
    """The cluster file cannot be used; the message names the problem."""


@dataclass(frozen=True)
class ClusterTLS:
    """``[tls]``: links over mutual TLS against the cluster CA."""

    cafile: Path
    #: certificate and key of a server the ``servers`` table does not name
    default: tuple[Path, Path] | None = None
    #: per known-host address ("host:port"): certificate and key
    servers: tuple[tuple[str, tuple[Path, Path]], ...] = ()

    def certificate_for(self, address: str) -> tuple[Path, Path]:
        for name, pair in self.servers:
            if name == address:
                return pair
        if self.default is None:
            raise ClusterConfigError(
                f"cluster file [tls]: no certificate for this server ({address}): "
                f'add [tls.servers."{address}"] or a default certfile and keyfile'
            )
        return self.default


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class SocketPath:
    """A host-local link address, ``unix:/absolute/path``: the workers of one host
    (``brokerd --workers``) link over Unix sockets, never through the network."""

    path: str

    def __str__(self) -> str:
        return f"{UNIX_SCHEME}{self.path}"


#: a known host: a server's AMQP address, or a sibling worker's link socket
Address = HostPort | SocketPath
UNIX_SCHEME = "unix:"
#: the longest path a Unix socket address holds on Linux (sun_path less its NUL)
MAX_SOCKET_PATH = 107


@dataclass(frozen=True)
class DNSDiscovery:
    """Peer discovery by DNS (``[discovery]``): the addresses ``name`` resolves to, at
    ``port``, are linked to; a server not yet a member asks the root to admit it.
    Discovery proposes, the root admits (seed 000: no configurable catastrophes)."""

    name: str
    port: int = 5672
    interval: float = 10.0


@dataclass(frozen=True)
class ClusterConfig:
    name: str
    vhost: str
    secret: str
    user: str
    known_hosts: tuple[Address, ...]
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 3.0
    open_timeout: float = 10.0
    #: the type of a shared queue declared without x-queue-type (None: by durability)
    default_queue_type: str | None = None
    #: after a whole-cluster restart, how long a recovered replicated queue waits for
    #: the server that owned it before it goes to the most complete copy at hand
    #: (seconds; only the root reads it, so the checksum leaves it out)
    recovery_wait: float = RECOVERY_WAIT
    #: where the root places a shared queue whose declare names no locator (only the
    #: root reads it; the checksum leaves it out, as placement is no one else's)
    queue_leader_locator: str = "client-local"
    #: links over mutual TLS (None: plain links)
    tls: ClusterTLS | None = None
    #: workers on each host (``brokerd --workers``; not in the file): in the checksum,
    #: so every host of a cluster runs as many and each weighs the same (hostgroup.py)
    host_workers: int = 1
    #: peer discovery by DNS (None: the known hosts and ``--join`` only); not in the
    #: checksum, as it only finds the cluster
    discovery: DNSDiscovery | None = None
    #: the root grows quorum groups below this size onto members that hold the
    #: cluster's state and a whole copy (0: off; only the root reads it)
    quorum_target_group_size: int = 0

    @property
    def checksum(self) -> str:
        return self.checksum_of(self.known_hosts)

    def checksum_of(self, hosts: tuple[Address, ...] | list[Address] | list[str]) -> str:
        """The checksum servers compare for a set of known hosts (the file's, or the
        members the root ordered since: ``knownhosts``) with these settings."""
        return known_hosts_checksum(
            hosts,  # type: ignore[arg-type]
            self.default_queue_type,
            tls_links=self.tls is not None,
            workers=self.host_workers,
        )

    @property
    def settings_checksum(self) -> str:
        """What every server must agree on whatever the members: two servers whose
        members' versions differ compare this (the one behind catches up)."""
        return self.checksum_of([])


def parse_host(value: Any, where: str) -> Address:
    if not isinstance(value, str) or not value.strip():
        raise ClusterConfigError(f"{where}: known_hosts entries must be 'host:port' strings")
    text = value.strip()
    if text.startswith(UNIX_SCHEME):
        return parse_socket_path(text, where)
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, "5672"
    host = host.strip("[]").lower()
    if not host:
        raise ClusterConfigError(f"{where}: known host {value!r} has no host name")
    if not _PORT.fullmatch(port):  # ASCII digits only: int() also takes '١٢' and '1_0'
        raise ClusterConfigError(f"{where}: known host {value!r} has a bad port")
    number = int(port)
    if not 0 < number < 65536:
        raise ClusterConfigError(f"{where}: known host {value!r} port is out of range")
    return HostPort(host, number)


def parse_socket_path(text: str, where: str) -> SocketPath:
    """``unix:/absolute/path``, short enough for a socket address."""
    path = text[len(UNIX_SCHEME) :]
    if not path.startswith("/"):
        raise ClusterConfigError(f"{where}: link socket {text!r} must be an absolute path")
    if len(path.encode()) > MAX_SOCKET_PATH:
        raise ClusterConfigError(
            f"{where}: link socket {text!r} is longer than {MAX_SOCKET_PATH} bytes"
        )
    return SocketPath(path)


def known_hosts_checksum(
    hosts: tuple[Address, ...] | list[Address],
    default_queue_type: str | None = None,
    *,
    tls_links: bool = False,
    workers: int = 1,
) -> str:
    """SHA-256 (first 16 hex digits) of the sorted, lower-cased, de-duplicated list,
    of the default queue type when one is set, of TLS on links when on, and of the
    workers per host above one (servers must agree on these too)."""
    normalised = "\n".join(sorted({str(h) for h in hosts}))
    if default_queue_type is not None:
        normalised += f"\ndefault_queue_type={default_queue_type}"
    if tls_links:
        normalised += "\ntls_links=required"
    if workers > 1:
        normalised += f"\nworkers_per_host={workers}"
    return hashlib.sha256(normalised.encode()).hexdigest()[:16]


def load_cluster_config(path: Path) -> ClusterConfig:
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ClusterConfigError(f"cannot read cluster file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ClusterConfigError(f"cluster file {path} is not valid TOML: {exc}") from None
    return parse_cluster_config(raw, str(path), path.parent)


def parse_cluster_config(
    raw: dict[str, Any], where: str = "cluster file", base: Path | None = None
) -> ClusterConfig:
    allowed = {
        "tls",
        "name",
        "vhost",
        "secret",
        "secret_env",
        "user",
        "known_hosts",
        "heartbeat",
        "default_queue_type",
        "recovery_wait",
        "queue_leader_locator",
        "discovery",
        "quorum_target_group_size",
    }
    unknown = set(raw) - allowed
    if unknown:
        raise ClusterConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if "type" in raw:  # pragma: no cover - caught above, kept for the message
        raise ClusterConfigError(f"{where}: the server type belongs on the command line")
    name = raw.get("name", "rookery")
    vhost = raw.get("vhost", "/")
    user = raw.get("user", "cluster")
    for key, value in (("name", name), ("vhost", vhost), ("user", user)):
        if not isinstance(value, str) or not value:
            raise ClusterConfigError(f"{where}: '{key}' must be a non-empty string")
    secret = raw.get("secret")
    if "secret_env" in raw:
        var = raw["secret_env"]
        secret = os.environ.get(var) if isinstance(var, str) else None
        if not secret:
            raise ClusterConfigError(
                f"{where}: environment variable {var!r} (secret_env) is not set"
            )
    if not isinstance(secret, str) or len(secret) < 8:
        raise ClusterConfigError(f"{where}: 'secret' must be a string of at least 8 characters")
    hosts_raw = raw.get("known_hosts")
    if isinstance(hosts_raw, str):
        hosts_raw = [h for h in hosts_raw.split(",") if h.strip()]
    if not isinstance(hosts_raw, list) or not hosts_raw:
        raise ClusterConfigError(
            f"{where}: 'known_hosts' must list at least one primary 'host:port'"
        )
    hosts = tuple(dict.fromkeys(parse_host(h, where) for h in hosts_raw))
    heartbeat = raw.get("heartbeat", {})
    if not isinstance(heartbeat, dict):
        raise ClusterConfigError(f"{where}: [heartbeat] must be a table")
    unknown = set(heartbeat) - {"interval", "timeout", "open_timeout"}
    if unknown:
        raise ClusterConfigError(
            f"{where}: unknown [heartbeat] key(s) {', '.join(sorted(unknown))}"
        )
    values = {}
    for key, default in (("interval", 1.0), ("timeout", 3.0), ("open_timeout", 10.0)):
        value = heartbeat.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ClusterConfigError(f"{where}: heartbeat {key} must be a positive number")
        values[key] = float(value)
    if values["timeout"] <= values["interval"]:
        raise ClusterConfigError(
            f"{where}: heartbeat timeout ({values['timeout']}) must exceed the interval "
            f"({values['interval']})"
        )
    default_type = raw.get("default_queue_type")
    if default_type is not None and default_type not in QUEUE_TYPES:
        raise ClusterConfigError(
            f"{where}: default_queue_type must be one of {', '.join(QUEUE_TYPES)}"
        )
    recovery_wait = raw.get("recovery_wait", RECOVERY_WAIT)
    if (
        isinstance(recovery_wait, bool)
        or not isinstance(recovery_wait, int | float)
        or recovery_wait <= 0
    ):
        raise ClusterConfigError(f"{where}: recovery_wait must be a positive number of seconds")
    locator = raw.get("queue_leader_locator", "client-local")
    if locator not in LEADER_LOCATORS:
        raise ClusterConfigError(
            f"{where}: queue_leader_locator must be one of {', '.join(LEADER_LOCATORS)}"
        )
    tls = parse_cluster_tls(raw.get("tls"), where, base)
    if tls is not None and any(isinstance(h, SocketPath) for h in hosts):
        raise ClusterConfigError(
            f"{where}: links over TLS need 'host:port' known hosts, not Unix sockets"
        )
    discovery = parse_discovery(raw.get("discovery"), where)
    target = raw.get("quorum_target_group_size", 0)
    if isinstance(target, bool) or not isinstance(target, int) or target < 0:
        raise ClusterConfigError(
            f"{where}: quorum_target_group_size must be a whole number (0: off)"
        )
    return ClusterConfig(
        name=name,
        vhost=vhost,
        secret=secret,
        user=user,
        known_hosts=hosts,
        heartbeat_interval=values["interval"],
        heartbeat_timeout=values["timeout"],
        open_timeout=values["open_timeout"],
        default_queue_type=default_type,
        recovery_wait=float(recovery_wait),
        queue_leader_locator=locator,
        tls=tls,
        discovery=discovery,
        quorum_target_group_size=target,
    )


def parse_discovery(raw: object, where: str) -> DNSDiscovery | None:
    """``[discovery]``: ``dns`` (a name whose addresses are the cluster's servers: a
    Kubernetes headless service, a round-robin record), ``port`` (5672), and
    ``interval`` (seconds between lookups, 10)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ClusterConfigError(f"{where}: [discovery] must be a table")
    unknown = set(raw) - {"dns", "port", "interval"}
    if unknown:
        raise ClusterConfigError(
            f"{where}: unknown [discovery] key(s) {', '.join(sorted(unknown))}"
        )
    name = raw.get("dns")
    if not isinstance(name, str) or not name.strip() or any(c.isspace() for c in name.strip()):
        raise ClusterConfigError(f"{where}: [discovery] dns must be a host name")
    port = raw.get("port", 5672)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ClusterConfigError(f"{where}: [discovery] port must be a port number")
    interval = raw.get("interval", 10.0)
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
        raise ClusterConfigError(f"{where}: [discovery] interval must be a positive number")
    return DNSDiscovery(name.strip().lower(), port, float(interval))


def parse_cluster_tls(raw: object, where: str, base: Path | None) -> ClusterTLS | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ClusterConfigError(f"{where}: [tls] must be a table")
    unknown = set(raw) - {"links", "cafile", "certfile", "keyfile", "servers"}
    if unknown:
        raise ClusterConfigError(f"{where}: unknown [tls] key(s) {', '.join(sorted(unknown))}")
    links = raw.get("links", "off")
    if links not in ("required", "off"):
        raise ClusterConfigError(f"{where}: [tls] links must be 'required' or 'off'")
    if links == "off":
        return None

    def path(table: dict[str, Any], key: str, at: str) -> Path | None:
        value = table.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ClusterConfigError(f"{where}: {at}{key} must be a file path")
        result = Path(value)
        return result if result.is_absolute() or base is None else base / result

    def pair(table: dict[str, Any], at: str) -> tuple[Path, Path] | None:
        certfile, keyfile = path(table, "certfile", at), path(table, "keyfile", at)
        if certfile is None and keyfile is None:
            return None
        if certfile is None:
            raise ClusterConfigError(f"{where}: {at}keyfile needs a certfile")
        return certfile, keyfile or certfile

    cafile = path(raw, "cafile", "[tls] ")
    if cafile is None:
        raise ClusterConfigError(f"{where}: [tls] links = 'required' needs the cluster cafile")
    servers_raw = raw.get("servers", {})
    if not isinstance(servers_raw, dict):
        raise ClusterConfigError(f"{where}: [tls.servers] must be a table of servers")
    servers = []
    for name, table in servers_raw.items():
        at = f"[tls.servers.{name!r}] "
        if not isinstance(table, dict):
            raise ClusterConfigError(f"{where}: {at}must be a table")
        extra = set(table) - {"certfile", "keyfile"}
        if extra:
            raise ClusterConfigError(f"{where}: {at}unknown key(s) {', '.join(sorted(extra))}")
        entry = pair(table, at)
        if entry is None:
            raise ClusterConfigError(f"{where}: {at}needs a certfile")
        servers.append((str(parse_host(name, where)), entry))
    return ClusterTLS(cafile, pair(raw, "[tls] "), tuple(servers))
