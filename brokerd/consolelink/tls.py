"""TLS for the console link: the context a ``wss://`` link checks the console with.

Verification is not optional. The link carries the broker's token and takes
commands (configuration, users with password hashes) from whoever answers, so
a console that cannot prove its name with a certificate from a trusted CA is
no console. There is no switch to turn the check off: a private CA is named
with ``--console-cafile`` instead.
"""

from __future__ import annotations

import ssl
from pathlib import Path

#: the only schemes the link speaks; wss:// is the one with TLS
SECURE_SCHEME = "wss://"


class ConsoleTLSError(ValueError):
    """A CA file that cannot be used, or one named for a link that has no TLS."""


def is_secure(url: str) -> bool:
    return url.lower().startswith(SECURE_SCHEME)


def client_context(url: str, cafile: Path | None = None) -> ssl.SSLContext | None:
    """The context that verifies the console at ``url``: None for ``ws://``; for
    ``wss://`` certificate required, host name checked, TLS 1.2 at least, trusting
    ``cafile`` (PEM) alone when given, else the system's trust store.

    Raises ``ConsoleTLSError`` for a CA file with a ``ws://`` URL (it would protect
    nothing while the operator believes it does) and for a CA file that cannot be
    read or holds no certificate."""
    if not is_secure(url):
        if cafile is not None:
            raise ConsoleTLSError(
                f"a CA file ({cafile}) needs a wss:// console URL; {url} is plain ws://, "
                "which has no certificate to verify"
            )
        return None
    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=None if cafile is None else str(cafile)
        )
    except ssl.SSLError as exc:
        reason = exc.reason or exc
        raise ConsoleTLSError(f"CA file {cafile} is not a PEM CA bundle ({reason})") from None
    except OSError as exc:
        raise ConsoleTLSError(f"CA file {cafile}: {exc.strerror or exc}") from None
    # create_default_context already does all three; stated so that no default can drift
    context.verify_mode = ssl.CERT_REQUIRED
    context.check_hostname = True
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def describe_failure(exc: ssl.SSLError) -> str:
    """One line for the log: what failed, in OpenSSL's words but without its file and
    line (``certificate verify failed: Hostname mismatch, ...``)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or exc.reason or "unknown reason"
        return f"certificate verify failed: {detail}"
    return f"TLS failed: {exc.reason or exc.strerror or type(exc).__name__}"
