"""TLS for brokerd: the ``[tls]`` settings, the listener's context, client certificates.

Used by the AMQPS listener (``--tls-port``), by certificate logins (SASL
EXTERNAL) and by cluster links over mutual TLS. It imports nothing from the
rest of brokerd, so the server and the cluster packages can both use it.

    [tls]
    certfile = "/etc/rookery/server.pem"     # this server's certificate (chain)
    keyfile = "/etc/rookery/server.key"
    cafile = "/etc/rookery/ca.pem"           # CAs that issue client certificates
    verify = "peer"                           # none | peer | peer_required
    min_version = "1.2"                       # 1.2 | 1.3
    ciphers = "ECDHE+AESGCM:..."              # TLS 1.2 suites (1.3's are OpenSSL's)
    login_from = "common_name"                # EXTERNAL: common_name |
                                              #   subject_alternative_name |
                                              #   distinguished_name
    san_type = "dns"                          # which SAN: dns | email | uri | ip
    san_index = 0                             # the n-th SAN of that type

``verify`` follows RabbitMQ's ``ssl_options``: ``none`` asks no certificate
(``verify_none``), ``peer`` asks one and checks it when sent (``verify_peer``),
``peer_required`` refuses a client without one (``fail_if_no_peer_cert``).
A certificate is only ever trusted after OpenSSL verified it against
``cafile``; a login name is never read from an unverified one.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

log = logging.getLogger("brokerd.tls")

VERIFY_MODES = {
    "none": ssl.CERT_NONE,
    "peer": ssl.CERT_OPTIONAL,
    "peer_required": ssl.CERT_REQUIRED,
}
VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
#: TLS 1.2 suites with forward secrecy and an AEAD cipher only (TLS 1.3 has only such)
MODERN_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20:!aNULL:!eNULL:!MD5:!DSS"
LOGIN_FROM = ("common_name", "subject_alternative_name", "distinguished_name")
SAN_TYPES = {
    "dns": x509.DNSName,
    "email": x509.RFC822Name,
    "uri": x509.UniformResourceIdentifier,
    "ip": x509.IPAddress,
}
TLS_KEYS = frozenset(
    {
        "certfile",
        "keyfile",
        "cafile",
        "verify",
        "min_version",
        "ciphers",
        "login_from",
        "san_type",
        "san_index",
    }
)


class TLSConfigError(Exception):
    """The TLS settings cannot be used; the message names the problem."""


@dataclass(frozen=True)
class TLSSettings:
    certfile: Path
    keyfile: Path
    cafile: Path | None = None
    verify: str = "none"
    min_version: str = "1.2"
    ciphers: str = MODERN_CIPHERS
    login_from: str = "common_name"
    san_type: str = "dns"
    san_index: int = 0


@dataclass(frozen=True)
class PeerCertificate:
    """A client's certificate, as the handshake verified it (never an unverified one).

    ``login`` is the user name SASL EXTERNAL logs in as (None when the certificate
    has no name of the configured kind); ``issuer`` and ``subject`` are RFC 4514
    strings, for logs and for the cluster's check that a link's certificate came
    from the cluster CA."""

    subject: str
    issuer: str
    login: str | None


def parse_tls(raw: object, key: str, base: Path | None = None) -> TLSSettings:
    """A ``[tls]`` table; relative paths are taken from ``base`` (the file's folder)."""
    if not isinstance(raw, dict):
        raise TLSConfigError(f"{key}: must be a table")
    unknown = sorted(set(raw) - TLS_KEYS)
    if unknown:
        raise TLSConfigError(f"{key}: unknown key(s) {', '.join(map(repr, unknown))}")

    def path(name: str, required: bool) -> Path | None:
        value = raw.get(name)
        if value is None:
            if required:
                raise TLSConfigError(f"{key}: '{name}' is required")
            return None
        if not isinstance(value, str) or not value:
            raise TLSConfigError(f"{key}.{name}: must be a file path")
        result = Path(value)
        return result if result.is_absolute() or base is None else base / result

    def choice(name: str, allowed: tuple[str, ...] | dict[str, Any], default: str) -> str:
        value = raw.get(name, default)
        if value not in allowed:
            raise TLSConfigError(f"{key}.{name}: one of {', '.join(allowed)}, not {value!r}")
        return str(value)

    ciphers = raw.get("ciphers", MODERN_CIPHERS)
    if not isinstance(ciphers, str) or not ciphers:
        raise TLSConfigError(f"{key}.ciphers: must be an OpenSSL cipher string")
    san_index = raw.get("san_index", 0)
    if isinstance(san_index, bool) or not isinstance(san_index, int) or san_index < 0:
        raise TLSConfigError(f"{key}.san_index: a whole number from 0, not {san_index!r}")
    settings = TLSSettings(
        certfile=path("certfile", True),  # type: ignore[arg-type]
        keyfile=path("keyfile", True),  # type: ignore[arg-type]
        cafile=path("cafile", False),
        verify=choice("verify", VERIFY_MODES, "none"),
        min_version=choice("min_version", VERSIONS, "1.2"),
        ciphers=ciphers,
        login_from=choice("login_from", LOGIN_FROM, "common_name"),
        san_type=choice("san_type", SAN_TYPES, "dns"),
        san_index=san_index,
    )
    if settings.verify != "none" and settings.cafile is None:
        raise TLSConfigError(f"{key}: verify = {settings.verify!r} needs a 'cafile'")
    return settings


def server_context(settings: TLSSettings, extra_cafiles: tuple[Path, ...] = ()) -> ssl.SSLContext:
    """The listener's context. ``extra_cafiles`` (the cluster CA) are trusted beside
    ``cafile``, and make the listener ask every client for a certificate (links must
    be able to present theirs even where ``verify = "none"``)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = VERSIONS[settings.min_version]
    try:
        context.set_ciphers(settings.ciphers)
    except ssl.SSLError:
        raise TLSConfigError(f"tls.ciphers: OpenSSL knows none of {settings.ciphers!r}") from None
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    load_chain(context, settings.certfile, settings.keyfile)
    mode = VERIFY_MODES[settings.verify]
    for cafile in (settings.cafile, *extra_cafiles):
        if cafile is not None:
            load_cas(context, cafile)
    if extra_cafiles and mode == ssl.CERT_NONE:
        mode = ssl.CERT_OPTIONAL
    context.verify_mode = mode
    return context


def client_context(
    cafile: Path, certfile: Path | None = None, keyfile: Path | None = None
) -> ssl.SSLContext:
    """A context that trusts ``cafile`` only, checks host names, and presents a
    certificate when given one (cluster links)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_cas(context, cafile)
    if certfile is not None:
        load_chain(context, certfile, keyfile or certfile)
    return context


def load_chain(context: ssl.SSLContext, certfile: Path, keyfile: Path) -> None:
    try:
        context.load_cert_chain(certfile, keyfile)
    except FileNotFoundError as exc:
        raise TLSConfigError(f"cannot read {exc.filename or certfile}: no such file") from None
    except OSError as exc:
        raise TLSConfigError(
            f"certificate {certfile} with key {keyfile} cannot be used: "
            f"{getattr(exc, 'reason', None) or exc}"
        ) from None


def load_cas(context: ssl.SSLContext, cafile: Path) -> None:
    try:
        context.load_verify_locations(cafile=str(cafile))
    except FileNotFoundError:
        raise TLSConfigError(f"cannot read CA file {cafile}: no such file") from None
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"CA file {cafile} cannot be used: {exc}") from None


