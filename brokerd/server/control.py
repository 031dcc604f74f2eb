"""The local control socket (like rabbitmqctl's): one JSON request per connection.

The socket lives in the data directory (``brokerd.sock``, mode 0600), so
only the broker's own user can reach it; nothing listens on the network.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("brokerd.control")

SOCKET_NAME = "brokerd.sock"
MAX_REQUEST = 64 * 1024

#: answers a request, at once or (a command that waits for the cluster) by a coroutine
Handler = Callable[[dict[str, Any]], dict[str, Any] | Awaitable[dict[str, Any]]]


class ControlError(Exception):
    """A refused control request; the message goes back to ``brokerd ctl``."""


def socket_path(data_dir: Path) -> Path:
    return data_dir / SOCKET_NAME


async def serve_control(data_dir: Path, handler: Handler) -> asyncio.AbstractServer:
    path = socket_path(data_dir)
    if path.exists() or path.is_symlink():
        path.unlink()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                line = await asyncio.wait_for(reader.readline(), timeout=5.0)
            except ValueError:  # no newline within the reader's limit (64 KiB)
                raise ControlError("request too large") from None
            if len(line) > MAX_REQUEST:
                raise ControlError("request too large")
            try:
                request = json.loads(line)
            except ValueError:
                raise ControlError("request is not JSON") from None
            if not isinstance(request, dict) or not isinstance(request.get("command"), str):
                raise ControlError("request needs a 'command'")
            args = request.get("args", [])
            if request["command"] == "bridges" and isinstance(args, list):
                args = args[:2]  # a definition's URIs carry passwords: never logged
            log.info("ctl command=%s args=%s", request["command"], args)
            result = handler(request)
            if inspect.isawaitable(result):
                result = await result
            reply: dict[str, Any] = {"ok": True, "result": result}
        except ControlError as exc:
            reply = {"ok": False, "error": str(exc)}
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.debug("ctl client gone before its request: %r", exc)
            writer.close()
            return
        writer.write(json.dumps(reply, default=str).encode() + b"\n")
        try:
            await writer.drain()
        except ConnectionError as exc:
            # the client gave up (its timeout) and closed: a normal end, not a server fault
            log.debug("ctl client gone before its reply: %r", exc)
        finally:
            writer.close()

    server = await asyncio.start_unix_server(on_client, path=str(path))
    os.chmod(path, 0o600)
    return server


def request(
    data_dir: Path, command: str, args: list[str] | None = None, timeout: float = 10.0
) -> dict[str, Any]:
    """Client side: send one request over the socket and return the decoded reply."""
    import socket

    path = socket_path(data_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps({"command": command, "args": args or []}).encode() + b"\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return json.loads(b"".join(chunks) or b'{"ok": false, "error": "no reply"}')
