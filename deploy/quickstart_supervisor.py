"""The quickstart's supervision: prefixed output, services started in order and
watched, probes that tell a service is ready, everything stopped in reverse.

Split from ``deploy/quickstart.py`` (which says *what* runs); this says *how*
processes are run. Nothing here knows Rookery.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import os
import re
import signal
import ssl
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

HOST = "127.0.0.1"
#: the checkout: every service runs from it
REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT = 60.0  # seconds a process gets to become ready
STOP_TIMEOUT = 15.0  # seconds between SIGTERM and SIGKILL

_COLOURS = itertools.cycle(["36", "32", "33", "35", "34", "96", "92", "93", "95", "94"])


# -- output -------------------------------------------------------------------------------


class Output:
    """Lines from every process, each prefixed with its name (coloured on a terminal)."""

    def __init__(self, stream: TextIO, names: tuple[str, ...] = ()) -> None:
        self.stream = stream
        self.colour = stream.isatty() and os.environ.get("NO_COLOR") is None
        self.width = max(len(n) for n in ("rookery", *names))
        self.colours: dict[str, str] = {"rookery": "1"}
        self.closed = False

    def line(self, name: str, text: str) -> None:
        label = f"{name:<{self.width}} |"
        if self.colour:
            code = self.colours.setdefault(name, next(_COLOURS))
            label = f"\033[{code}m{label}\033[0m"
        if self.closed:
            return
        try:
            self.stream.write(f"{label} {text}\n")
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            # The reader went away (`make run | tee` and Ctrl-C): keep stopping quietly.
            self.closed = True
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())

    def say(self, text: str) -> None:
        for part in text.splitlines() or [""]:
            self.line("rookery", part)


class _PrefixedWriter:
    """A file-like object for ``call_command(stdout=...)`` that prefixes each line."""

    def __init__(self, output: Output, name: str) -> None:
        self.output, self.name, self.pending = output, name, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            self.output.line(self.name, line)
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.output.line(self.name, self.pending)
            self.pending = ""


# -- processes ------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the quickstart itself is killed (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


Probe = Callable[[], Awaitable[bool]]


@dataclass
class Service:
    """One supervised process: how to start it and how to tell it is ready."""

    name: str
    argv: list[str]
    env: dict[str, str]
    probe: Probe | None = None  # polled until it returns True
    ready_line: re.Pattern[str] | None = None  # or: a line it prints when ready
    proc: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class Supervisor:
    """Starts services in order, relays their output, stops them in reverse order."""

    def __init__(self, output: Output) -> None:
        self.output = output
        self.services: list[Service] = []
        self.shutdown = asyncio.Event()
        self.failure: str | None = None

    async def start(self, service: Service) -> None:
        self.services.append(service)
        service.proc = await asyncio.create_subprocess_exec(
            *service.argv,
            cwd=REPO,
            env=service.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches only us; we stop them in order
            preexec_fn=_die_with_parent,
            limit=1 << 20,
        )
        service.tasks = [
            asyncio.create_task(self._relay(service)),
            asyncio.create_task(self._watch(service)),
        ]
        await self._until_ready(service)

    async def _relay(self, service: Service) -> None:
        assert service.proc is not None and service.proc.stdout is not None
        stream = service.proc.stdout
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the limit: show it in pieces
                raw = await stream.read(1 << 20)
            if not raw:
                return
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.output.line(service.name, text)
            if service.ready_line is not None and service.ready_line.search(text):
                service.ready.set()

    async def _watch(self, service: Service) -> None:
        assert service.proc is not None
        code = await service.proc.wait()
        if not service.stopping and self.failure is None and not self.shutdown.is_set():
            self.failure = f"{service.name} exited unexpectedly (status {code})"
            self.output.say(self.failure + "; stopping everything")
            self.shutdown.set()

    async def _until_ready(self, service: Service) -> None:
        deadline = asyncio.get_running_loop().time() + STARTUP_TIMEOUT
        while not service.ready.is_set():
            if self.shutdown.is_set():
                return
            if asyncio.get_running_loop().time() > deadline:
                self.failure = f"{service.name} was not ready after {STARTUP_TIMEOUT:.0f} s"
                self.output.say(self.failure + "; stopping everything")
                self.shutdown.set()
                return
            if service.probe is not None and await service.probe():
                service.ready.set()
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.shutdown.wait(), 0.2)

    async def stop_all(self) -> None:
        for service in reversed(self.services):
            await self._stop(service)

    def kill_all(self) -> None:
        for service in self.services:
            service.stopping = True
            if service.proc is not None and service.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(service.proc.pid, signal.SIGKILL)

    async def _stop(self, service: Service) -> None:
        proc = service.proc
        if proc is None:
            return
        service.stopping = True
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                self.output.say(f"{service.name} ignored SIGTERM for {STOP_TIMEOUT:.0f} s: killed")
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        # Anything it left behind in its session (e.g. Celery pool processes).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await asyncio.gather(*service.tasks, return_exceptions=True)
        self.output.say(f"{service.name} stopped (status {proc.returncode})")


async def _tcp_open(port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _exchange(port: int, request: bytes, tls: ssl.SSLContext | None = None) -> bytes:
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(HOST, port, ssl=tls, server_hostname=HOST if tls else None),
            2.0,
        )
    except (OSError, TimeoutError):
        return b""
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 2.0)
    except (OSError, TimeoutError):
        return b""
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def redis_probe(port: int) -> Probe:
    async def probe() -> bool:
        return (await _exchange(port, b"PING\r\n")).startswith(b"+PONG")

    return probe


def http_probe(port: int, path: str, tls: ssl.SSLContext | None = None) -> Probe:
    request = f"GET {path} HTTP/1.0\r\nHost: {HOST}:{port}\r\n\r\n".encode()

    async def probe() -> bool:
        return b" 200 " in await _exchange(port, request, tls)

    return probe


def tcp_probe(port: int) -> Probe:
    return lambda: _tcp_open(port)
