"""Fixtures of the aio-pika client tests (``test_aiopika_client``,
``test_ttl_dlx_aiopika``): each module runs against a standalone brokerd and
through a cluster (``amqp_port`` in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aio_pika.abc import AbstractRobustConnection

from tests.support.aio import robust_connection


@pytest.fixture(scope="module")
def amqp_url(amqp_port: int) -> str:
    """aio-pika's form of the URL (a module may override it with its client's form)."""
    return f"amqp://guest:guest@127.0.0.1:{amqp_port}/"


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[AbstractRobustConnection]:
    async for conn in robust_connection(amqp_url):
        yield conn
