"""Fixtures of the aio-pika client tests (``test_aiopika_client``,
``test_ttl_dlx_aiopika``): each module runs against a standalone brokerd and
through a cluster (``amqp_port`` in tests/conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractRobustConnection


@pytest.fixture(scope="module")
def amqp_url(amqp_port: int) -> str:
    """aio-pika's form of the URL (a module may override it with its client's form)."""
    return f"amqp://guest:guest@127.0.0.1:{amqp_port}/"


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[AbstractRobustConnection]:
    conn = await aio_pika.connect_robust(amqp_url, timeout=10)
    try:
        yield conn
    finally:
        await asyncio.wait_for(conn.close(), 10)
