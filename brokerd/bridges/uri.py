"""AMQP URIs as RabbitMQ's shovels and federation upstreams read them.

The syntax is RabbitMQ's URI specification: ``amqp[s]://user:pass@host:port/vhost
?query``, every part percent-decoded. ``amqp://`` with no host means this broker
(RabbitMQ: a direct connection to the local node). A path of one segment names
the vhost: ``amqp://h`` is the default vhost ``/``, ``amqp://h/`` the vhost
``""``, and ``amqp://h/%2f`` the vhost ``/``. The query keys are those of
RabbitMQ's Erlang client that mean something here (TLS files and checks, the
heartbeat, timeouts, the login mechanism); any other key is refused with its
name, so a typo is never silently ignored.

Passwords never leave this module in clear: ``AmqpUri.redacted`` is what logs,
state dumps, statuses and API answers show (``amqp://user:***@host``), and
RabbitMQ's ``x-shovelled`` headers carry it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlsplit

AMQP_PORT = 5672
AMQPS_PORT = 5671
DEFAULT_VHOST = "/"
REDACTED = "***"

#: query keys and what they must be (RabbitMQ's amqp_uri keys that apply here)
QUERY_NUMBERS = ("heartbeat", "connection_timeout", "channel_max", "frame_max")
QUERY_FILES = ("cacertfile", "certfile", "keyfile")
QUERY_KEYS = (
    *QUERY_NUMBERS,
    *QUERY_FILES,
    "verify",
    "server_name_indication",
    "auth_mechanism",
    "fail_if_no_peer_cert",
    "depth",
)
AUTH_MECHANISMS = ("plain", "amqplain", "external")


class UriError(ValueError):
    """The URI cannot be used; the message says which part is wrong."""


@dataclass(frozen=True)
class AmqpUri:
    """One parsed URI (``local``: ``amqp://`` with no host, this broker)."""

    scheme: str
    host: str = ""
    port: int = AMQP_PORT
    vhost: str = DEFAULT_VHOST
    username: str = "guest"
    password: str = field(default="guest", repr=False)
    #: whether the URI named a user (else the defaults, or the local broker's own)
    has_user: bool = False
    query: tuple[tuple[str, str], ...] = ()

    @property
    def local(self) -> bool:
        return not self.host

    @property
    def tls(self) -> bool:
        return self.scheme == "amqps"

    def option(self, key: str, default: str | None = None) -> str | None:
        for name, value in self.query:
            if name == key:
                return value
        return default

    @property
    def heartbeat(self) -> int | None:
        value = self.option("heartbeat")
        return None if value is None else int(value)

    @property
    def connection_timeout(self) -> float:
        """Seconds (the query gives milliseconds, as RabbitMQ's does)."""
        value = self.option("connection_timeout")
        return 30.0 if value is None else int(value) / 1000.0

    @property
    def mechanism(self) -> str:
        return (self.option("auth_mechanism") or "plain").lower()

    @property
    def verify(self) -> bool:
        """Whether the server's certificate is checked (``verify=verify_none`` turns
        it off, as in RabbitMQ; checked by default here, unlike Erlang's default,
        because an unverified TLS link is one an attacker in the middle can read)."""
        return self.option("verify", "verify_peer") != "verify_none"

    @property
    def server_name(self) -> str | None:
        """The name checked against the certificate and sent in SNI (None: off)."""
        value = self.option("server_name_indication")
        if value == "disable":
            return None
        return value or self.host

    @property
    def redacted(self) -> str:
        """The URI without its password: what anything but the connection may show."""
        if self.local:
            vhost = "" if self.vhost == DEFAULT_VHOST else "/" + _quote(self.vhost)
            return f"{self.scheme}://{vhost}"
        userinfo = f"{_quote(self.username)}:{REDACTED}@" if self.has_user else ""
        default = AMQPS_PORT if self.tls else AMQP_PORT
        port = "" if self.port == default else f":{self.port}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        path = "" if self.vhost == DEFAULT_VHOST else "/" + _quote(self.vhost)
        query = "&".join(f"{k}={_quote(v)}" for k, v in self.query)
        return f"{self.scheme}://{userinfo}{host}{port}{path}" + (f"?{query}" if query else "")


def _quote(text: str) -> str:
    return quote(text, safe="")


def parse_uri(raw: object, where: str = "uri") -> AmqpUri:
    """Parse one URI; ``UriError`` names ``where`` and the part that is wrong."""
    if not isinstance(raw, str) or not raw:
        raise UriError(f"{where}: must be a non-empty amqp:// or amqps:// URI")
    if any(ch.isspace() for ch in raw):
        raise UriError(f"{where}: must not contain spaces")
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise UriError(f"{where}: {str(exc).replace('Port', 'port')}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("amqp", "amqps"):
        raise UriError(f"{where}: the scheme must be amqp or amqps, not {parts.scheme!r}")
    if parts.fragment:
        raise UriError(f"{where}: a fragment (#...) has no meaning here")
    host = unquote(parts.hostname or "")
    path = parts.path
    if path.startswith("/"):
        path = path[1:]
        if "/" in path:
            raise UriError(f"{where}: the vhost must be one path segment (encode '/' as %2f)")
        vhost = unquote(path)
    elif path:
        raise UriError(f"{where}: malformed path {path!r}")
    else:
        vhost = DEFAULT_VHOST
    if not host and (parts.username is not None or port is not None):
        raise UriError(f"{where}: a user or port needs a host")
    if port is not None and not 0 < port < 65536:
        raise UriError(f"{where}: port must be 1-65535")
    query = tuple(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    for key, value in query:
        _check_query(where, key, value, scheme)
    username = unquote(parts.username) if parts.username is not None else "guest"
    password = unquote(parts.password) if parts.password is not None else "guest"
    return AmqpUri(
        scheme=scheme,
        host=host,
        port=port if port is not None else (AMQPS_PORT if scheme == "amqps" else AMQP_PORT),
        vhost=vhost,
        username=username,
        password=password if parts.username is not None else "guest",
        has_user=parts.username is not None,
        query=query,
    )


def _check_query(where: str, key: str, value: str, scheme: str) -> None:
    if key not in QUERY_KEYS:
        raise UriError(f"{where}: unknown query parameter {key!r} (known: {', '.join(QUERY_KEYS)})")
    if key in QUERY_NUMBERS or key == "depth":
        if not value.isdigit() or len(value) > 9:
            raise UriError(f"{where}: {key} must be a non-negative integer")
    elif key in QUERY_FILES or key in ("verify", "server_name_indication", "fail_if_no_peer_cert"):
        if scheme != "amqps":
            raise UriError(f"{where}: {key} is a TLS option: it needs amqps://")
        if key == "verify" and value not in ("verify_peer", "verify_none"):
            raise UriError(f"{where}: verify must be verify_peer or verify_none")
        if key == "fail_if_no_peer_cert" and value not in ("true", "false"):
            raise UriError(f"{where}: fail_if_no_peer_cert must be true or false")
        if key in QUERY_FILES and not value:
            raise UriError(f"{where}: {key} must name a file")
    elif key == "auth_mechanism" and value.lower() not in AUTH_MECHANISMS:
        raise UriError(f"{where}: auth_mechanism must be one of {', '.join(AUTH_MECHANISMS)}")


def parse_uris(raw: object, where: str) -> tuple[AmqpUri, ...]:
    """A URI or a non-empty list of them (RabbitMQ picks one at random per
    connection; so do we), each checked."""
    if isinstance(raw, list):
        if not raw:
            raise UriError(f"{where}: must be a URI or a non-empty list of URIs")
        if len(raw) > 64:
            raise UriError(f"{where}: at most 64 URIs")
        return tuple(parse_uri(item, f"{where}[{i}]") for i, item in enumerate(raw))
    return (parse_uri(raw, where),)


def redact(raw: str) -> str:
    """``raw`` with any password replaced, even if it does not parse (for error
    messages that must quote what the user sent)."""
    try:
        return parse_uri(raw).redacted
    except UriError:
        head, sep, tail = raw.partition("://")
        if not sep or "@" not in tail:
            return raw
        userinfo, _at, rest = tail.rpartition("@")
        user = userinfo.split(":", 1)[0]
        return f"{head}://{user}:{REDACTED}@{rest}"
