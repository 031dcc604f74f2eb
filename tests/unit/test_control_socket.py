"""The control socket's handler, driven in-process over a real Unix socket.

A ``brokerd ctl`` (or the flood benchmark's status poll) that gives up and
closes before the reply is a normal end for the server: no traceback, no
``Unhandled exception in client_connected_cb`` in the broker's log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from brokerd import ctl
from brokerd.server.control import serve_control, socket_path


async def _settle(bound: float = 5.0) -> None:
    """Until the server's per-client tasks have ended (they are the only other tasks)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while asyncio.all_tasks() - {asyncio.current_task()} and loop.time() < deadline:
        await asyncio.sleep(0.01)


async def test_client_gone_before_the_reply_is_a_normal_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    asked = asyncio.Event()

    def handler(request: dict[str, Any]) -> dict[str, Any]:
        asked.set()
        return {"command": request["command"], "padding": "x" * 256}

    caplog.set_level(logging.DEBUG)
    server = await serve_control(tmp_path, handler)
    try:
        for _client in range(3):
            reader, writer = await asyncio.open_unix_connection(str(socket_path(tmp_path)))
            writer.write(json.dumps({"command": "status", "args": []}).encode() + b"\n")
            await writer.drain()
            # gone before the server has even read the request, let alone answered it
            writer.close()
            await writer.wait_closed()
            await asyncio.wait_for(asked.wait(), 5.0)
            asked.clear()
            await _settle()
        # a client that stays gets its reply as before
        reader, writer = await asyncio.open_unix_connection(str(socket_path(tmp_path)))
        writer.write(b'{"command": "status"}\n')
        reply = json.loads(await asyncio.wait_for(reader.readline(), 5.0))
        writer.close()
        await writer.wait_closed()
        assert reply["ok"] and reply["result"]["command"] == "status"
    finally:
        server.close()
        await server.wait_closed()
        await _settle()

    assert not [r for r in caplog.records if "Unhandled exception" in r.getMessage()]
    assert not [r for r in caplog.records if r.exc_info or r.levelno > logging.INFO]


async def test_a_request_past_the_limit_gets_an_error_reply(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A line longer than the reader's 64 KiB limit is refused with the control
    socket's own error, not an unhandled ``ValueError`` and no reply."""
    server = await serve_control(tmp_path, lambda request: {"ran": True})
    try:
        reader, writer = await asyncio.open_unix_connection(str(socket_path(tmp_path)))
        writer.write(b'{"command": "status", "pad": "' + b"x" * (70 * 1024) + b'"}\n')
        await writer.drain()
        reply = json.loads(await asyncio.wait_for(reader.readline(), 5.0))
        writer.close()
        await writer.wait_closed()
        assert reply == {"ok": False, "error": "request too large"}
    finally:
        server.close()
        await server.wait_closed()
        await _settle()
    assert not [r for r in caplog.records if "Unhandled exception" in r.getMessage()]


def _big_reply(request: dict[str, Any]) -> dict[str, Any]:
    """Replies far larger than a pipe's buffer, so the writer outlives its reader."""
    peers = [
        {"spid": f"s{i:05}", "type": "primary", "active": True, "address": f"10.0.0.{i % 250}:1"}
        for i in range(3000)
    ]
    if request["command"] == "status":
        return {"spid": "s0", "type": "primary", "root_enabled": True, "peers": peers}
    if request["command"] == "dump":
        return {"dump": "=== brokerd state dump ===\n" + "line of the dump\n" * 20000}
    return {"spid": "s0", "queues": [], "peers": peers}


CTL_RUNS = [["status"], ["status", "--json"], ["dump"], ["queues", "--json"], ["--help"]]


def _quiet_ends(args: list[str]) -> set[int]:
    """141 as a tool killed by SIGPIPE; argparse's help may also swallow the error of its
    own write and exit 0, quietly too."""
    return {0, 141} if args == ["--help"] else {141}


@pytest.mark.integration  # starts a Python process
@pytest.mark.parametrize("args", CTL_RUNS)
async def test_ctl_into_a_closed_pipe_exits_quietly(tmp_path: Path, args: list[str]) -> None:
    """``brokerd ctl ... | head``: the reader is gone before ctl writes (its pipe's read
    end is closed from the start), so every write fails with EPIPE: ctl ends without a
    traceback, with the status a shell reports for a tool killed by SIGPIPE."""
    server = await serve_control(tmp_path, _big_reply)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "brokerd",
            "ctl",
            "--data-dir",
            str(tmp_path),
            *args,
            stdout=write_end,
            stderr=asyncio.subprocess.PIPE,
        )
        os.close(write_end)
        _out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        server.close()
        await server.wait_closed()
        await _settle()
    assert err.decode() == ""
    assert proc.returncode in _quiet_ends(args)


@pytest.mark.integration  # starts a shell pipeline
@pytest.mark.parametrize("args", [["status"], ["dump"]])
async def test_ctl_piped_into_head_prints_no_traceback(tmp_path: Path, args: list[str]) -> None:
    """The same through a real shell pipeline into ``head -1``, as an operator types it."""
    server = await serve_control(tmp_path, _big_reply)
    ctl = shlex.join([sys.executable, "-m", "brokerd", "ctl", "--data-dir", str(tmp_path), *args])
    try:
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            f"set -o pipefail; {ctl} | head -1",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        server.close()
        await server.wait_closed()
        await _settle()
    assert len(out.decode().splitlines()) == 1
    assert "Traceback" not in err.decode() and "BrokenPipeError" not in err.decode()
    assert err.decode() == ""
    # ctl ended as a tool cut off by head does (or, had head read it all, with 0)
    assert proc.returncode in (0, 141)


@pytest.mark.parametrize("args", CTL_RUNS)
def test_ctl_main_stops_quietly_at_a_broken_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], args
) -> None:
    """In process: ``main`` turns the BrokenPipeError of a write or of the last flush
    into exit status 141, and leaves stdout pointing where a flush at exit succeeds."""
    socket_path(tmp_path).touch()
    monkeypatch.setattr(
        ctl,
        "request",
        lambda data_dir, command, extra, timeout: {
            "ok": True,
            "result": _big_reply({"command": command}),
        },
    )
    read_end, write_end = os.pipe()
    os.close(read_end)
    saved = os.dup(1)
    stdout = sys.stdout
    try:
        os.dup2(write_end, 1)
        os.close(write_end)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (restored below)
        code = ctl.main(["--data-dir", str(tmp_path), *args])
        sys.stdout.write("more at exit\n" * 10000)
        sys.stdout.flush()  # reaches /dev/null now: no second error
    finally:
        sys.stdout = stdout
        os.dup2(saved, 1)
        os.close(saved)
    assert code in _quiet_ends(args) and ctl.EXIT_BROKEN_PIPE == 141
    assert "Traceback" not in capfd.readouterr().err
