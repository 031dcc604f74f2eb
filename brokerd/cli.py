"""The ``brokerd`` command line: run the broker, or a helper subcommand."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

import brokerd

EPILOG = """\
subcommands:
  brokerd ctl --data-dir DIR status [--json] | dump | root enable|disable
                               control a running broker (see brokerd ctl --help)
  brokerd hash-password        read a password and print its hash for brokerd.toml

console link: with --console URL the broker keeps a websocket open to the
console and sends its status every heartbeat; it works fully without one.
The token is sent as "Authorization: Bearer TOKEN"; prefer the environment
variable ROOKERY_CONSOLE_TOKEN so it does not show in the process list; on
the command line write --console-token=TOKEN.

signals: SIGUSR1 full state dump, SIGUSR2 one-line state, SIGTERM graceful
shutdown (clients get connection.close 320), SIGHUP re-read --config.
With --workers N the parent passes SIGHUP, SIGUSR1 and SIGUSR2 to every
worker, and SIGTERM stops them all; brokerd ctl --data-dir DATA_DIR answers
for every worker (deploy/runbooks/host-workers.md).
"""


CONSOLE_TOKEN_ENV = "ROOKERY_CONSOLE_TOKEN"
CONSOLE_CAFILE_ENV = "ROOKERY_CONSOLE_CAFILE"


def console_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the console endpoint, or None if it can."""
    from websockets.exceptions import InvalidURI
    from websockets.uri import parse_uri

    if not url.startswith(("ws://", "wss://")):
        return f"--console {url!r}: the URL must start with ws:// or wss://"
    try:
        parse_uri(url)
    except (InvalidURI, ValueError) as exc:  # urllib raises ValueError for a bad port
        return f"--console {url!r}: {exc}"
    return None


def console_cafile_problem(
    url: str, cafile: Path | None, source: str = "--console-cafile"
) -> str | None:
    """Why ``cafile`` cannot verify the console at ``url`` (a ws:// URL, a file that
    is missing or holds no CA), or None: refused at startup, not at the first link."""
    from brokerd.consolelink.tls import ConsoleTLSError, client_context

    try:
        client_context(url, cafile)
    except ConsoleTLSError as exc:
        return f"{source}: {exc}"
    return None


#: options whose value may start with '-' (a token): "--opt VALUE" is read as "--opt=VALUE"
VALUE_OPTIONS = ("--console-token",)


