"""Run pika's acceptance tests or aio-pika's test suite against brokerd (or RabbitMQ).

Nothing is fetched here: pass a checkout of the client's repository and a
Python environment that has the suite's own test dependencies (aio-pika's
need aiomisc-pytest, which must not be installed in Rookery's environment,
and pytest-timeout; pika's optional adapters need tornado, twisted, gevent).

    python -m tests.compat.run_compat aiopika --checkout DIR --python VENV/bin/python \\
        [--url amqp://guest:guest@127.0.0.1:5690/] [TEST FILE ...]
    python -m tests.compat.run_compat pika --checkout DIR --python VENV/bin/python

Without ``--url`` a brokerd from this checkout is started (aio-pika: a free
port; pika: 127.0.0.1:5672, which its tests hard-code) and stopped after the
run. ``--cluster primary|secondary`` starts three primaries and a secondary
instead and runs aio-pika's suite through a primary that is not the root, or
through the secondary: every queue it uses is then mastered on another
server. The suite's summary line and a JUnit file (``--junit``) tell the
counts.
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

from tests.brokerd_process import BrokerProcess

HERE = Path(__file__).resolve().parent
AIOPIKA_DEFAULT = [
    "tests/test_amqp.py",
    "tests/test_rpc.py",
    "tests/test_amqp_robust.py",
    "tests/test_master.py",
    "tests/test_connect.py",
]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run_aiopika(
    checkout: Path, python: str, url: str, tests: list[str], junit: str | None, timeout: int
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
        cmd += tests or AIOPIKA_DEFAULT
        env = dict(os.environ, ROOKERY_COMPAT_AMQP_URL=url)
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
    parser.add_argument("tests", nargs="*")
    args = parser.parse_args(argv)
    broker: BrokerProcess | None = None
    cluster = None
    url = args.url
    if args.cluster is not None:
        if args.suite != "aiopika":
            parser.error("--cluster runs aio-pika's suite (pika's needs port 5672)")
        from tests.cluster_harness import Cluster

        base = Path(tempfile.mkdtemp(prefix="rookery-compat-cluster-"))
        cluster = Cluster(base, 3, 1, interval=0.5, timeout=2.5)
        root = cluster.start_settled()
        through = 3 if args.cluster == "secondary" else cluster.followers(root)[0]
        port = cluster.nodes[through].port
        url = f"amqp://guest:guest@127.0.0.1:{port}//"
        print(f"run_compat: cluster, through the {args.cluster} on {url}", flush=True)
    elif url is None:
        data = Path(tempfile.mkdtemp(prefix="rookery-compat-brokerd-"))
        if args.suite == "pika":
            if not _port_free(5672):
                print("run_compat: 127.0.0.1:5672 is taken (pika's tests need it)", file=sys.stderr)
                return 2
            broker = BrokerProcess(data, port=5672)
        else:
            broker = BrokerProcess(data)
        broker.start()
        url = broker.url + "/"  # path '//': the vhost '/' (yarl keeps the empty segment)
        print(f"run_compat: brokerd on {url} (log {broker.log_path})", flush=True)
    try:
        if args.suite == "aiopika":
            return run_aiopika(
                args.checkout, args.python, url, args.tests, args.junit, args.timeout
            )
        return run_pika(args.checkout, args.python, args.tests, args.junit)
    finally:
        if broker is not None:
            broker.stop()
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    sys.exit(main())
