"""Daphne answers an over-long request line or header instead of hanging up.

Daphne serves HTTP with Twisted's ``HTTPChannel``, which bounds a request's line and
headers at 16 KB (``MAX_LENGTH`` per line, ``totalHeadersSize`` for all). Past the
total it answers 400; but a *single* line longer than 16 KB reaches
``LineReceiver.lineLengthExceeded``, which closes the connection without a word,
and a client cannot tell that from a crash. :func:`install` makes that an answer:
414 for the request line, 431 for a header, then the connection is closed (the rest
of the request is not read). In production nginx answers first, with its own limits
(deploy/nginx/rookery.conf); this is for the quickstart and for Daphne alone.
"""

from __future__ import annotations

from typing import Any

_installed = False


def _answer(channel: Any, line: bytes) -> None:
    first = bool(getattr(channel, "_HTTPChannel__first_line", False))
    status = b"414 URI Too Long" if first else b"431 Request Header Fields Too Large"
    what = b"request line" if first else b"header line"
    body = b"%s longer than %d bytes\n" % (what, channel.MAX_LENGTH)
    channel.transport.write(
        b"HTTP/1.1 " + status + b"\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n"
        b"Connection: close\r\n\r\n" + body
    )
    channel.loseConnection()


def install() -> None:
    """Patch Twisted's ``HTTPChannel`` once (nothing to do where Twisted is absent)."""
    global _installed
    if _installed:
        return
    try:
        from twisted.web.http import HTTPChannel
    except ImportError:  # pragma: no cover - Daphne brings Twisted
        return
    HTTPChannel.lineLengthExceeded = _answer  # type: ignore[method-assign,assignment]
    _installed = True
