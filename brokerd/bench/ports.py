"""Listening ports for the brokers and services a benchmark or a test starts.

Not the kernel's choice (bind to port 0): that comes from the ephemeral range
(``net.ipv4.ip_local_port_range``), which outgoing connections draw from too,
so a cluster's links or a client could take the port in the moment before the
server binds it ("address already in use"). These come from below that range,
where no outgoing connection ever lands.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: the lowest port handed out
LOWEST_PORT = 10_000
#: every port handed out in this process (for servers that may not have bound yet)
GIVEN: set[int] = set()


def ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port(low: int = LOWEST_PORT, high: int | None = None) -> int:
    """A loopback port in [low, high) that nothing is bound to now and that this
    process never handed out before (its server may not have bound it yet)."""
    high = ephemeral_low() if high is None else high
    for _ in range(1_000):
        port = random.randrange(low, high)
        if port in GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        GIVEN.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {low}-{high}")
