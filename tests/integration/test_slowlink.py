"""The slow-link proxy (tests/support/slowlink.py): delay, bandwidth cap, stall,
over loopback sockets (the test support itself, no broker)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.slowlink import SlowLink

pytestmark = pytest.mark.integration


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[:2]
    stop.set()
    thread.join(2)
    server.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def _round_trip(address: tuple[str, int], payload: bytes) -> tuple[bytes, float]:
    started = time.monotonic()
    with socket.create_connection(address, timeout=10) as conn:
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += conn.recv(65536)
    return got, time.monotonic() - started


def test_a_slow_link_delays_caps_and_stalls_but_keeps_every_byte(echo: tuple[str, int]) -> None:
    link = SlowLink(("127.0.0.1", 0), echo).start()
    try:
        got, fast = _round_trip(link.address, b"x" * 1000)
        assert got == b"x" * 1000 and fast < 0.5
        link.set(delay=0.2)
        got, took = _round_trip(link.address, b"y" * 1000)
        assert got == b"y" * 1000 and took >= 0.4  # 0.2 s each way
        link.set(rate=200_000)
        payload = bytes(range(256)) * 1000  # 256 kB each way at 200 kB/s
        got, took = _round_trip(link.address, payload)
        assert got == payload and took >= 1.2  # both ways at once: 1.28 s of sending
        link.clear()
        link.stall()
        result: list[tuple[bytes, float]] = []
        thread = threading.Thread(target=lambda: result.append(_round_trip(link.address, b"z")))
        thread.start()
        time.sleep(1.0)
        assert not result  # nothing moves while stalled
        link.release()
        thread.join(5)
        assert result and result[0][0] == b"z"
    finally:
        link.close()
