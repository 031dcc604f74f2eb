"""The network test bed itself (tests/support/netbed.py): namespaces with their own
addresses, silent drops that leave connections half-open, and a clean teardown."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.support.netbed import NetBed, ip, unavailable
from tests.support.slowlink import SlowLink

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(unavailable() is not None, reason=f"netbed: {unavailable()}"),
]

ECHO = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7000))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hello")
"""

PROBE = """
import socket, sys
try:
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 7000
    c = socket.create_connection((sys.argv[1], port), timeout=float(sys.argv[2]))
    print(c.recv(5).decode())
except OSError as exc:
    print(type(exc).__name__)
"""


def _serve(bed: NetBed, index: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        bed.wrap(index, [sys.executable, "-c", ECHO, bed.address(index)]),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _probe(bed: NetBed, source: int, target: int, timeout: float = 1.0, port: int = 7000) -> str:
    done = subprocess.run(
        bed.wrap(
            source,
            [sys.executable, "-c", PROBE, bed.address(target), str(timeout), str(port)],
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.stdout.strip()


def _from_test(bed: NetBed, target: int) -> str:
    try:
        with socket.create_connection((bed.address(target), 7000), timeout=1.0) as conn:
            return conn.recv(5).decode()
    except OSError as exc:
        return type(exc).__name__


def test_servers_have_their_own_addresses_and_cuts_drop_silently() -> None:
    with NetBed(3) as bed:
        servers = [_serve(bed, i) for i in range(3)]
        assert _probe(bed, 0, 1) == "hello"
        assert _from_test(bed, 1) == "hello"
        # one direction: 0's SYNs to 1 vanish (no refusal, no error: a timeout)
        bed.cut(0, 1)
        started = time.monotonic()
        assert _probe(bed, 0, 1, timeout=1.0) in ("TimeoutError", "timeout")
        assert time.monotonic() - started >= 0.9
        # a new connection from 1 to 0 fails too: 0's SYN-ACK is what is dropped
        assert _probe(bed, 1, 0, timeout=1.0) in ("TimeoutError", "timeout")
        bed.heal()
        assert _probe(bed, 0, 1) == "hello"
        # isolated from servers, still reached by clients on the bridge
        bed.isolate(2)
        assert _probe(bed, 0, 2) in ("TimeoutError", "timeout")
        assert _probe(bed, 2, 1) in ("TimeoutError", "timeout")
        assert _from_test(bed, 2) == "hello"
        bed.heal()
        # unplugged: clients lose it too
        bed.unplug(1)
        assert _from_test(bed, 1) in ("TimeoutError", "timeout", "OSError")
        bed.heal()
        assert _from_test(bed, 1) == "hello"
        assert _probe(bed, 2, 1) == "hello"
        names = [bed.namespace(i) for i in range(3)]
    for proc in servers:
        assert proc.wait(5) is not None  # killed with the bed
    listed = ip("netns", "list").stdout
    assert not any(name in listed for name in names)
    assert bed.bridge not in ip("-o", "link").stdout


def test_an_established_connection_is_left_half_open_by_a_cut() -> None:
    """The far end never hears of it: no FIN, no RST. Only a timeout tells."""
    with NetBed(2) as bed:
        _serve(bed, 1)
        with socket.create_connection((bed.address(1), 7000), timeout=2) as conn:
            assert conn.recv(5) == b"hello"
            bed.unplug(1)
            conn.sendall(b"are you there")  # accepted by the kernel: nothing says no
            conn.settimeout(1.0)
            with pytest.raises(TimeoutError):
                conn.recv(1)


def test_a_slow_link_proxy_lives_in_its_server_s_namespace_and_is_cut_with_it() -> None:
    """The known host of a server on the bed is its proxy, one more port of its own
    address: a cut between two servers drops the proxied path too (a proxy in the
    test's namespace once carried links across every partition)."""
    with NetBed(2) as bed:
        server = _serve(bed, 1)
        proxy = SlowLink((bed.address(1), 0), (bed.address(1), 7000), bed.namespace(1)).start()
        try:
            port = proxy.address[1]
            assert proxy.address[0] == bed.address(1)
            assert _probe(bed, 0, 1, port=port) == "hello"
            bed.cut(0, 1)
            assert _probe(bed, 0, 1, timeout=1.0, port=port) in ("TimeoutError", "timeout")
            bed.heal()
            assert _probe(bed, 0, 1, port=port) == "hello"
        finally:
            proxy.close()
            server.kill()
            server.wait(5)
