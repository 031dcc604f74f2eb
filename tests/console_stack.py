"""The whole console on loopback for integration tests: Redis, Daphne, Celery, brokers.

``ConsoleStack`` starts a private ``redis-server`` (no persistence), migrates a
fresh SQLite database under its own ``DATA_DIR``, creates an operator and a
read-only user, then runs Daphne and a Celery worker with beat exactly as a
deployment does, with the same environment for all of them. ``start_cluster``
adds real brokerd processes linked to the console. With ``tls_endpoints``
Daphne also serves HTTPS and ``wss://`` on one more port per certificate
(``tls_ports``, ``wss_url``), beside its plain port. Every process logs to a file
under the stack's directory; ``print_logs`` shows their tails when a test fails.

The fixture ``console_stack`` (module scoped) is what tests use.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from console.environment import new_token
from tests.brokerd_process import BrokerProcess, free_port, wait_for_port
from tests.cluster_harness import Cluster
from tests.console_env import environ_without
from tests.support.eventually import eventually

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
REDIS_SERVER = "/usr/bin/redis-server"

OPERATOR = ("operator", "operator-pass-1")
VIEWER = ("viewer", "viewer-pass-1")

# Heartbeat of the test clusters: fast, so that down/up and elections take seconds.
HEARTBEAT = {"interval": 0.3, "timeout": 1.2, "open_timeout": 8}

# Fast periodic work for the console's Celery beat (settings read by console.settings):
# a broker silent for 5 heartbeats (1.5 s) is down, checked every second.
FAST_BEAT_ENV = {
    "STALE_CHECK_SECONDS": "1",
    "BROKER_STALE_INTERVALS": "5",
    "COMMAND_RETRY_SECONDS": "1",
    "COMMAND_TIMEOUT_SECONDS": "30",
    "QUEUE_SAMPLE_SECONDS": "1",
}


class ApiError(AssertionError):
    pass


class Api:
    """A JSON client of the REST API, authenticated with a token (or not at all)."""

    def __init__(self, base: str, token: str | None = None) -> None:
        self.base = base.rstrip("/")
        self.token = token

    def request(
        self, method: str, path: str, body: Any = None, *, token: str | None = None
    ) -> tuple[int, Any]:
        """``(status, decoded JSON body or text)``; never raises on an HTTP error status."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        auth = token if token is not None else self.token
        if auth:
            req.add_header("Authorization", f"Token {auth}")
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                status, raw, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            status, raw, ctype = err.code, err.read(), err.headers.get("Content-Type", "")
        if "json" in ctype:
            return status, json.loads(raw or b"null")
        return status, raw.decode(errors="replace")

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.request("POST", path, {} if body is None else body, **kw)

    def ok(self, path: str) -> Any:
        """GET that must answer 200; the decoded body."""
        status, body = self.get(path)
        if status != 200:
            raise ApiError(f"GET {path} -> {status}: {body}")
        return body

    def items(self, path: str) -> list[dict[str, Any]]:
        """Every item of a paginated list (all pages)."""
        out: list[dict[str, Any]] = []
        sep = "&" if "?" in path else "?"
        page = 1
        while True:
            body = self.ok(f"{path}{sep}page={page}")
            out.extend(body["results"])
            if not body.get("next"):
                return out
            page += 1


