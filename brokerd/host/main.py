"""``brokerd --workers N`` with N > 1: set the host up, then supervise its workers."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket
import sys
from pathlib import Path

from brokerd.cli import CONSOLE_TOKEN_ENV
from brokerd.cluster.config import ClusterConfigError, SocketPath, load_cluster_config
from brokerd.host.local import (
    HostLayout,
    HostSetupError,
    WorkerCommand,
    hold_link_ports,
    hold_port,
    prepare,
    state_problem,
)
from brokerd.host.metrics import MetricsGateway
from brokerd.host.supervisor import Supervisor
from brokerd.host.workers import reuseport_problem
from brokerd.server.hostshare import clear_worker
from brokerd.server.listeners import host_name

log = logging.getLogger("brokerd.host")


def not_yet(args: argparse.Namespace) -> str | None:
    """What a host of several workers does not take yet, in a cluster of hosts:
    secondaries (their workers would not link to each other) and links over TLS
    (a certificate names one address; each worker has its own link port)."""
    if args.cluster is None:
        return None
    if args.type != "primary":
        return "--type secondary is not supported with --workers above 1 yet: run --workers 1"
    try:
        cluster = load_cluster_config(args.cluster)
    except (OSError, ClusterConfigError) as exc:
        return f"--cluster {args.cluster}: {exc}"
    if cluster.tls is not None:
        return (
            "a cluster whose links run over TLS does not take --workers above 1 yet: "
            "run --workers 1"
        )
    if any(isinstance(host, SocketPath) for host in cluster.known_hosts):
        return "--cluster: a cluster of hosts names its hosts by host:port, not by socket"
    return None


def run_host(
    args: argparse.Namespace,
    workers: int,
    config: Path | None,
    console_token: str = "",
    console_cafile: Path | None = None,
) -> int:
    """Resolve the host's ports and files, then run the supervising parent. With
    ``--console`` each worker links to the console as its own broker, named
    ``worker-K@HOST:PORT`` (the console groups them under the host); the token
    reaches them in their environment, never on a command line."""
    problem = (
        reuseport_problem() or not_yet(args) or state_problem(args.data_dir.resolve(), workers)
    )
    if problem is not None:
        print(f"brokerd: {problem}", file=sys.stderr)
        return 2
    layout = HostLayout(args.data_dir.resolve(), workers)
    held: list[socket.socket] = []
    try:
        prepare(layout, local_cluster=args.cluster is None)
        links: list[socket.socket] = []
        if args.cluster is not None:
            links = hold_link_ports(layout, args.bind)
            held += links
        port, tls_port = args.port, args.tls_port
        if port == 0:
            held.append(hold_port(args.bind, 0))
            port = held[-1].getsockname()[1]
        if tls_port == 0:
            held.append(hold_port(args.bind, 0))
            tls_port = held[-1].getsockname()[1]
    except HostSetupError as exc:
        for sock in held:
            sock.close()
        print(f"brokerd: {exc}", file=sys.stderr)
        return 2
    command = WorkerCommand(
        layout=layout,
        bind=args.bind,
        port=port,
        tls_port=tls_port,
        config=config.resolve() if config is not None else None,
        log_level=args.log_level,
        host_address=f"{host_name(args.bind)}:{port if port is not None else tls_port}",
        metrics=args.metrics_port is not None,
        console=args.console,
        console_cafile=console_cafile.resolve() if console_cafile is not None else None,
        cluster=args.cluster.resolve() if args.cluster is not None else None,
        link_ports=tuple(sock.getsockname()[1] for sock in links),
        host_id=secrets.token_hex(8),
        fault_injection=args.enable_fault_injection,
    )
    env = dict(os.environ)
    if args.console is not None:
        env[CONSOLE_TOKEN_ENV] = console_token
    gateway = None
    if args.metrics_port is not None:
        try:
            gateway = MetricsGateway(
                args.metrics_bind,
                args.metrics_port,
                lambda: [layout.metrics_socket(k) for k in range(workers)],
            )
        except OSError as exc:
            for sock in held:
                sock.close()
            print(
                f"brokerd: cannot listen for metrics on {args.metrics_bind}:"
                f"{args.metrics_port}: {exc.strerror}",
                file=sys.stderr,
            )
            return 1
        gateway.start()
    log.info(
        "host pid=%d workers=%d bind=%s port=%s tls_port=%s data_dir=%s%s",
        os.getpid(),
        workers,
        args.bind,
        "off" if port is None else port,
        "off" if tls_port is None else tls_port,
        layout.data_dir,
        f" cluster={args.cluster} link_ports={','.join(map(str, command.link_ports))}"
        if args.cluster is not None
        else "",
    )
    try:
        return Supervisor(
            workers,
            command,
            state_file=layout.state_file,
            env=env,
            on_exit=lambda index: clear_worker(layout.shared_file, workers, index),
        ).run()
    finally:
        if gateway is not None:
            gateway.stop()
        for sock in held:
            sock.close()
