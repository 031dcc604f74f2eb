"""aio-pika connections for the client tests' fixtures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
from aio_pika.abc import AbstractRobustConnection


async def robust_connection(url: str) -> AsyncIterator[AbstractRobustConnection]:
    """A robust connection for a fixture to yield, closed (within 10 s) after."""
    conn = await aio_pika.connect_robust(url, timeout=10)
    try:
        yield conn
    finally:
        await asyncio.wait_for(conn.close(), 10)
