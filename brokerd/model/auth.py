"""Users, password hashes and per-vhost permissions (RabbitMQ's model).

Passwords are stored as PBKDF2-SHA256 hashes; a verified login is
remembered in memory (keyed by a keyed hash) so that reconnect storms do
not pay the key stretching again. ``authenticate`` is slow by design and
runs in an executor (``brokerd.server.login``); every refusal costs one
hash, so a name that does not exist answers as slowly as a wrong password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import secrets
from collections import Counter
from dataclasses import dataclass, field

from brokerd.model.errors import access_refused

HASH_ALGORITHM = "pbkdf2_sha256"
HASH_ITERATIONS = 120_000
#: a stored hash asking for more is refused (each login would cost seconds)
MAX_ITERATIONS = 10_000_000


def hash_password(
    password: str, *, iterations: int = HASH_ITERATIONS, salt: str | None = None
) -> str:
    """Encode ``password`` as ``pbkdf2_sha256$iterations$salt$hash`` (Django's format)."""
    salt = salt or secrets.token_hex(12)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), iterations)
    return f"{HASH_ALGORITHM}${iterations}${salt}${base64.b64encode(digest).decode()}"


def check_password(password: str, encoded: str) -> bool:
    try:
        algorithm, iterations, salt, _digest = encoded.split("$", 3)
        if algorithm != HASH_ALGORITHM or not is_password_hash(encoded):
            return False
        expected = hash_password(password, iterations=int(iterations), salt=salt)
    except ValueError:
        return False
    return hmac.compare_digest(expected.encode(), encoded.encode())


def is_password_hash(encoded: object) -> bool:
    """Is ``encoded`` shaped like :func:`hash_password`'s output (never a plaintext)?"""
    if not isinstance(encoded, str):
        return False
    parts = encoded.split("$")
    if len(parts) != 4 or parts[0] != HASH_ALGORITHM or not parts[2] or not parts[3]:
        return False
    # ASCII digits only ('¹' passes isdigit() but not int()), and a bounded cost:
    # every login with this hash pays its iterations
    if not re.fullmatch(r"[0-9]{1,8}", parts[1]) or not 1 <= int(parts[1]) <= MAX_ITERATIONS:
        return False
    try:
        base64.b64decode(parts[3], validate=True)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


#: the tag that lets a user publish with a ``user-id`` not its own (RabbitMQ's)
IMPERSONATOR = "impersonator"


@dataclass
class User:
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()
    #: like RabbitMQ's loopback_users: such a user may only log in from 127.0.0.0/8 or ::1
    loopback_only: bool = False


@dataclass
class Permission:
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"
    _compiled: dict[str, re.Pattern[str]] = field(default_factory=dict, repr=False)

    def allows(self, kind: str, resource: str) -> bool:
        pattern = self._compiled.get(kind)
        if pattern is None:
            pattern = self._compiled[kind] = re.compile(getattr(self, kind))
        # RabbitMQ: an empty pattern grants nothing; otherwise the regex is searched
        # (re:run semantics), so '^app\\.' grants every name starting with 'app.'
        return bool(getattr(self, kind)) and pattern.search(resource) is not None


class UserDatabase:
    """Users and permissions; swapped whole on a config reload."""

    def __init__(self) -> None:
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], Permission] = {}
        self._verified: dict[str, bytes] = {}
        self._pepper = secrets.token_bytes(16)
        #: iteration counts of the stored hashes: a refusal for a name with no hash
        #: pays the most common one, so it takes as long as a wrong password
        self._iterations: Counter[int] = Counter()

    def add_user(self, user: User) -> None:
        old = self.users.get(user.name)
        if old is not None:
            self._iterations[_iterations(old.password_hash)] -= 1
        self.users[user.name] = user
        self._iterations[_iterations(user.password_hash)] += 1
        self._verified.pop(user.name, None)

    def _dummy_check(self, password: str) -> None:
        """Spend what checking a real hash would, and throw the result away."""
        common = [n for n, c in self._iterations.most_common() if c > 0 and n > 0]
        iterations = common[0] if common else HASH_ITERATIONS
        hash_password(password, iterations=iterations, salt="rookery-no-such-user")

    def cached(self, username: str, password: str, peer_host: str) -> User | None:
        """The user if this exact login was verified before (cheap: one HMAC)."""
        user = self.users.get(username)
        if user is None or (user.loopback_only and not is_loopback(peer_host)):
            return None
        return user if self._verified.get(username) == self._token(user, password) else None

    def _token(self, user: User, password: str) -> bytes:
        return hmac.new(
            self._pepper, f"{user.password_hash}\0{password}".encode(), "sha256"
        ).digest()

    def set_permission(self, user: str, vhost: str, permission: Permission) -> None:
        self.permissions[(user, vhost)] = permission

    def authenticate(self, username: str, password: str, peer_host: str) -> tuple[User | None, str]:
        """Returns the user, or None and the reason (logged, never sent to the client)."""
        user = self.users.get(username)
        if user is None:
            self._dummy_check(password)
            return None, f"user '{username}' does not exist"
        if user.loopback_only and not is_loopback(peer_host):
            self._dummy_check(password)
            return None, f"user '{username}' can only connect via localhost"
        token = self._token(user, password)
        if self._verified.get(username) == token:
            return user, ""
        if not check_password(password, user.password_hash):
            return None, f"invalid credentials for user '{username}'"
        self._verified[username] = token
        return user, ""

    def identify(self, username: str, peer_host: str) -> tuple[User | None, str]:
        """SASL EXTERNAL: the user a verified client certificate names, with no
        password (the TLS handshake proved the identity, as RabbitMQ's
        ``rabbitmq_auth_mechanism_ssl`` takes it)."""
        user = self.users.get(username)
        if user is None:
            return None, f"user '{username}' (from the client certificate) does not exist"
        if user.loopback_only and not is_loopback(peer_host):
            return None, f"user '{username}' can only connect via localhost"
        return user, ""

    def can_access_vhost(self, username: str, vhost: str) -> bool:
        return (username, vhost) in self.permissions

    def check(self, user: User, vhost: str, kind: str, resource_type: str, name: str) -> None:
        """Raise 403 unless ``user`` has ``kind`` (configure/write/read) on the resource."""
        permission = self.permissions.get((user.name, vhost))
        if permission is None or not permission.allows(kind, name):
            raise access_refused(
                f"access to {resource_type} '{name}' in vhost '{vhost}' "
                f"refused for user '{user.name}'"
            )


def _iterations(encoded: str) -> int:
    """The iteration count of a stored hash (0 when it is not one)."""
    return int(encoded.split("$")[1]) if is_password_hash(encoded) else 0
