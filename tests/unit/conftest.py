"""Fixtures shared by the console's service-level unit tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def in_memory_layer(settings) -> None:
    """Channel-layer sends (dashboard notifications, command delivery) stay in process."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def scheduled(monkeypatch) -> list:
    """Command ids whose first delivery would be queued on Celery (not sent)."""
    from clusterapi import commands

    queued: list = []
    monkeypatch.setattr(commands, "schedule_delivery", queued.append)
    return queued
