"""deploy/runbooks/bridges.md, "Federation", followed as written: its commands run
against a real downstream brokerd, with only the data directory and the
upstream's URI changed to this test's, and the link it defines carries a
message from a real upstream brokerd."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.brokerd_process import BrokerProcess
from tests.support.bridges import two_brokers

pytestmark = pytest.mark.integration

RUNBOOK = Path(__file__).resolve().parents[2] / "deploy" / "runbooks" / "bridges.md"


def runbook_block(section: str) -> str:
    """The first ``sh`` block under ``## section``."""
    text = RUNBOOK.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", body, re.S)
    assert block is not None, f"no sh block under {section}"
    return block.group(1)


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    with two_brokers(tmp_path, "up", "down") as both:
        yield both


def test_the_federation_runbook_as_written(sites: tuple[BrokerProcess, BrokerProcess]) -> None:
    up, down = sites
    block = runbook_block("Federation")
    assert block.count("brokerd ctl --data-dir /var/lib/rookery/NAME federation") == 3
    for ch_port in (up.port, down.port):
        with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", ch_port)) as conn:
            ch = conn.channel()
            ch.exchange_declare("fed.orders", "topic", durable=True)
            if ch_port == down.port:
                ch.queue_declare("orders", durable=True)
                ch.queue_bind("orders", "fed.orders", "#")
    # as written, but for where this test's broker keeps its data and its upstream
    uri = re.search(r'"uri": "([^"]+)"', block)
    assert uri is not None
    script = block.replace("/var/lib/rookery/NAME", str(down.data_dir)).replace(
        uri.group(1), f"amqp://127.0.0.1:{up.port}"
    )
    shell = f'brokerd() {{ {shlex.quote(sys.executable)} -m brokerd "$@"; }}\nset -e\n{script}'
    out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    deadline = time.monotonic() + 20
    status = ""
    while time.monotonic() < deadline:
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "brokerd",
                "ctl",
                "--data-dir",
                str(down.data_dir),
                "federation",
                "status",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        if ": running" in status:
            break
        time.sleep(0.2)
    assert "federation exchange fed.orders from site-a: running" in status, status
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", up.port)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("fed.orders", "eu.new", b"order-1")
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", down.port)) as conn:
        ch = conn.channel()
        deadline = time.monotonic() + 10
        got = None
        while got is None and time.monotonic() < deadline:
            got = ch.basic_get("orders", auto_ack=True)[2]
            time.sleep(0.05)
    assert got == b"order-1"
