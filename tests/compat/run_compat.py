"""Run pika's acceptance tests or aio-pika's test suite against brokerd (or RabbitMQ).

Nothing is fetched here: pass a checkout of the client's repository and a
Python environment that has the suite's own test dependencies (aio-pika's
need aiomisc-pytest, which must not be installed in Rookery's environment,
and pytest-timeout; pika's optional adapters need tornado, twisted, gevent).

    python -m tests.compat.run_compat aiopika --checkout DIR --python VENV/bin/python \\
        [--url amqp://guest:guest@127.0.0.1:5690/] [TEST FILE ...]
    python -m tests.compat.run_compat pika --checkout DIR --python VENV/bin/python
    python -m tests.compat.run_compat aiopika --tls --checkout DIR --python VENV/bin/python \\
        [--url amqp://guest:guest@127.0.0.1:5690/ --amqps-url amqps://127.0.0.1:5671/]

Without ``--url`` a brokerd from this checkout is started (aio-pika: a free
port; pika: 127.0.0.1:5672, which its tests hard-code) and stopped after the
run. ``--cluster primary|secondary`` starts three primaries and a secondary
instead and runs aio-pika's suite through a primary that is not the root, or
through the secondary. With the default placement (``client-local``) the
queues declared through a primary are owned by that primary, and those
declared through the secondary (which owns none) by a primary; ``--locator
balanced`` spreads them over the three primaries, so through a primary two
thirds of them are owned by another server. ``--tls`` runs aio-pika's
``tests/test_amqps.py`` instead: the brokerd it starts also listens for AMQPS
(``--tls-port``, a ``[tls]`` table with a CA and a loopback server certificate
made by ``tests.support.certs``), on 5671 when that is free, where the suite's
``test_default_context`` expects default client contexts to be refused. The
suite's summary line and a JUnit file (``--junit``) tell the counts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.brokerd_process import BrokerProcess, free_port, wait_for_port, wait_workers_ready

HERE = Path(__file__).resolve().parent
AIOPIKA_DEFAULT = [
    "tests/test_amqp.py",
    "tests/test_rpc.py",
    "tests/test_amqp_robust.py",
    "tests/test_master.py",
    "tests/test_connect.py",
]
AIOPIKA_TLS_DEFAULT = ["tests/test_amqps.py"]
#: aio-pika's test_default_context connects to this port with default contexts
AMQPS_PORT = 5671


def _port_free(port: int, reuse: bool = False) -> bool:
    """``reuse``: as a server binds (SO_REUSEADDR), so the TIME_WAIT connections a
    previous run left on the port do not count."""
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_tls_broker(data: Path, tls_port: int | None) -> tuple[BrokerProcess, int]:
    """A brokerd with its plain port and an AMQPS port, certificates made on the spot.

    aio-pika's ``test_amqps.py`` presents no client certificate and checks none
    (``CERT_NONE``); ``verify = "peer"`` is RabbitMQ's ``verify_peer`` with
    ``fail_if_no_peer_cert = false``, as in the comparison node."""
    from tests.support.certs import Pki

    pki = Pki(data / "pki", name="rookery-compat")
    server = pki.server()
    config = data / "brokerd.toml"
    config.write_text(
        "[tls]\n"
        f'certfile = "{server.certfile}"\n'
        f'keyfile = "{server.keyfile}"\n'
        f'cafile = "{pki.cafile}"\n'
        'verify = "peer"\n'
    )
    if tls_port is None:
        tls_port = AMQPS_PORT if _port_free(AMQPS_PORT, reuse=True) else free_port()
    broker = BrokerProcess(data, extra_args=["--config", str(config), "--tls-port", str(tls_port)])
    try:
        broker.start()
        wait_for_port(tls_port, proc=broker.proc, log_path=broker.log_path)
    except BaseException:
        broker.stop()
        raise
    return broker, tls_port


def run_aiopika(
    checkout: Path,
    python: str,
    url: str,
    tests: list[str],
    junit: str | None,
    timeout: int,
    amqps_url: str | None = None,
) -> int:
    """Copy aio-pika's tests next to its package, override the docker fixtures, run."""
    work = Path(tempfile.mkdtemp(prefix="rookery-aiopika-"))
    try:
        shutil.copytree(checkout / "tests", work / "tests")
        conftest = work / "tests" / "conftest.py"
        conftest.write_text(
            conftest.read_text() + "\n\n" + (HERE / "aiopika_override.py").read_text()
        )
        cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "log_cli=false"]
        # a test that waits for a feature the broker lacks (TTL, dead letters) would
        # wait forever: pytest-timeout (needed in that environment) fails it instead
        cmd += [f"--timeout={timeout}", "--timeout-method=signal"]
        if junit:
            cmd += ["--junitxml", junit]
        cmd += tests or (AIOPIKA_TLS_DEFAULT if amqps_url else AIOPIKA_DEFAULT)
        env = dict(os.environ, ROOKERY_COMPAT_AMQP_URL=url)
        if amqps_url:
            # the override's rabbitmq_container names this host and port as "5671/tcp"
            env["ROOKERY_COMPAT_AMQPS_URL"] = amqps_url
        return subprocess.call(cmd, cwd=work, env=env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_pika(checkout: Path, python: str, tests: list[str], junit: str | None) -> int:
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    if junit:
        cmd += ["--junitxml", junit]
    cmd += tests or ["tests/acceptance"]
    return subprocess.call(cmd, cwd=checkout, env=dict(os.environ, PYTHONPATH=str(checkout)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("suite", choices=["aiopika", "pika"])
    parser.add_argument("--checkout", type=Path, required=True, help="the client's repository")
    parser.add_argument("--python", default=sys.executable, help="interpreter with its test deps")
    parser.add_argument("--url", help="an already running broker (e.g. RabbitMQ to compare)")
    parser.add_argument("--junit", help="write a JUnit XML report here")
    parser.add_argument(
        "--timeout", type=int, default=60, help="seconds per aio-pika test (pytest-timeout)"
    )
    parser.add_argument(
        "--cluster",
        choices=["primary", "secondary"],
        help="aio-pika through a non-root primary or the secondary of a 3+1 cluster",
    )
    parser.add_argument(
        "--locator",
        choices=["client-local", "balanced"],
        default="client-local",
        help="with --cluster: the cluster file's queue_leader_locator (balanced: most "
        "queues the suite declares are owned by another server than the one it talks to)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="aio-pika's tests/test_amqps.py over AMQPS (brokerd: with generated certificates)",
    )
    parser.add_argument(
        "--tls-port",
        type=int,
        help=f"the started brokerd's AMQPS port (default {AMQPS_PORT} if free, else any)",
    )
    parser.add_argument(
        "--amqps-url", help="with --url: that broker's AMQPS listener (host and port are used)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="the started brokerd's --workers (2: every connection of the suite lands on "
        "a worker the kernel picks, the real test of 'clients see one broker')",
    )
    parser.add_argument("tests", nargs="*")
    # intermixed: test files may follow the options, as the usage above shows
    args = parser.parse_intermixed_args(argv)
    broker: BrokerProcess | None = None
    cluster = None
    url = args.url
    amqps_url = args.amqps_url
    if args.tls_port is not None and not (args.tls and args.url is None):
        parser.error("--tls-port is the AMQPS port of the brokerd --tls starts")
    if args.tls or amqps_url:
        if args.suite != "aiopika" or args.cluster is not None:
            parser.error("--tls runs aio-pika's test_amqps.py against one broker")
        if args.url is not None and amqps_url is None:
            parser.error("--tls with --url needs --amqps-url (that broker's TLS listener)")
        if amqps_url is not None and args.url is None:
            parser.error("--amqps-url needs --url (the same broker's plain listener)")
    if args.workers > 1 and (args.cluster is not None or args.url or args.tls):
        parser.error("--workers is the started standalone brokerd's")
    if args.cluster is not None:
        if args.suite != "aiopika":
            parser.error("--cluster runs aio-pika's suite (pika's needs port 5672)")
        from tests.cluster_harness import Cluster

        base = Path(tempfile.mkdtemp(prefix="rookery-compat-cluster-"))
        cluster = Cluster(base, 3, 1, interval=0.5, timeout=2.5)
        locator = f'queue_leader_locator = "{args.locator}"\n'
        cluster.file.write_text(locator + cluster.file.read_text())
        root = cluster.start_settled()
        through = 3 if args.cluster == "secondary" else cluster.followers(root)[0]
        port = cluster.nodes[through].port
        url = f"amqp://guest:guest@127.0.0.1:{port}//"
        print(
            f"run_compat: cluster ({args.locator}), through the {args.cluster} on {url}",
            flush=True,
        )
    elif url is None:
        data = Path(tempfile.mkdtemp(prefix="rookery-compat-brokerd-"))
        workers = ["--workers", str(args.workers)] if args.workers > 1 else []
        if args.suite == "pika":
            if not _port_free(5672):
                print("run_compat: 127.0.0.1:5672 is taken (pika's tests need it)", file=sys.stderr)
                return 2
            broker = BrokerProcess(data, port=5672, extra_args=workers)
            broker.start()
            wait_workers_ready(data, args.workers)
        elif args.tls:
            broker, tls_port = start_tls_broker(data, args.tls_port)
            amqps_url = f"amqps://guest:guest@127.0.0.1:{tls_port}//"
            print(f"run_compat: brokerd AMQPS on {amqps_url} (certificates in {data}/pki)")
        else:
            broker = BrokerProcess(data, extra_args=workers)
            broker.start()
            wait_workers_ready(data, args.workers)
        url = broker.url + "/"  # path '//': the vhost '/' (yarl keeps the empty segment)
        print(f"run_compat: brokerd on {url} (log {broker.log_path})", flush=True)
    try:
        if args.suite == "aiopika":
            return run_aiopika(
                args.checkout, args.python, url, args.tests, args.junit, args.timeout, amqps_url
            )
        return run_pika(args.checkout, args.python, args.tests, args.junit)
    finally:
        if broker is not None:
            broker.stop()
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    sys.exit(main())
