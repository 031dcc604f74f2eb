"""The live page consumer: login required, fragments pushed on change, bursts coalesced."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser, User
from django.db import connections
from django.utils import timezone

from clusterapi.cluster import DASHBOARD_GROUP, dashboard_event
from clusterapi.models import Broker
from console.dashboard import live
from console.dashboard.live import DashboardConsumer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("in_memory_layer")]


@pytest.fixture(autouse=True)
async def _close_thread_connections() -> AsyncIterator[None]:
    """Close the database connection the consumer opened in asgiref's sync thread, so
    later tests without database access do not trip over it there."""
    yield
    await sync_to_async(_forget_connections)()


def _forget_connections() -> None:
    # close() keeps an in-memory SQLite test database open, so drop the wrappers too
    connections.close_all()
    for alias in list(connections):
        with contextlib.suppress(AttributeError):
            del connections[alias]


def communicator(path: str, user: Any) -> WebsocketCommunicator:
    com = WebsocketCommunicator(DashboardConsumer.as_asgi(), path)
    com.scope["user"] = user
    return com


async def test_anonymous_and_unknown_pages_are_refused() -> None:
    com = communicator("/ws/dashboard/?page=overview", AnonymousUser())
    connected, code = await com.connect()
    assert not connected and code == live.CLOSE_UNAUTHENTICATED
    user = await sync_to_async(User.objects.create_user)("u1", password="pw-u1-123")
    com = communicator("/ws/dashboard/?page=nope", user)
    connected, code = await com.connect()
    assert not connected and code == live.CLOSE_UNKNOWN_PAGE


async def test_changes_push_fragments_at_most_a_few_times_a_second() -> None:
    user = await sync_to_async(User.objects.create_user)("u2", password="pw-u2-123")
    broker = await sync_to_async(Broker.objects.create)(
        name="127.0.0.1:5901",
        broker_type="primary",
        state="up",
        is_root=True,
        ready=True,
        last_seen=timezone.now(),
    )
    com = communicator(f"/ws/dashboard/?page=broker&broker={broker.name}", user)
    connected, _ = await com.connect()
    assert connected
    first = await com.receive_from(timeout=3)  # sent on connect
    assert 'id="cluster-bar"' in first and 'id="broker-summary"' in first
    assert 'data-root="127.0.0.1:5901"' in first
    assert "Disable root" not in first  # not an operator
    await sync_to_async(Broker.objects.filter(pk=broker.pk).update)(is_root=False)
    layer = get_channel_layer()
    started = time.monotonic()
    for _ in range(30):  # a burst: 30 statuses within ~0.3 s
        await layer.group_send(DASHBOARD_GROUP, dashboard_event("broker", broker.name))
        await asyncio.sleep(0.01)
    await asyncio.sleep(1.2 - (time.monotonic() - started))
    received = []
    while not await com.receive_nothing(timeout=0.1):  # drain what arrived in 1.2 s
        received.append(await com.receive_from())
    assert 1 <= len(received) <= 5, len(received)
    assert any('data-root=""' in r for r in received)  # the change shows
    # nothing changed since: nothing is sent (a swap would replace what a user clicks)
    while not await com.receive_nothing(timeout=live.MIN_INTERVAL * 2):
        await com.receive_from()  # the burst's last render, if it was still due
    await layer.group_send(DASHBOARD_GROUP, dashboard_event("broker", broker.name))
    assert await com.receive_nothing(timeout=1.0), await com.receive_from()
    await com.disconnect()
