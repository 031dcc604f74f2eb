"""``make run`` for real: deploy/quickstart.py with its own DATA_DIR and free ports.

The first run must bring up Redis, the console, four brokers and Celery, let the
admin log in with the generated password, and stop every process on SIGINT with
status 0. The second run must reuse the password, token and cluster file, restart
a broker killed with SIGKILL (same port and data, back in the console) while the
rest keeps running, and give up with status 1 when that broker keeps crashing.
"""

from __future__ import annotations

import contextlib
import json
import signal
import ssl
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pika
import psutil
import pytest

from tests.brokerd_process import free_port
from tests.console_env import CONSOLE_SETTINGS_ENV, environ_without

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(150)]

REPO = Path(__file__).resolve().parents[2]

# The caller's console and admin settings must not leak into the quickstart under test.
LEAKY_ENV = (*CONSOLE_SETTINGS_ENV, "ROOKERY_ADMIN_USER", "ROOKERY_ADMIN_PASSWORD")


class Quickstart:
    """deploy/quickstart.py as a subprocess whose output is collected line by line."""

    def __init__(
        self, data_dir: Path, console_port: int, broker_ports: list[int], *, tls: bool = False
    ) -> None:
        self.console_port = console_port
        self.broker_ports = broker_ports
        #: ROOKERY_TLS=1: the console is https://, verified against DATA_DIR/tls/ca.pem
        self.tls_dir = data_dir / "tls" if tls else None
        env = environ_without(LEAKY_ENV)
        env.update(
            DATA_DIR=str(data_dir),
            ROOKERY_CONSOLE_PORT=str(console_port),
            ROOKERY_BROKER_PORTS=",".join(map(str, broker_ports)),
            ROOKERY_REDIS_PORT=str(free_port()),
            NO_COLOR="1",
            ROOKERY_TLS="1" if tls else "0",
        )
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "deploy/quickstart.py"],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            # its own session: whatever it or its children signal as a group cannot
            # reach this pytest worker (the test signals it by pid)
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_running(self, timeout: float = 75.0) -> None:
        deadline = time.monotonic() + timeout
        # the banner's last line: its lines reach ``output`` one at a time (the reader
        # thread), so waiting for its first one left the rest to a race
        while "Ctrl-C stops everything." not in self.output:
            if self.proc.poll() is not None:
                pytest.fail(f"quickstart exited {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"quickstart not running after {timeout} s:\n{self.tail()}")
            time.sleep(0.2)

    def children(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def wait_exit(self, timeout: float = 45.0) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"quickstart still running {timeout} s after the signal:\n{self.tail()}")
        self.reader.join(5)
        return code

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.lines[-lines:])

    def url(self, path: str) -> str:
        scheme = "https" if self.tls_dir is not None else "http"
        return f"{scheme}://127.0.0.1:{self.console_port}{path}"

    def context(self) -> ssl.SSLContext | None:
        """Trust in the quickstart's throwaway CA (ROOKERY_TLS=1), else None."""
        if self.tls_dir is None:
            return None
        return ssl.create_default_context(cafile=str(self.tls_dir / "ca.pem"))

    def http(self, path: str, form: dict[str, str] | None = None) -> tuple[int, bytes]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        try:
            with urllib.request.urlopen(
                self.url(path), data=data, timeout=10, context=self.context()
            ) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def wait_line(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline:
                pytest.fail(f"no {text!r} after {timeout} s:\n{self.tail()}")
            time.sleep(0.1)

    def broker(
        self, port: int, other_than: int = 0, timeout: float = 30.0
    ) -> psutil.Process | None:
        """The brokerd process serving ``port`` (by its command line), other than
        ``other_than``; None once the quickstart gives up or exits."""
        deadline = time.monotonic() + timeout
        while True:
            for child in psutil.Process(self.proc.pid).children():
                with contextlib.suppress(psutil.NoSuchProcess):
                    argv = child.cmdline()
                    if "brokerd" in argv and child.pid != other_than and _port_of(argv) == port:
                        return child
            if "giving up" in self.output or self.proc.poll() is not None:
                return None
            if time.monotonic() > deadline:
                pytest.fail(f"no brokerd process for port {port}:\n{self.tail()}")
            time.sleep(0.05)

    def kill_leftovers(self) -> None:
        """After a failed assertion: never leave processes behind."""
        procs = []
        if self.proc.poll() is None:
            procs = self.children()
            self.proc.kill()
        for child in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def _port_of(argv: list[str]) -> int | None:
    with contextlib.suppress(ValueError, IndexError):
        return int(argv[argv.index("--port") + 1])
    return None


def gone(procs: list[psutil.Process], timeout: float = 10.0) -> list[psutil.Process]:
    """The processes still alive (zombies count as gone) after ``timeout``."""
    deadline = time.monotonic() + timeout
    alive = procs
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.1)
    return alive


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def api_token(qs: Quickstart, username: str, password: str) -> tuple[int, dict]:
    status, body = qs.http("/api/v1/auth/token/", {"username": username, "password": password})
    return status, json.loads(body or b"{}")


