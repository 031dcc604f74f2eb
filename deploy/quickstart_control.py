"""The control channel of a running quickstart: stop, start, restart one service, or
list them, while ``make run`` keeps the rest running.

A Unix socket in DATA_DIR (``quickstart.sock``, mode 0600: only the user who runs
``make run`` reaches it; no network port, so nothing to authenticate). The
protocol is one line each way and then some: the client sends one request line,

    status | stop NAME | start NAME | restart NAME

and the supervisor answers with text lines, the last of which is ``ok`` or
``error``, and closes the connection. ``start`` and ``restart`` answer once the
service passed its readiness check (up to a minute), so the client waits longer
than that. The client is ``deploy/quickstart.py ctl ...`` (``request`` here).

Split from ``quickstart_supervisor.py``, which does what is asked; this only
carries the requests. Nothing here knows Rookery.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from pathlib import Path

from quickstart_supervisor import (  # deploy/, next to this file
    STARTUP_TIMEOUT,
    STOP_TIMEOUT,
    ControlError,
    Supervisor,
)

SOCKET_NAME = "quickstart.sock"
#: request word -> how many names follow it
COMMANDS = {"status": 0, "stop": 1, "start": 1, "restart": 1}
USAGE = "status | stop NAME | start NAME | restart NAME"
#: a client waits this long for an answer: a restart stops, then waits for readiness
ANSWER_TIMEOUT = STOP_TIMEOUT + STARTUP_TIMEOUT + 15.0
REQUEST_TIMEOUT = 5.0  # seconds a client gets to send its request line
MAX_REQUEST = 256  # bytes of a request line
#: sun_path holds 108 bytes on Linux (104 on the BSDs), its terminating NUL included
MAX_PATH = 103


class ControlUnavailable(Exception):
    """No quickstart answers on the socket; the message says what was tried."""


def parse(line: str) -> tuple[str, str | None]:
    """``(command, name)`` from a request line; ``ControlError`` when it is not one."""
    words = line.split()
    if not words or words[0] not in COMMANDS or len(words) != 1 + COMMANDS[words[0]]:
        raise ControlError(f"expected {USAGE}, got {line.strip()!r}")
    return words[0], (words[1] if len(words) > 1 else None)


async def answer(supervisor: Supervisor, line: str) -> tuple[bool, list[str]]:
    """What the supervisor answers to one request line: (ok, text lines)."""
    try:
        command, name = parse(line)
        if command == "status":
            return True, supervisor.status_lines()
        assert name is not None
        action = {
            "stop": supervisor.stop_service,
            "start": supervisor.start_service,
            "restart": supervisor.restart_service,
        }[command]
        return True, (await action(name)).splitlines()
    except ControlError as exc:
        return False, str(exc).splitlines()


def check_free(path: Path) -> None:
    """Make room for a new socket at ``path``: a socket nobody answers on (a
    quickstart that was killed) is removed; ``ControlError`` if one answers (another
    quickstart on this DATA_DIR), if ``path`` is something else, or is too long."""
    if len(os.fsencode(path)) > MAX_PATH:
        raise ControlError(
            f"{path} is longer than a Unix socket path may be ({MAX_PATH} bytes): "
            "use a shorter DATA_DIR"
        )
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ControlError(f"{path} is in the way (not a socket): remove it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError, TimeoutError):
            path.unlink(missing_ok=True)  # left by a quickstart that is gone
            return
    raise ControlError(f"another quickstart answers on {path}: it uses this DATA_DIR")


class ControlServer:
    """The supervisor's end of the channel."""

    def __init__(self, supervisor: Supervisor, path: Path) -> None:
        self.supervisor = supervisor
        self.path = path
        self.server: asyncio.AbstractServer | None = None
        self.clients: set[asyncio.Task[object]] = set()

    async def open(self) -> None:
        """Listen on ``path``, mode 0600 from the start (the umask, not a chmod after
        the bind: no moment where another user could connect)."""
        check_free(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        umask = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(umask)
        self.server = await asyncio.start_unix_server(self._serve, sock=sock)

    async def close(self) -> None:
        """Stop listening, end the requests under way (everything is stopping: they
        were answered ``error`` already or are about to be), remove the socket."""
        if self.server is None:
            return
        self.server.close()
        for task in list(self.clients):
            task.cancel()
        await asyncio.gather(*self.clients, return_exceptions=True)
        with contextlib.suppress(OSError):
            await self.server.wait_closed()
        self.server = None
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.clients.add(task)
        try:
            try:
                raw = await asyncio.wait_for(reader.readline(), REQUEST_TIMEOUT)
            except (TimeoutError, ValueError, OSError):
                return
            if len(raw) > MAX_REQUEST or not raw.endswith(b"\n"):
                ok, lines = False, [f"a request is one line of at most {MAX_REQUEST} bytes"]
            else:
                ok, lines = await answer(self.supervisor, raw.decode("utf-8", "replace"))
            text = "".join(f"{line}\n" for line in lines) + ("ok\n" if ok else "error\n")
            with contextlib.suppress(OSError):
                writer.write(text.encode())
                await writer.drain()
        finally:
            self.clients.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def request(path: Path, line: str, timeout: float = ANSWER_TIMEOUT) -> tuple[bool, list[str]]:
    """The client's end: send ``line``, return (ok, the answer's text lines).
    ``ControlUnavailable`` when no quickstart answers on ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise ControlUnavailable(f"nothing answers on {path} ({exc.strerror})") from None
        except OSError as exc:
            raise ControlUnavailable(f"cannot reach {path}: {exc}") from None
        chunks = []
        try:
            sock.sendall(line.strip().encode() + b"\n")
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            raise ControlUnavailable(f"{path}: no answer within {timeout:g} s") from None
        except OSError as exc:
            raise ControlUnavailable(f"{path}: {exc}") from None
    lines = b"".join(chunks).decode("utf-8", "replace").splitlines()
    if not lines or lines[-1] not in ("ok", "error"):
        raise ControlUnavailable(f"{path}: the answer ended early: {lines[-3:]}")
    return lines[-1] == "ok", lines[:-1]
