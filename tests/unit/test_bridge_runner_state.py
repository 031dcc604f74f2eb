"""A shovel runner's state as the bridge-down alarm reads it: down since it last left
``running`` (or since it was made), however often its reason changes meanwhile."""

from __future__ import annotations

from brokerd.bridges.definitions import parse_shovel
from brokerd.bridges.runner import BLOCKED, RUNNING, STARTING, TERMINATED, ShovelRunner

DEFINITION = {"src-uri": "amqp://", "src-queue": "in", "dest-uri": "amqp://", "dest-queue": "out"}


def test_down_since_is_when_it_last_stopped_running() -> None:
    runner = ShovelRunner(parse_shovel("s", DEFINITION), node="n")
    made = runner.down_since
    assert made is not None and runner.state == STARTING  # down from the start
    runner._set(STARTING, "cannot connect: refused")
    runner._set(STARTING, "cannot connect: timed out")
    assert runner.down_since == made  # a new reason is not a new outage
    runner._set(RUNNING, "")
    assert runner.down_since is None
    runner._set(BLOCKED, "the destination blocked our publishes")
    blocked_at = runner.down_since
    assert blocked_at is not None and blocked_at >= made
    runner._set(TERMINATED, "403 ACCESS_REFUSED")
    assert runner.down_since == blocked_at
    assert runner.status()["state"] == TERMINATED