def reload_context(
    context: ssl.SSLContext, settings: TLSSettings, extra_cafiles: tuple[Path, ...] = ()
) -> None:
    """New certificate, key and CAs into the live context (SIGHUP).

    Handshakes after this use them; established connections keep theirs and stay
    up. The files are tried on a scratch context first, so a bad file leaves the
    running one untouched (``TLSConfigError``). CAs can be added, not removed: a
    CA taken out of trust needs a restart."""
    cafiles = [cafile for cafile in (settings.cafile, *extra_cafiles) if cafile is not None]
    scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    load_chain(scratch, settings.certfile, settings.keyfile)
    for cafile in cafiles:
        load_cas(scratch, cafile)
    load_chain(context, settings.certfile, settings.keyfile)
    for cafile in cafiles:
        load_cas(context, cafile)


def peer_certificate(ssl_object: Any, settings: TLSSettings | None) -> PeerCertificate | None:
    """The verified client certificate of a TLS connection, or None.

    None when the listener does not verify (then OpenSSL checked nothing) or the
    client sent none."""
    if ssl_object is None or ssl_object.context.verify_mode == ssl.CERT_NONE:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    cert = x509.load_der_x509_certificate(der)
    login = login_name(cert, settings) if settings is not None else None
    return PeerCertificate(cert.subject.rfc4514_string(), cert.issuer.rfc4514_string(), login)


def login_name(cert: x509.Certificate, settings: TLSSettings) -> str | None:
    """The user name in ``cert``, as ``rabbitmq_auth_mechanism_ssl`` takes it."""
    if settings.login_from == "distinguished_name":
        return cert.subject.rfc4514_string() or None
    if settings.login_from == "common_name":
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(names[0].value) if names else None
    try:
        extension = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return None
    values = extension.value.get_values_for_type(SAN_TYPES[settings.san_type])
    if settings.san_index >= len(values):
        return None
    return str(values[settings.san_index])  # an IP address as its usual text form


def ca_subjects(cafile: Path) -> frozenset[str]:
    """The RFC 4514 subjects of the certificates in ``cafile`` (PEM): a certificate
    whose issuer is one of them was issued by that CA (OpenSSL verified the
    signature during the handshake)."""
    try:
        data = cafile.read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"cannot read CA file {cafile}: {exc.strerror}") from None
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise TLSConfigError(f"CA file {cafile} holds no PEM certificate: {exc}") from None
    return frozenset(cert.subject.rfc4514_string() for cert in certs)


def check_certificate(
    certfile: Path, keyfile: Path, cafile: Path, server_hostname: str
) -> str | None:
    """Why a peer trusting only ``cafile`` would refuse this certificate for
    ``server_hostname`` (None: it would not): a TLS handshake in memory, between
    a server with the certificate and a client with the CA, so the check is the
    one every peer makes (issuer, signature, dates, host name)."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    load_chain(server, certfile, keyfile)
    client = client_context(cafile)
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    client_end = client.wrap_bio(pipes[0], pipes[1], server_hostname=server_hostname)
    server_end = server.wrap_bio(pipes[2], pipes[3], server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):  # a TLS handshake takes a few flights
        for name, end in (("client", client_end), ("server", server_end)):
            if done[name]:
                continue
            try:
                end.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as exc:
                return str(exc.verify_message or exc.reason)
            except ssl.SSLError as exc:
                return str(exc.reason or exc)
        pipes[2].write(pipes[1].read())  # client to server
        pipes[0].write(pipes[3].read())  # server to client
        if all(done.values()):
            return None
    return "the handshake did not finish"