class Service:
    """One child process of the stack with its log file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: celery's children go with it
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the process group, SIGKILL it if it hangs."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        # Stray children (celery's pool) if the parent left them behind.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode


class ConsoleStack:
    """Redis + migrated database + Daphne + Celery worker/beat, and optionally brokers."""

    def __init__(
        self,
        root: Path,
        *,
        extra_env: dict[str, str] | None = None,
        tls_endpoints: Sequence[tuple[Path, Path]] = (),
    ) -> None:
        self.root = root
        self.data_dir = root / "data"
        self.logs = root / "logs"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.redis_port = free_port()
        self.http_port = free_port()
        #: (certfile, keyfile) of each TLS port Daphne serves beside the plain one
        self.tls_endpoints = list(tls_endpoints)
        self.tls_ports = [free_port() for _ in self.tls_endpoints]
        self.broker_token = new_token(24)
        env = environ_without()  # the caller's console settings must not leak in
        env.update(
            DJANGO_SETTINGS_MODULE="tests.settings",
            DEBUG="0",
            CONSOLE_HTTPS="0",
            SECRET_KEY=new_token(40),
            DATA_DIR=str(self.data_dir),
            REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0",
            CONSOLE_BROKER_TOKEN=self.broker_token,
            LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
            CONSOLE_BEAT="1",  # Daphne beats; the Celery worker never calls the ASGI app
            **FAST_BEAT_ENV,
            **(extra_env or {}),
        )
        self.env = env
        self.services: dict[str, Service] = {}
        self.cluster: Cluster | None = None
        self.tokens: dict[str, str] = {}

    # -- URLs -------------------------------------------------------------------------------

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def link_url(self) -> str:
        return f"ws://127.0.0.1:{self.http_port}/ws/brokers/"

    def wss_url(self, index: int = 0) -> str:
        """The broker endpoint on TLS port ``index`` (``tls_endpoints[index]``)."""
        return f"wss://127.0.0.1:{self.tls_ports[index]}/ws/brokers/"

    def api(self, user: tuple[str, str] | None = OPERATOR) -> Api:
        """An API client as ``user`` (a token is fetched once per user); None: anonymous."""
        if user is None:
            return Api(self.http_url)
        if user[0] not in self.tokens:
            status, body = Api(self.http_url).request(
                "POST", "/api/v1/auth/token/", {"username": user[0], "password": user[1]}
            )
            if status != 200:
                raise ApiError(f"token for {user[0]}: {status} {body}")
            self.tokens[user[0]] = body["token"]
        return Api(self.http_url, self.tokens[user[0]])

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> ConsoleStack:
        self._start_redis()
        self.manage("migrate", "--noinput")
        self._create_users()
        self._start_daphne()
        self._start_celery()
        return self

    def manage(self, *args: str, timeout: float = 120) -> str:
        """``manage.py`` with the stack's environment; its output (raises on failure)."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def _start_redis(self) -> None:
        cmd = [
            REDIS_SERVER,
            "--port",
            str(self.redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.root),
        ]
        svc = self._spawn("redis", cmd)
        wait_for_port(self.redis_port, proc=svc.proc, log_path=svc.log_path)

    def _create_users(self) -> None:
        script = (
            "from django.contrib.auth.models import Group, User\n"
            "ops, _ = Group.objects.get_or_create(name='operators')\n"
            f"op = User.objects.create_user({OPERATOR[0]!r}, password={OPERATOR[1]!r})\n"
            "op.groups.add(ops)\n"
            f"User.objects.create_user({VIEWER[0]!r}, password={VIEWER[1]!r})\n"
        )
        self.manage("shell", "-c", script)

    def _start_daphne(self) -> None:
        cmd = [
            str(VENV_BIN / "daphne"),
            "-b",
            "127.0.0.1",
            "-p",
            str(self.http_port),
            *tls_endpoint_options(self.tls_ports, self.tls_endpoints),
            "console.asgi:application",
        ]
        svc = self._spawn("daphne", cmd)
        wait_for_port(self.http_port, timeout=30, proc=svc.proc, log_path=svc.log_path)
        for port in self.tls_ports:
            wait_for_port(port, timeout=15, proc=svc.proc, log_path=svc.log_path)
        self.wait(lambda: Api(self.http_url).get("/healthz")[0] == 200, 15, "daphne health")

    def _start_celery(self) -> None:
        cmd = [
            str(VENV_BIN / "celery"),
            "-A",
            "console",
            "worker",
            "-B",
            "--concurrency",
            "2",
            "-l",
            "info",
            "-s",
            str(self.root / "celerybeat-schedule"),
            "-n",
            f"console-{self.http_port}@%h",
        ]
        svc = self._spawn("celery", cmd)
        self.wait(lambda: " ready." in svc.log_text(), 60, "celery worker ready")

    def _spawn(self, name: str, cmd: list[str]) -> Service:
        svc = Service(name, cmd, self.env, self.logs / f"{name}.log")
        self.services[name] = svc
        return svc

    def start_cluster(
        self,
        primaries: int = 3,
        heartbeat: dict[str, float] | None = None,
        secondaries: int = 0,
    ) -> Cluster:
        """``primaries`` then ``secondaries`` brokers linked to the console
        (``--console`` + the token)."""
        (self.root / "cluster").mkdir(exist_ok=True)
        beat = {**HEARTBEAT, **(heartbeat or {})}
        self.cluster = Cluster(
            self.root / "cluster",
            primaries,
            secondaries,
            interval=beat["interval"],
            timeout=beat["timeout"],
            open_timeout=beat["open_timeout"],
        )
        for index in range(primaries + secondaries):
            self.start_broker(index)
            time.sleep(0.15)  # started oldest first: seniority follows the index
        return self.cluster

    def start_broker(self, index: int, token: str | None = None) -> BrokerProcess:
        """(Re)start broker ``index`` on its own port, linked to the console."""
        assert self.cluster is not None
        link = ["--console", self.link_url, f"--console-token={token or self.broker_token}"]
        process = self.cluster.start(index, extra=link).process
        assert process is not None
        return process

    def broker_name(self, index: int) -> str:
        """The console's name of broker ``index``: its callback ``host:port``."""
        assert self.cluster is not None
        return f"127.0.0.1:{self.cluster.ports[index]}"

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
        for name in ("celery", "daphne", "redis"):
            svc = self.services.get(name)
            if svc is not None:
                svc.stop()

    # -- helpers ------------------------------------------------------------------------------

    def check_alive(self) -> None:
        for svc in self.services.values():
            if not svc.alive():
                raise AssertionError(
                    f"{svc.name} exited with {svc.proc.returncode}:\n{svc.log_text()[-4000:]}"
                )

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll ``predicate`` until truthy; exceptions count as not yet."""
        return eventually(
            predicate,
            timeout,
            what,
            interval=0.1,
            tolerate=(OSError, AssertionError, KeyError, ValueError, TypeError, IndexError),
            each=self.check_alive,
        )

    def log_tails(self, lines: int = 60) -> str:
        parts = []
        paths = sorted(self.logs.glob("*.log"))
        if self.cluster is not None:
            paths += [p.log_path for p in self.cluster.servers.values()]
        for path in paths:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"===== {path} =====\n" + "\n".join(tail))
        return "\n".join(parts)


def tls_endpoint_options(ports: Sequence[int], files: Sequence[tuple[Path, Path]]) -> list[str]:
    """Daphne's ``-e`` options for TLS on loopback: one Twisted ``ssl:`` endpoint per
    port, with its certificate and key files (``:`` and ``\\`` escaped, as
    endpoint strings require)."""

    def escaped(path: Path) -> str:
        return str(path).replace("\\", "\\\\").replace(":", "\\:")

    options: list[str] = []
    for port, (certfile, keyfile) in zip(ports, files, strict=True):
        endpoint = (
            f"ssl:{port}:interface=127.0.0.1:privateKey={escaped(keyfile)}"
            f":certKey={escaped(certfile)}"
        )
        options += ["-e", endpoint]
    return options


@pytest.fixture(scope="module")
def console_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleStack]:
    """A running console (no brokers yet) for one test module; logs shown if a test failed."""
    stack = ConsoleStack(tmp_path_factory.mktemp("console"))
    failed_before = request.session.testsfailed
    try:
        stack.start()
    except BaseException:
        print_logs(request, stack)
        stack.stop()
        raise
    try:
        yield stack
    finally:
        stack.stop()
        if request.session.testsfailed > failed_before:
            print_logs(request, stack)


def print_logs(request: pytest.FixtureRequest, stack: ConsoleStack) -> None:
    """Write the processes' log tails straight to the terminal (past output capture)."""
    text = f"\nconsole stack under {stack.root}\n{stack.log_tails()}\n"
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text)
    else:
        sys.stderr.write(text)
