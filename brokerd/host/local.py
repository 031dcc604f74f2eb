"""One host as a local cluster: what ``brokerd --workers N`` sets up before it
supervises its workers.

The parent resolves what every worker must agree on, then starts N ordinary
brokerd processes that differ only in their index:

- the client ports: a port of 0 is chosen here, once, and held by the parent
  (a bound socket with ``SO_REUSEPORT`` that never listens), so every worker
  binds the same one and the kernel spreads connections over them;
- the local cluster file (``DATA_DIR/host/cluster.toml``, mode 0600): a
  secret made for this host, the workers' link sockets as known hosts
  (``unix:DATA_DIR/host/worker-K.sock``), queues placed ``balanced``
  because which worker a connection reaches is chance, and classic queues by
  default, as a single RabbitMQ node has;
- each worker's own data directory, ``DATA_DIR/worker-K``, with its journal
  and control socket.

In a cluster of hosts (``--cluster FILE``) the workers take that file instead
of the local one, and each gets a TCP link port of its own, where the other
hosts' workers reach it (``cluster/hostgroup.py``). The ports are chosen at the
first start and kept in ``DATA_DIR/host/links.json``: quorum groups and a
recovered queue's home name workers by those addresses, so a restarted host
must answer at the same ones.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from brokerd.cluster.config import MAX_SOCKET_PATH
from brokerd.cluster.hostgroup import worker_socket
from brokerd.server.handoff import handoff_path

HOST_DIR = "host"
CLUSTER_NAME = "cluster.toml"


class HostSetupError(Exception):
    """The host cannot run its workers; the message says why."""


@dataclass(frozen=True)
class HostLayout:
    """Where one host keeps its shared and per-worker state."""

    data_dir: Path
    workers: int

    @property
    def host_dir(self) -> Path:
        return self.data_dir / HOST_DIR

    @property
    def cluster_file(self) -> Path:
        return self.host_dir / CLUSTER_NAME

    @property
    def state_file(self) -> Path:
        """The supervisor's state (``supervisor.py``; a worker reads ``stopping``)."""
        return self.host_dir / "state.json"

    @property
    def shared_file(self) -> Path:
        """Connections and failed logins, counted by every worker (``server/hostshare.py``)."""
        return self.host_dir / "shared"

    def worker_dir(self, index: int) -> Path:
        return self.data_dir / f"worker-{index}"

    def link_socket(self, index: int) -> Path:
        return worker_socket(self.host_dir, index)

    def handoff_socket(self, index: int) -> Path:
        """Where worker K takes connections its siblings hand it (``server/handoff.py``,
        which finds it beside the link socket)."""
        return handoff_path(self.link_socket(index))

    @property
    def links_file(self) -> Path:
        """The workers' TCP link ports in a cluster of hosts, kept across starts."""
        return self.host_dir / "links.json"

    def metrics_socket(self, index: int) -> Path:
        """Where worker K serves its metrics to the parent (``host/metrics.py``)."""
        return self.host_dir / f"worker-{index}.metrics"


#: where a broker keeps its journals and wiring, under its data directory
STORE_DIR = "store"


def state_problem(data_dir: Path, workers: int) -> str | None:
    """Why ``--workers N`` would leave durable state behind in ``data_dir``, or None.

    A standalone broker keeps it in ``DATA_DIR/store``, worker K in
    ``DATA_DIR/worker-K/store``. Started with another count, a broker would not
    see the queues the old layout holds: refused, with what to do, rather than
    confirmed messages silently out of reach."""
    if workers > 1 and (data_dir / STORE_DIR).is_dir():
        return (
            f"{data_dir} holds the state of one broker ({STORE_DIR}/): "
            "start it with --workers 1, or give the host of workers another --data-dir"
        )
    if workers == 1 and (data_dir / "worker-0" / STORE_DIR).is_dir():
        found = len(list(data_dir.glob(f"worker-*/{STORE_DIR}")))
        return (
            f"{data_dir} holds the state of a host of {found} workers: "
            f"start it with --workers {found}, or give one broker another --data-dir"
        )
    extra = sorted(
        int(p.parent.name.removeprefix("worker-"))
        for p in data_dir.glob(f"worker-*/{STORE_DIR}")
        if p.parent.name.removeprefix("worker-").isdigit()
        and int(p.parent.name.removeprefix("worker-")) >= workers
    )
    if workers > 1 and extra:
        return (
            f"{data_dir}/worker-{extra[-1]} holds a worker's state: start the host "
            f"with --workers {extra[-1] + 1} or more, so no worker's queues are left behind"
        )
    return None


