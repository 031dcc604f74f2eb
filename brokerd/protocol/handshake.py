"""Pure pieces of the connection handshake: server properties, SASL, login events.

Checking a password costs tens of milliseconds of key stretching, so the
connection machine does not do it: it emits a :class:`LoginCheck` that its
shell runs off the event loop and answers with ``Connection.complete_login``.
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass
from typing import Any

from pamqp import decode

import brokerd
from brokerd.model.errors import ACCESS_REFUSED, ConnectionError_

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": False,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": False,
}

MECHANISMS = "PLAIN AMQPLAIN"
#: SASL EXTERNAL: the user named by a verified TLS client certificate (offered only then)
EXTERNAL = "EXTERNAL"


def mechanisms(certificate_login: str | None) -> str:
    """What connection.start offers: EXTERNAL too when the client's verified
    certificate names a user (RabbitMQ offers it only then as well)."""
    return MECHANISMS if certificate_login is None else f"{MECHANISMS} {EXTERNAL}"


def start_properties(extra: dict[str, Any]) -> dict[str, Any]:
    """The server properties of connection.start (``extra`` adds spid, cluster name)."""
    props: dict[str, Any] = {
        "product": brokerd.PRODUCT,
        "version": brokerd.__version__,
        "platform": f"Python {platform.python_version()}",
        "copyright": "Rookery contributors",
        "information": "Rookery clustered AMQP broker; see https://www.rabbitmq.com/amqp-0-9-1-reference.html",
        "capabilities": dict(SERVER_CAPABILITIES),
    }
    props.update(extra)
    return props


@dataclass(frozen=True)
class LoginCheck:
    """A password check the shell must run and feed back.

    ``kind`` is ``login`` (connection.start-ok) or ``update-secret``
    (connection.update-secret on an open connection, same user)."""

    kind: str
    username: str
    password: str = ""
    peer_host: str = ""
    mechanism: str = ""


def parse_credentials(
    mechanism: str, response: Any, certificate_login: str | None = None
) -> tuple[str, str]:
    """(username, password) from a start-ok response; 403 when it cannot be read.

    EXTERNAL's response (an authorisation identity, usually empty) is ignored:
    the user is the one ``certificate_login`` names, as in RabbitMQ."""
    if mechanism == EXTERNAL:
        if certificate_login is None:
            raise ConnectionError_(
                ACCESS_REFUSED,
                "EXTERNAL needs a TLS connection with a verified client certificate "
                "that names a user",
            )
        return certificate_login, ""
    # pamqp hands a long string back as str when it is valid UTF-8, else as bytes:
    # encoding the str as UTF-8 gives the client's bytes back (names like 'Božena')
    raw = response.encode() if isinstance(response, str) else bytes(response or b"")
    if mechanism == "PLAIN":
        parts = raw.split(b"\x00")
        if len(parts) != 3:
            raise ConnectionError_(ACCESS_REFUSED, "malformed PLAIN response")
        return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
    if mechanism == "AMQPLAIN":
        try:
            _, table = decode.field_table(struct.pack(">I", len(raw)) + raw)
        except Exception:
            raise ConnectionError_(ACCESS_REFUSED, "malformed AMQPLAIN response") from None
        login, password = table.get("LOGIN", ""), table.get("PASSWORD", "")
        if isinstance(login, bytes):
            login = login.decode(errors="replace")
        if isinstance(password, bytes):
            password = password.decode(errors="replace")
        return str(login), str(password)
    raise ConnectionError_(ACCESS_REFUSED, f"unsupported authentication mechanism '{mechanism}'")