def join_option_values(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """Glue ``--opt VALUE`` into ``--opt=VALUE`` for ``options``.

    argparse takes a separate value that starts with '-' for an option of its
    own ("expected one argument"); a random token does so one time in 64.
    The ``=`` form is always safe, and this makes the spaced form safe too."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--":
            out.append(arg)
            out.extend(args)
            break
        if arg in options:
            value = next(args, None)
            out.append(arg if value is None else f"{arg}={value}")
        else:
            out.append(arg)
    return out


def _port(value: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", value):  # int() would also take '١٢' or ' 5672 '
        raise argparse.ArgumentTypeError(f"port {value!r} is not a number")
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range 0..65535")
    return port


def _plain_port(value: str) -> int | None:
    """``--port``: a port, or ``off`` for no plain listener (TLS only)."""
    return None if value == "off" else _port(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brokerd",
        description=f"{brokerd.PRODUCT} brokerd {brokerd.__version__}: "
        "an AMQP 0-9-1 message broker.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"brokerd {brokerd.__version__}")
    parser.add_argument(
        "--bind", default="0.0.0.0", help="address to listen on for AMQP clients (default 0.0.0.0)"
    )
    parser.add_argument(
        "--port",
        type=_plain_port,
        default=5672,
        help="AMQP port (default 5672; 0 picks a free port; 'off': no plain listener, "
        "clients use --tls-port only)",
    )
    parser.add_argument(
        "--tls-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="AMQPS port (5671 by convention; 0 picks a free port), served with the "
        "[tls] table of the --config file (certfile, keyfile, cafile, verify); "
        "default: no TLS listener. SIGHUP reloads the certificates",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path("var/brokerd"),
        help="directory for the broker's state (default var/brokerd)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="brokerd.toml with users, vhosts, permissions and limits "
        "(default: DATA_DIR/brokerd.toml if it exists, else guest/guest from loopback only)",
    )
    parser.add_argument(
        "--cluster",
        type=Path,
        default=None,
        metavar="FILE",
        help="the shared cluster file (TOML: name, vhost, secret, known_hosts, heartbeat); "
        "without it the broker runs standalone",
    )
    parser.add_argument(
        "--type",
        choices=["primary", "secondary"],
        default="primary",
        help="this server's partition in the cluster (default primary); "
        "secondaries never vote or become root",
    )
    parser.add_argument(
        "--join",
        default=None,
        metavar="HOST:PORT",
        help="join a running cluster through any member's address: this primary asks the "
        "cluster's root to admit it (with the cluster file's secret) and becomes a member "
        "without any restart; see also the cluster file's [discovery] table",
    )
    parser.add_argument(
        "--enable-fault-injection",
        action="store_true",
        help="allow 'brokerd ctl fault cut-link/heal' (tests only)",
    )
    parser.add_argument(
        "--console",
        default=None,
        metavar="URL",
        help="the console's broker endpoint, ws:// or wss:// "
        "(e.g. ws://127.0.0.1:8000/ws/brokers/); without it no console link is kept",
    )
    parser.add_argument(
        "--console-token",
        default=None,
        metavar="TOKEN",
        help="token the console expects (its CONSOLE_BROKER_TOKEN); write it as "
        "--console-token=TOKEN (any token, even one starting with '-'); "
        f"default, and preferred: the environment variable {CONSOLE_TOKEN_ENV}",
    )
    parser.add_argument(
        "--console-cafile",
        type=Path,
        default=None,
        metavar="FILE",
        help="CA bundle (PEM) that verifies the console's certificate on a wss:// --console "
        "(always verified: certificate required, host name checked, TLS 1.2 or later; "
        "re-read at each reconnect); default: the environment variable "
        f"{CONSOLE_CAFILE_ENV}, else the system's trust store; refused with ws://",
    )
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://METRICS_BIND:PORT/metrics "
        "(default: off; names as RabbitMQ's Prometheus plugin where they match)",
    )
    parser.add_argument(
        "--metrics-bind",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address the metrics endpoint listens on (default 127.0.0.1, loopback only)",
    )
    parser.add_argument(
        "--workers",
        default="1",
        metavar="N",
        help="worker processes on this host, 1..256 or 'auto' (one per core); default 1. "
        "With N > 1 a supervising parent runs N brokerd workers that share --port and "
        "--tls-port (SO_REUSEPORT), link over Unix sockets as a local cluster, and "
        "place queues balanced over them; clients see one broker. Each keeps its state "
        "in DATA_DIR/worker-K",
    )
    # set by the parent of --workers on each worker's command line, never by hand
    parser.add_argument("--worker-of", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--host-address", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--host-workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--metrics-socket", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--link-ports", default="", help=argparse.SUPPRESS)
    parser.add_argument("--host-id", default="", help=argparse.SUPPRESS)
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log verbosity (default info); logs are one line per event on stderr",
    )
    return parser


def setup_logging(level: str, worker: int | None = None) -> None:
    """One line per event on stderr; a worker of ``--workers`` names itself in each."""
    who = "" if worker is None else f"worker-{worker} "
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format=f"%(asctime)s %(levelname)s {who}%(name)s: %(message)s",
        stream=sys.stderr,
    )
    # aiormq logs every failed link attempt as an ERROR with a traceback;
    # brokerd.cluster.link already logs one line per link state change
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
    # confirm marks are for fault drills (``--enable-fault-injection`` turns them on)
    logging.getLogger("brokerd.cluster.confirms").setLevel(logging.WARNING)


def hash_password_main(argv: list[str]) -> int:
    from brokerd.model.auth import hash_password

    parser = argparse.ArgumentParser(
        prog="brokerd hash-password", description="Print a password hash for brokerd.toml."
    )
    parser.add_argument("--stdin", action="store_true", help="read the password from stdin")
    args = parser.parse_args(argv)
    password = sys.stdin.readline().rstrip("\n") if args.stdin else getpass.getpass()
    if not password:
        print("brokerd hash-password: empty password", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "hash-password":
        return hash_password_main(argv[1:])
    if argv and argv[0] == "ctl":
        from brokerd.ctl import main as ctl_main

        return ctl_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(join_option_values(argv, VALUE_OPTIONS))
    from brokerd.host.workers import parse_workers

    try:
        workers = parse_workers(args.workers)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    worker = args.worker_index if args.worker_of is not None else None
    setup_logging(args.log_level, worker)
    if args.enable_fault_injection and args.log_level in ("debug", "info"):
        # a fault drill's server: its confirm marks feed the harness's two-owner check
        logging.getLogger("brokerd.cluster.confirms").setLevel(logging.INFO)
    from brokerd.server.app import ServerOptions, run

    config = args.config
    if config is None and (args.data_dir / "brokerd.toml").exists():
        config = args.data_dir / "brokerd.toml"
    if args.cluster is None and (
        args.type != "primary" or args.enable_fault_injection or args.join
    ):
        need = "--type, --join and --enable-fault-injection need --cluster"
        print(f"brokerd: {need}", file=sys.stderr)
        return 2
    if args.join is not None:
        from brokerd.cluster.config import ClusterConfigError, parse_host

        try:
            args.join = str(parse_host(args.join, "--join"))
        except ClusterConfigError as exc:
            print(f"brokerd: {exc}", file=sys.stderr)
            return 2
        if args.type != "primary" or workers > 1:
            print("brokerd: --join is for a primary of one worker", file=sys.stderr)
            return 2
    if args.metrics_bind != "127.0.0.1" and args.metrics_port is None:
        print("brokerd: --metrics-bind needs --metrics-port", file=sys.stderr)
        return 2
    if args.port is None and args.tls_port is None:
        print("brokerd: --port off needs --tls-port (no listener at all)", file=sys.stderr)
        return 2
    token = args.console_token
    if token is None:
        token = os.environ.get(CONSOLE_TOKEN_ENV, "")
    cafile = args.console_cafile
    if cafile is None and os.environ.get(CONSOLE_CAFILE_ENV):
        cafile = Path(os.environ[CONSOLE_CAFILE_ENV])
    if args.console is not None:
        problem = console_url_problem(args.console)
        if problem is None and not token:
            problem = f"--console needs a token (--console-token or {CONSOLE_TOKEN_ENV})"
        if problem is None:
            source = "--console-cafile" if args.console_cafile else CONSOLE_CAFILE_ENV
            problem = console_cafile_problem(args.console, cafile, source)
        if problem is not None:
            print(f"brokerd: {problem}", file=sys.stderr)
            return 2
    elif args.console_token is not None:
        print("brokerd: --console-token needs --console", file=sys.stderr)
        return 2
    elif args.console_cafile is not None:
        print("brokerd: --console-cafile needs --console", file=sys.stderr)
        return 2
    if workers > 1 and args.worker_of is None:
        from brokerd.host.main import run_host

        return run_host(args, workers, config, token, cafile)
    if args.worker_of is None:
        from brokerd.host.local import state_problem

        problem = state_problem(args.data_dir, 1)
        if problem is not None:
            print(f"brokerd: {problem}", file=sys.stderr)
            return 2
    host: dict[str, Any] = {}
    if args.worker_of is not None:
        from brokerd.host.local import HostLayout

        layout = HostLayout(args.worker_of, args.host_workers)
        host = {
            "reuse_port": True,
            "link_socket": layout.link_socket(args.worker_index),
            "host_address": args.host_address,
            "host_state": layout.state_file,
            "host_workers": args.host_workers,
            "host_share": layout.shared_file,
            "worker_index": args.worker_index,
            "metrics_socket": args.metrics_socket,
            "link_ports": tuple(int(p) for p in args.link_ports.split(",") if p),
            "host_id": args.host_id,
        }
    return run(
        ServerOptions(
            bind=args.bind,
            port=args.port,
            tls_port=args.tls_port,
            data_dir=args.data_dir,
            config_file=config,
            cluster_file=args.cluster,
            server_type=args.type,
            join=args.join,
            fault_injection=args.enable_fault_injection,
            console_url=args.console,
            console_token=token,
            console_cafile=cafile,
            metrics_port=args.metrics_port,
            metrics_bind=args.metrics_bind,
            **host,
        )
    )