def prepare(layout: HostLayout, *, local_cluster: bool = True) -> None:
    """The host's folders (0700: they hold the secret and the journals) and its
    local cluster file, written again at each start with a new secret (not for a
    host of a cluster: its workers take the cluster's file)."""
    layout.data_dir.mkdir(parents=True, exist_ok=True)
    layout.host_dir.mkdir(mode=0o700, exist_ok=True)
    layout.host_dir.chmod(0o700)
    for index in range(layout.workers):
        layout.worker_dir(index).mkdir(mode=0o700, exist_ok=True)
        for what, socket_path in (
            ("link", layout.link_socket(index)),
            ("hand-over", layout.handoff_socket(index)),
            ("metrics", layout.metrics_socket(index)),
        ):
            path = str(socket_path)
            if len(path.encode()) > MAX_SOCKET_PATH:
                raise HostSetupError(
                    f"--data-dir {layout.data_dir}: the workers' {what} socket {path} is "
                    f"longer than {MAX_SOCKET_PATH} bytes; use a shorter data directory"
                )
    # connections and failed logins are counted afresh by each start's workers
    layout.shared_file.unlink(missing_ok=True)
    if not local_cluster:
        layout.cluster_file.unlink(missing_ok=True)
        return
    hosts = ", ".join(f'"unix:{layout.link_socket(k)}"' for k in range(layout.workers))
    text = (
        "# written by brokerd --workers at each start: the workers of this host\n"
        'name = "host"\n'
        f'secret = "{secrets.token_urlsafe(32)}"\n'
        f"known_hosts = [{hosts}]\n"
        'queue_leader_locator = "balanced"\n'
        'default_queue_type = "classic"\n'
    )
    tmp = layout.cluster_file.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, layout.cluster_file)


def hold_port(bind: str, port: int) -> socket.socket:
    """A socket bound to ``bind:port`` with ``SO_REUSEPORT`` that never listens: port 0
    becomes one port every worker binds, and it stays this host's while the parent
    lives (the kernel hands connections only to listening sockets)."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((bind, port))
    except OSError as exc:
        sock.close()
        raise HostSetupError(f"cannot bind {bind}:{port}: {exc.strerror}") from None
    return sock


def hold_link_ports(layout: HostLayout, bind: str) -> list[socket.socket]:
    """Each worker's TCP link port in a cluster of hosts, held like the client port:
    the ports ``links.json`` kept from the last start, or new ones written there."""
    kept: list[int] = []
    try:
        record = json.loads(layout.links_file.read_text())
        if record.get("bind") == bind and len(record.get("ports", ())) == layout.workers:
            kept = [int(p) for p in record["ports"]]
    except (OSError, ValueError, TypeError, AttributeError):
        kept = []
    held: list[socket.socket] = []
    try:
        for index in range(layout.workers):
            port = kept[index] if kept else 0
            try:
                held.append(hold_port(bind, port))
            except HostSetupError as exc:
                raise HostSetupError(
                    f"worker-{index}'s link port {bind}:{port} (kept in {layout.links_file}, "
                    f"where the cluster knows this worker) is not free: {exc}"
                ) from None
    except HostSetupError:
        for sock in held:
            sock.close()
        raise
    ports = [sock.getsockname()[1] for sock in held]
    if ports != kept:
        tmp = layout.links_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"bind": bind, "ports": ports}))
        os.replace(tmp, layout.links_file)
    return held


@dataclass(frozen=True)
class WorkerCommand:
    """The argv of worker K: the host's options, and its own index."""

    layout: HostLayout
    bind: str
    port: int | None
    tls_port: int | None
    config: Path | None
    log_level: str
    host_address: str
    #: the host serves /metrics: each worker serves its own to the parent
    metrics: bool = False
    #: the console each worker links to (the token is in the workers' environment)
    console: str | None = None
    console_cafile: Path | None = None
    #: a host of a cluster: the cluster's file, each worker's TCP link port, the
    #: host's id for this start, and the server options the host was given
    cluster: Path | None = None
    link_ports: tuple[int, ...] = ()
    host_id: str = ""
    fault_injection: bool = False

    def __call__(self, index: int) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "brokerd",
            "--bind",
            self.bind,
            "--port",
            "off" if self.port is None else str(self.port),
            "--data-dir",
            str(self.layout.worker_dir(index)),
            "--cluster",
            str(self.cluster or self.layout.cluster_file),
            "--log-level",
            self.log_level,
            "--worker-of",
            str(self.layout.data_dir),
            "--worker-index",
            str(index),
            "--host-address",
            self.host_address,
            "--host-workers",
            str(self.layout.workers),
        ]
        if self.tls_port is not None:
            argv += ["--tls-port", str(self.tls_port)]
        if self.cluster is not None:
            argv += ["--link-ports", ",".join(map(str, self.link_ports))]
            argv += ["--host-id", self.host_id]
        if self.fault_injection:
            argv.append("--enable-fault-injection")
        if self.config is not None:
            argv += ["--config", str(self.config)]
        if self.metrics:
            argv += ["--metrics-socket", str(self.layout.metrics_socket(index))]
        if self.console is not None:
            argv += ["--console", self.console]
            if self.console_cafile is not None:
                argv += ["--console-cafile", str(self.console_cafile)]
        return argv
