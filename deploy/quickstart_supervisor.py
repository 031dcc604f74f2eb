"""The quickstart's supervision: prefixed output, services started in order and
watched, probes that tell a service is ready, restarts, everything stopped in
reverse.

Split from ``deploy/quickstart.py`` (which says *what* runs); this says *how*
processes are run. Nothing here knows Rookery.

A process that exits when nobody asked it to is started again, with the same
argv and environment, after a backoff (1 s, 2 s, 4 s... at most 10 s; back to
1 s once a run has lasted 30 s), and the others keep running: stopping a whole
demo cluster because one broker died would hide what the cluster does about it.
The restart is logged with the exit status or the killing signal, and the new
process must pass its readiness check again, in its own task so that nobody
else waits. Only a crash loop stops everything: the fifth crash within 60 s
gives up with exit status 1 and the process's last lines (``RestartPolicy``).
Stopping (Ctrl-C, SIGTERM, a give-up) marks every service as stopping first,
so nothing is restarted while the others are being stopped.

A service marked ``keep_stopped`` that exits on its own with status 0 stopped as
planned (someone sent it SIGTERM: a drained broker that an operator means to
decommission); it is left stopped, logged as such, and counts as no crash. Any
other exit of such a service (a status other than 0, a signal: kill -9) is a
crash as above. The operator also stops, starts and restarts one service of the
running supervisor (``stop_service``, ``start_service``, ``restart_service``;
``quickstart_control`` carries them over a Unix socket): a service stopped that
way stays stopped, a start waits for its readiness check as at startup, and
neither counts towards the crash loop.
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
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

HOST = "127.0.0.1"
#: the checkout: every service runs from it
REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT = 60.0  # seconds a process gets to become ready (at each start)
STOP_TIMEOUT = 15.0  # seconds between SIGTERM and SIGKILL
DRAIN_TIMEOUT = 2.0  # seconds to read what a dead process still had in its pipe
LAST_LINES = 10  # lines of a process kept for the give-up message

# What ``Service.state`` says, as ``status`` shows it.
STARTING = "starting"  # started (at startup or on request), not ready yet
RUNNING = "running"  # ready
RESTARTING = "restarting"  # exited on its own: waiting out the backoff, or not ready yet
STOPPING = "stopping"  # SIGTERM sent, not exited yet
STOPPED = "stopped"  # exited and left so: a planned stop, a request, the end of the run
FAILED = "failed"  # crashed once too often: everything is stopping


class ControlError(Exception):
    """A request the supervisor refuses (unknown service, everything stopping...);
    the message says why."""


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


@dataclass(frozen=True)
class RestartPolicy:
    """When a process that exited on its own is started again, and when to give up.

    The delay doubles so that a process failing at once does not spin; it is reset
    after a stable run so that a rare crash costs one second, not the last delay.
    """

    first_delay: float = 1.0
    max_delay: float = 10.0
    stable_after: float = 30.0  # a run at least this long resets the delay
    max_exits: int = 5  # this many exits within ``window`` seconds: give up
    window: float = 60.0

    def delay(self, attempt: int) -> float:
        """Seconds before restart ``attempt`` (0: the first since a stable run)."""
        return min(self.first_delay * 2 ** min(attempt, 32), self.max_delay)


def describe_exit(code: int) -> str:
    """``status 3`` or ``killed by SIGKILL``, from an asyncio return code."""
    if code >= 0:
        return f"status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


@dataclass
class Service:
    """One supervised process: how to start it, how to tell it is ready, and what its
    supervision has seen so far."""

    name: str
    argv: list[str]
    env: dict[str, str]
    probe: Probe | None = None  # polled until it returns True
    ready_line: re.Pattern[str] | None = None  # or: a line it prints when ready
    #: an exit of its own with status 0 is a planned stop: left stopped, no crash
    keep_stopped: bool = False
    proc: asyncio.subprocess.Process | None = None  # the current process
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # the current one is ready
    state: str = STARTING
    last_exit: int | None = None  # the return code of its last process that exited
    stopping: bool = False  # asked to stop: an exit now is no crash
    #: said once the current process is ready ("... is ready again (restart 2)")
    announce: str | None = None
    restarts: int = 0  # times it was started again
    backoff: int = 0  # restarts since its last stable run
    started_at: float = 0.0  # loop time the current process was started
    exits: deque[float] = field(default_factory=deque)  # loop times of recent crashes
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=LAST_LINES))
    #: held while a process is being started or stopped, so the two never overlap
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    relay: asyncio.Task[None] | None = None
    runner: asyncio.Task[None] | None = None


class Supervisor:
    """Starts services in order, relays their output, restarts those that exit on their
    own, stops them in reverse order."""

    def __init__(
        self,
        output: Output,
        policy: RestartPolicy | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        ctl: str = "",
    ) -> None:
        self.output = output
        self.policy = policy or RestartPolicy()
        self.startup_timeout = startup_timeout
        #: the command that reaches this supervisor (``ctl start NAME`` follows it), for
        #: the hint logged when a service stays stopped
        self.ctl = ctl
        self.services: list[Service] = []
        self.shutdown = asyncio.Event()
        self.failure: str | None = None
        self.killing = False  # the second Ctrl-C: SIGKILL, no waiting

    async def start(self, service: Service) -> None:
        """Start ``service`` and return once it is ready, stopped as planned, or
        everything is stopping.

        A process that exits before it is ready is restarted like any other, so a
        service that cannot start at all ends as a crash loop.
        """
        self.services.append(service)
        async with service.lock:
            await self._spawn(service, STARTING)
        service.runner = asyncio.create_task(self._run(service))
        await _either(service.ready, self.shutdown, done=service.runner)

    def _start_hint(self, service: Service) -> str:
        return f"start it again with: {self.ctl} start {service.name}" if self.ctl else ""

    async def _spawn(self, service: Service, state: str) -> None:
        service.state = state
        service.ready.clear()
        proc = await asyncio.create_subprocess_exec(
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
        service.proc = proc
        service.started_at = asyncio.get_running_loop().time()
        service.relay = asyncio.create_task(self._relay(service, proc))
        if self.killing:  # the second Ctrl-C came while it was being started
            _kill_session(proc)

    async def _run(self, service: Service) -> None:
        """The service's life after its first start: ready, exited, restarted or given up."""
        while True:
            proc = service.proc
            assert proc is not None
            await self._until_ready(service, proc)
            code = await proc.wait()
            await self._drain(service, proc)
            if service.stopping or self.shutdown.is_set():
                return
            service.last_exit = code
            if code == 0 and service.keep_stopped:
                service.state = STOPPED
                hint = self._start_hint(service)
                self.output.say(
                    f"{service.name} stopped as planned (status 0)" + (f"; {hint}" if hint else "")
                )
                return
            delay = self._crashed(service, code)
            if delay is None:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.shutdown.wait(), delay)
            async with service.lock:
                if service.stopping or self.shutdown.is_set():
                    return
                await self._spawn(service, RESTARTING)

    def _crashed(self, service: Service, code: int) -> float | None:
        """Account for an exit nobody asked for: the delay before the restart, or None
        when this is one exit too many (then everything is stopping)."""
        now = asyncio.get_running_loop().time()
        policy = self.policy
        service.exits.append(now)
        while now - service.exits[0] > policy.window:
            service.exits.popleft()
        status = describe_exit(code)
        if len(service.exits) >= policy.max_exits:
            self.failure = (
                f"{service.name} crashed {len(service.exits)} times in {policy.window:g} s: "
                "giving up"
            )
            self.output.say(f"{service.name} exited ({status})")
            self.output.say(f"{self.failure}; its last lines:")
            for line in service.recent:
                self.output.say(f"    {line}")
            self.output.say("stopping everything")
            service.state = FAILED
            self.shutdown.set()
            return None
        if now - service.started_at >= policy.stable_after:
            service.backoff = 0
        delay = policy.delay(service.backoff)
        service.backoff += 1
        service.restarts += 1
        service.state = RESTARTING
        service.announce = f"{service.name} is ready again (restart {service.restarts})"
        self.output.say(
            f"{service.name} exited ({status}); restarting in {delay:g} s "
            f"(restart {service.restarts})"
        )
        return delay

    async def _drain(self, service: Service, proc: asyncio.subprocess.Process) -> None:
        """After ``proc`` exited: end what it left in its session (e.g. Celery's pool
        processes, which would hold its queue and port), and relay its last lines."""
        _kill_session(proc)
        relay = service.relay
        if relay is not None:
            _, pending = await asyncio.wait({relay}, timeout=DRAIN_TIMEOUT)
            for task in pending:
                task.cancel()

    async def _relay(self, service: Service, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        stream = proc.stdout
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than the limit: show it in pieces
                raw = await stream.read(1 << 20)
            if not raw:
                return
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.output.line(service.name, text)
            service.recent.append(text)
            if service.ready_line is not None and service.ready_line.search(text):
                self._ready(service)

    async def _until_ready(self, service: Service, proc: asyncio.subprocess.Process) -> None:
        """Wait until ``proc`` is ready; it exiting first is left to the caller. Not
        ready in time stops everything: something is wrong that a restart would not fix."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout
        while not service.ready.is_set():
            if self.shutdown.is_set() or proc.returncode is not None:
                return
            if loop.time() > deadline:
                self.failure = f"{service.name} was not ready after {self.startup_timeout:g} s"
                self.output.say(self.failure + "; stopping everything")
                self.shutdown.set()
                return
            if service.probe is not None and await service.probe():
                self._ready(service)
                break
            with contextlib.suppress(TimeoutError):  # a ready line ends the wait at once
                await asyncio.wait_for(_either(self.shutdown, service.ready), 0.2)

    def _ready(self, service: Service) -> None:
        """The current process passed its readiness check."""
        if service.ready.is_set():
            return
        service.ready.set()
        if service.state in (STARTING, RESTARTING):
            service.state = RUNNING
        if service.announce is not None:
            self.output.say(service.announce)
            service.announce = None

    async def stop_all(self) -> None:
        self.shutdown.set()
        for service in self.services:  # none is restarted while the others stop
            service.stopping = True
        for service in reversed(self.services):
            await self._stop(service)

    # -- one service, on an operator's request (``quickstart_control``) ---------------------

    def find(self, name: str) -> Service:
        for service in self.services:
            if service.name == name:
                return service
        known = ", ".join(s.name for s in self.services) or "none started yet"
        raise ControlError(f"no service {name!r} (services: {known})")

    def status_lines(self) -> list[str]:
        """One line per service: name, state, pid, restarts and last exit."""
        width = max((len(s.name) for s in self.services), default=0)
        lines = []
        for service in self.services:
            proc = service.proc
            alive = proc is not None and proc.returncode is None
            pid = f"pid {proc.pid}" if alive and proc is not None else "-"
            detail = [f"restarts {service.restarts}"] if service.restarts else []
            if service.last_exit is not None:
                detail.append(f"last exit: {describe_exit(service.last_exit)}")
            line = f"{service.name:<{width}}  {service.state:<10}  {pid:<10}  {', '.join(detail)}"
            lines.append(line.rstrip())
        return lines

    def _refuse_while_stopping(self) -> None:
        if self.shutdown.is_set():
            raise ControlError("everything is stopping")

    async def stop_service(self, name: str) -> str:
        """SIGTERM to the service, which then stays stopped until ``start_service``."""
        self._refuse_while_stopping()
        service = self.find(name)
        if service.state == STOPPED:
            return f"{name} is stopped already"
        if service.state == STOPPING:
            raise ControlError(f"{name} is being stopped already")
        code = await self._stop(service, "on request")
        hint = self._start_hint(service)
        return f"{name} stopped ({describe_exit(code)})" + (f"; {hint}" if hint else "")

    async def start_service(self, name: str) -> str:
        """Start a stopped service; returns once it passed its readiness check (a
        process exiting before that is restarted, as at startup)."""
        self._refuse_while_stopping()
        service = self.find(name)
        async with service.lock:
            if service.state != STOPPED:
                raise ControlError(f"{name} is {service.state}, not stopped")
            self._refuse_while_stopping()
            service.stopping = False
            service.backoff = 0  # an operator's start, not a restart after a crash
            service.announce = f"{name} is ready (started on request)"
            await self._spawn(service, STARTING)
        service.runner = asyncio.create_task(self._run(service))
        self.output.say(f"{name} started on request (pid {_pid(service)})")
        await _either(service.ready, self.shutdown, done=service.runner)
        if self.shutdown.is_set():
            raise ControlError(f"{name} not started: {self.failure or 'everything is stopping'}")
        if service.ready.is_set():
            return f"{name} started (pid {_pid(service)}) and ready"
        if service.stopping:  # a stop request came first
            raise ControlError(f"{name} was stopped before it was ready")
        code = service.last_exit if service.last_exit is not None else 0
        raise ControlError(f"{name} exited before it was ready ({describe_exit(code)}): stopped")

    async def restart_service(self, name: str) -> str:
        """``stop_service`` (unless stopped already), then ``start_service``."""
        stopped = await self.stop_service(name)
        started = await self.start_service(name)
        return f"{stopped}\n{started}"

    def kill_all(self) -> None:
        self.killing = True
        for service in self.services:
            service.stopping = True
            if service.proc is not None and service.proc.returncode is None:
                _kill_session(service.proc)

    async def _stop(self, service: Service, why: str = "") -> int | None:
        """SIGTERM (SIGKILL after ``STOP_TIMEOUT``), and wait; the return code. A
        service stopped already (reported when it stopped) is left alone."""
        service.stopping = True  # first: its runner must not start it again meanwhile
        if service.state == STOPPED:
            await _settle(service)
            return service.last_exit
        service.state = STOPPING
        async with service.lock:  # not while it is being started again
            proc = service.proc
            if proc is None:
                service.state = STOPPED
                return None
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
                except TimeoutError:
                    self.output.say(
                        f"{service.name} ignored SIGTERM for {STOP_TIMEOUT:.0f} s: killed"
                    )
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
            # Anything it left behind in its session (e.g. Celery pool processes).
            _kill_session(proc)
        await _settle(service)
        service.state = STOPPED
        service.last_exit = proc.returncode
        self.output.say(
            f"{service.name} stopped{' ' + why if why else ''} (status {proc.returncode})"
        )
        return proc.returncode


async def _settle(service: Service) -> None:
    """End the service's runner (it may be probing or waiting to restart) and let its
    relay finish."""
    if service.runner is not None and service.runner is not asyncio.current_task():
        service.runner.cancel()
    tasks = [t for t in (service.runner, service.relay) if t is not None]
    tasks = [t for t in tasks if t is not asyncio.current_task()]
    await asyncio.gather(*tasks, return_exceptions=True)


def _pid(service: Service) -> int | None:
    return service.proc.pid if service.proc is not None else None


def _kill_session(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL to every process of ``proc``'s session (its own process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _either(*events: asyncio.Event, done: asyncio.Task[None] | None = None) -> None:
    """Return once one of ``events`` is set, or the task ``done`` is over."""
    waiters = [asyncio.create_task(event.wait()) for event in events]
    watched: set[asyncio.Future[object]] = set(waiters)
    if done is not None:
        watched.add(done)
    try:
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


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