def linked_brokers(qs: Quickstart, token: str, want: int = 4, timeout: float = 30.0) -> set[str]:
    """Names of the brokers the REST API shows as connected, once ``want`` are."""
    request = urllib.request.Request(
        qs.url("/api/v1/brokers/"), headers={"Authorization": f"Token {token}"}
    )
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(request, timeout=10, context=qs.context()) as resp:
            brokers = json.load(resp)["results"]
        names = {b["name"] for b in brokers if b["connected"]}
        if len(names) >= want or time.monotonic() > deadline:
            return names
        time.sleep(0.5)


def broker_record(qs: Quickstart, token: str, name: str) -> dict:
    """The REST API's record of the broker called ``name``."""
    request = urllib.request.Request(
        qs.url(f"/api/v1/brokers/?name={urllib.parse.quote(name)}"),
        headers={"Authorization": f"Token {token}"},
    )
    with urllib.request.urlopen(request, timeout=10, context=qs.context()) as resp:
        (record,) = [b for b in json.load(resp)["results"] if b["name"] == name]
    return record


def amqp_answers(port: int) -> None:
    params = pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest")
    )
    conn = pika.BlockingConnection(params)
    conn.channel().queue_declare("", exclusive=True)
    conn.close()


@pytest.mark.timeout(300)
def readable_by_others(data_dir: Path) -> list[str]:
    """Files and directories under DATA_DIR that anyone but their owner may read,
    write or enter (issue 46: the database, its journal files, tokens, keys and
    certificates are 0600 in 0700 directories; make run creates everything so)."""
    found = []
    for path in [data_dir, *data_dir.rglob("*")]:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue  # a temporary file gone meanwhile
        if not stat.S_ISLNK(mode) and not stat.S_ISSOCK(mode) and mode & 0o077:
            found.append(f"{path.relative_to(data_dir.parent)} {stat.S_IMODE(mode):o}")
    return found


