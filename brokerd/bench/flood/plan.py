"""What a flood run loads and where its clients connect (pure).

Kept apart from everything that starts processes, so the tests and the report
use the options and issue 21's layout without loading a client or a broker.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FloodOptions:
    """One run's load and bounds (the defaults are issue 21's flood)."""

    queues: int = 6
    publishers: int = 6
    messages: int = 60_000
    body_size: int = 250
    batch: int = 200
    confirm_window: int = 0
    quiet: float = 5.0
    timeout: float = 300.0
    after: float = 10.0
    setup_timeout: float = 60.0
    status_poll: float = 1.0
    context: int = 3
    #: durable queues (a cluster replicates them; transient ones are classic)
    durable_queues: bool = False


@dataclass(frozen=True)
class Plan:
    """Where each queue is declared and consumed, and where each publisher connects."""

    #: per queue: the server it is declared through (its home under client-local placement)
    home: list[int]
    #: per queue: the server of its one consumer
    consumer: list[int]
    #: per publisher: (queue index, server)
    publishers: list[tuple[int, int]]


def placement(queues: int, publishers: int, servers: int) -> Plan:
    """Issue 21's layout: queues spread over the servers, each queue's publisher and
    consumer on two other servers (on one server, everything is on it)."""
    if queues < 1 or publishers < 1 or servers < 1:
        raise ValueError("queues, publishers and servers must be at least 1")
    home = [q % servers for q in range(queues)]
    consumer = [(q + 1) % servers for q in range(queues)]
    pubs = []
    for j in range(publishers):
        q = j % queues
        server = (q + 2 + j // queues) % servers
        if servers > 1 and server == consumer[q]:
            server = (server + 1) % servers
        pubs.append((q, server))
    return Plan(home, consumer, pubs)
