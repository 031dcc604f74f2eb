"""`brokerd ctl` against a running broker's control socket."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pika

from tests.brokerd_process import BrokerProcess


def ctl(broker: BrokerProcess, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``brokerd ctl --data-dir DIR ARGS...`` against a broker (or a host of workers)."""
    return subprocess.run(
        [sys.executable, "-m", "brokerd", "ctl", "--data-dir", str(broker.data_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_status_json_has_the_fixed_keys(broker: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        conn.channel().queue_declare("ctl-status-q")
        result = ctl(broker, "status", "--json")
        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        for key in (
            "spid",
            "type",
            "is_root",
            "root",
            "ready",
            "root_enabled",
            "peers",
            "checksum",
        ):
            assert key in status
        assert status["ready"] is True and status["peers"] == []
        assert status["connections"] >= 1 and status["queues"] >= 1
        assert status["spid"] in broker.log_text()
        memory, disk = status["resources"]["memory"], status["resources"]["disk"]
        assert 0 < memory["used"] < memory["limit"] < memory["total"]
        assert memory["watermark"] == 0.4 and memory["alarm"] is False
        assert disk["free"] > disk["limit"] == 50_000_000 and disk["alarm"] is False
        assert status["alarms"] == [] and status["blocked"] == {}
    finally:
        conn.close()


def test_queues_lists_each_queue_with_its_type_and_role(broker: BrokerProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = conn.channel()
        channel.queue_declare("ctl-q-classic", durable=True)
        channel.queue_declare("ctl-q-quorum", durable=True, arguments={"x-queue-type": "quorum"})
        result = ctl(broker, "queues", "--json")
        assert result.returncode == 0, result.stderr
        listed = json.loads(result.stdout)
        rows = {q["name"]: q for q in listed["queues"]}
        # on a broker alone every queue is its own: local, with its declared type
        assert (rows["ctl-q-classic"]["type"], rows["ctl-q-classic"]["role"]) == (
            "classic",
            "local",
        )
        assert rows["ctl-q-quorum"]["type"] == "quorum"
        assert rows["ctl-q-quorum"]["owner"] == listed["spid"]
        plain = ctl(broker, "queues")
        assert plain.returncode == 0, plain.stderr
        line = next(x for x in plain.stdout.splitlines() if "ctl-q-quorum" in x)
        assert line.split()[2:4] == ["quorum", "local"] and "(here)" in line
    finally:
        conn.close()


def test_dump_and_plain_status(broker: BrokerProcess) -> None:
    dumped = ctl(broker, "dump")
    assert dumped.returncode == 0 and "=== brokerd state dump ===" in dumped.stdout
    plain = ctl(broker, "status")
    assert plain.returncode == 0 and plain.stdout.startswith("spid")
    assert re.search(
        r"^memory +[\d.]+ [KMG]iB of the [\d.]+ [MGT]iB watermark \(\d+%\)$", plain.stdout, re.M
    )
    assert re.search(r"^disk free +[\d.]+ \w+ \(limit 47\.7 MiB\) on ", plain.stdout, re.M)
    # a standalone broker: its address beside its spid, candidacy in words (no "root ok")
    assert re.search(r"^spid +\S+ \(127\.0\.0\.1:\d+\)$", plain.stdout, re.M)
    assert re.search(r"^candidacy +- \(not clustered\)$", plain.stdout, re.M)
    assert "root ok" not in plain.stdout


def test_piped_into_head_ends_quietly(broker: BrokerProcess) -> None:
    """``brokerd ctl status | head -1`` and the like: no BrokenPipeError traceback."""
    for args in (["status"], ["status", "--json"], ["dump"], ["queues"]):
        command = shlex.join(
            [sys.executable, "-m", "brokerd", "ctl", "--data-dir", str(broker.data_dir), *args]
        )
        piped = subprocess.run(
            ["bash", "-c", f"{command} | head -1"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 1, piped
        assert piped.stderr == "", piped.stderr
        # and a reader gone before the first write: every write fails with EPIPE
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            cut = subprocess.run(
                [sys.executable, "-m", "brokerd", "ctl", "--data-dir", str(broker.data_dir), *args],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                timeout=30,
            )
        finally:
            os.close(write_end)
        assert cut.returncode == 141 and cut.stderr == "", cut.stderr


def test_refusals_are_clear(broker: BrokerProcess, tmp_path) -> None:
    root = ctl(broker, "root", "disable")
    assert root.returncode == 1 and "clustered broker" in root.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "brokerd", "ctl", "--data-dir", str(tmp_path), "status"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert missing.returncode == 2 and "no broker control socket" in missing.stderr
