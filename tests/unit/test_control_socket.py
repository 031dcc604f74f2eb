"""The control socket's handler, driven in-process over a real Unix socket.

A ``brokerd ctl`` (or the flood benchmark's status poll) that gives up and
closes before the reply is a normal end for the server: no traceback, no
``Unhandled exception in client_connected_cb`` in the broker's log.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

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
