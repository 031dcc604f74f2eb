"""The order a server starts its parts in, in process (no sockets but its own)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

from brokerd.server.app import Server, ServerOptions


async def test_signal_handlers_are_in_place_before_the_port_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client (or a test) that finds the port listening may signal at once: a
    SIGHUP or SIGTERM that found no handler yet ended the process (CI, under load)."""
    server = Server(ServerOptions(bind="127.0.0.1", port=0, data_dir=tmp_path))
    loop = asyncio.get_running_loop()
    real = loop.create_server
    seen: dict[int, Any] = {}

    async def create_server(*args: Any, **kwargs: Any) -> asyncio.AbstractServer:
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            seen[sig] = signal.getsignal(sig)
        return await real(*args, **kwargs)

    monkeypatch.setattr(loop, "create_server", create_server)
    await server.start()
    try:
        assert seen, "the server never listened"
        for sig, handler in seen.items():
            assert handler not in (signal.SIG_DFL, signal.SIG_IGN, None), signal.Signals(sig)
    finally:
        await server.shutdown()
        for sig in seen:
            loop.remove_signal_handler(sig)
