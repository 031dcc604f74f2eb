"""A pika client as the cluster tests open it: one attempt, bounded waits, so a
server that does not answer fails the test instead of hanging it."""

from __future__ import annotations

from typing import Any

import pika


def connect(port: int, blocked_timeout: float = 10, **kwargs: Any) -> pika.BlockingConnection:
    """A blocking connection to 127.0.0.1:``port``; a connection the broker
    blocks (alarm, quorum lost) gives up after ``blocked_timeout`` seconds."""
    params = pika.ConnectionParameters(
        "127.0.0.1",
        port,
        connection_attempts=1,
        socket_timeout=10,
        blocked_connection_timeout=blocked_timeout,
        **kwargs,
    )
    return pika.BlockingConnection(params)