def test_quickstart_runs_everything_and_stops_cleanly(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    console_port = free_port()
    broker_ports = [free_port() for _ in range(4)]

    # -- first run: fresh DATA_DIR --------------------------------------------------------
    qs = Quickstart(data_dir, console_port, broker_ports)
    try:
        qs.wait_running()
        password_file = data_dir / "admin-password"
        password = password_file.read_text().strip()
        assert password_file.stat().st_mode & 0o777 == 0o600
        assert password in qs.output  # printed once, at this first run
        assert (data_dir / "console-broker-token").stat().st_mode & 0o777 == 0o600
        for secret in ("console.sqlite3", "console.sqlite3-wal", "secret_key", "cluster.toml"):
            assert (data_dir / secret).stat().st_mode & 0o777 == 0o600, secret
        assert readable_by_others(data_dir) == []

        status, body = qs.http("/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        status, body = qs.http("/accounts/login/")
        assert status == 200 and b'name="password"' in body
        status, token = api_token(qs, "admin", password)
        assert status == 200 and token.get("token"), token
        status, _ = api_token(qs, "admin", password + "-wrong")
        assert status == 401
        # The four brokers reach the console over the link, with the generated token.
        assert linked_brokers(qs, token["token"]) == {f"127.0.0.1:{p}" for p in broker_ports}
        status, body = qs.http("/static/vendor/htmx.min.js")  # from node_modules
        assert status == 200 and b"htmx" in body

        for port in broker_ports:
            amqp_answers(port)

        children = qs.children()
        names = " ".join(" ".join(p.cmdline()) for p in children)
        assert "redis-server" in names and "runserver" in names and "celery" in names
        assert sum("brokerd" in " ".join(p.cmdline()) for p in children) == 4

        qs.proc.send_signal(signal.SIGINT)
        assert qs.wait_exit() == 0, qs.tail()
        assert gone(children) == []
        assert "everything stopped" in qs.output
        # The broker links stayed up: no consumer crashed (e.g. on a Redis socket timeout).
        assert "Exception inside application" not in qs.output
    finally:
        qs.kill_leftovers()

    token_before = (data_dir / "console-broker-token").read_text()
    cluster_before = (data_dir / "cluster.toml").read_text()

    # -- second run: reuses the state; a killed broker is restarted, a crash loop is not --
    qs = Quickstart(data_dir, console_port, broker_ports)
    seen: list[psutil.Process] = []
    try:
        qs.wait_running()
        assert password not in qs.output  # not printed again
        # but its place is, in the closing summary too (the file still holds it)
        assert f"(user 'admin', password in {password_file})" in qs.output
        assert password_file.read_text().strip() == password
        assert (data_dir / "console-broker-token").read_text() == token_before
        assert (data_dir / "cluster.toml").read_text() == cluster_before
        status, token = api_token(qs, "admin", password)
        assert status == 200 and token.get("token"), token
        assert len(linked_brokers(qs, token["token"])) == 4

        port = broker_ports[2]  # primary3
        name = f"127.0.0.1:{port}"
        spid_before = broker_record(qs, token["token"], name)["spid"]
        victim = qs.broker(port)
        assert victim is not None
        seen = qs.children()
        others = {p.pid for p in psutil.Process(qs.proc.pid).children()} - {victim.pid}
        victim.kill()
        qs.wait_line("primary3 exited (killed by SIGKILL); restarting in 1 s (restart 1)")
        reborn = qs.broker(port, other_than=victim.pid)
        assert reborn is not None
        seen.append(reborn)
        qs.wait_line("primary3 is ready again (restart 1)")
        amqp_answers(port)
        status, body = qs.http("/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        # back in the console: connected, as the new process (another spid)
        deadline = time.monotonic() + 30
        while True:
            record = broker_record(qs, token["token"], name)
            if record["connected"] and record["spid"] != spid_before:
                break
            assert time.monotonic() < deadline, (record, qs.tail())
            time.sleep(0.5)
        assert linked_brokers(qs, token["token"]) == {f"127.0.0.1:{p}" for p in broker_ports}
        # nobody else was stopped or restarted meanwhile
        assert others <= {p.pid for p in psutil.Process(qs.proc.pid).children()}

        # A crash loop: killed as soon as it is started again, until make run gives up
        # (five exits within 60 s, the first kill's included; a sixth should the first
        # have left the window on a slow machine).
        broker: psutil.Process | None = reborn
        kills = 1
        while broker is not None:
            assert kills < 7, qs.tail()
            with contextlib.suppress(psutil.NoSuchProcess):
                broker.kill()
            kills += 1
            broker = qs.broker(port, other_than=broker.pid)
            if broker is not None:
                seen.append(broker)
        seen += qs.children() if qs.proc.poll() is None else []
        assert qs.wait_exit() == 1, qs.tail()
        assert "primary3 crashed 5 times in 60 s: giving up; its last lines:" in qs.output
        assert "stopped: primary3 crashed 5 times in 60 s: giving up" in qs.output
        assert "primary3 exited (killed by SIGKILL); restarting in" in qs.output
        assert gone(seen) == []
    finally:
        qs.kill_leftovers()


def test_quickstart_over_tls(tmp_path: Path) -> None:
    """ROOKERY_TLS=1: a throwaway CA, AMQPS only on the broker ports, TLS links, the
    console on https:// and the brokers linked to it over wss://."""
    data_dir = tmp_path / "var"
    console_port = free_port()
    broker_ports = [free_port() for _ in range(4)]
    qs = Quickstart(data_dir, console_port, broker_ports, tls=True)
    try:
        qs.wait_running()
        tls_dir = data_dir / "tls"
        assert (tls_dir / "server.key").stat().st_mode & 0o777 == 0o600
        assert readable_by_others(data_dir) == []
        assert f"trust {tls_dir / 'ca.pem'}" in qs.output
        status, body = qs.http("/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        password = (data_dir / "admin-password").read_text().strip()
        status, token = api_token(qs, "admin", password)
        assert status == 200 and token.get("token"), token
        # the brokers reach the console over wss://, verified against the throwaway CA
        assert linked_brokers(qs, token["token"]) == {f"127.0.0.1:{p}" for p in broker_ports}
        cluster = (data_dir / "cluster.toml").read_text()
        assert 'links = "required"' in cluster
        context = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
        context.load_cert_chain(tls_dir / "client.pem", tls_dir / "client.key")
        for port in broker_ports:
            # the client certificate (CN guest) logs in with EXTERNAL
            params = pika.ConnectionParameters(
                "127.0.0.1",
                port,
                credentials=pika.credentials.ExternalCredentials(),
                ssl_options=pika.SSLOptions(context, server_hostname="127.0.0.1"),
                connection_attempts=1,
            )
            conn = pika.BlockingConnection(params)
            conn.channel().queue_declare("", exclusive=True)
            conn.close()
        # nothing plain answers on a broker port
        plain = pika.ConnectionParameters(
            "127.0.0.1", broker_ports[0], connection_attempts=1, socket_timeout=5
        )
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(plain)
        children = qs.children()
        qs.proc.send_signal(signal.SIGINT)
        assert qs.wait_exit() == 0, qs.tail()
        assert gone(children) == []
        assert "Exception inside application" not in qs.output
    finally:
        qs.kill_leftovers()
