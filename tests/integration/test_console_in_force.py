"""What a real brokerd reports in force reaches the console's drift view (issue 25).

Two brokers linked to the real console: their hello carries ``in_force``; a version
setting ``limits`` is applied and reported back with the console as the source; a
SIGHUP then makes one broker run its files again, and the version's convergence shows
the difference key by key (``limits.frame_max``: the version's value against the
broker's, with its source) instead of ``{}``.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from tests.console_stack import OPERATOR, ConsoleStack, console_stack  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def stack(console_stack: ConsoleStack) -> Iterator[ConsoleStack]:  # noqa: F811
    console_stack.start_cluster(2)
    api = console_stack.api(OPERATOR)
    console_stack.wait(
        lambda: api.ok("/api/v1/cluster/")["brokers_up"] == 2, 30, "both brokers linked"
    )
    yield console_stack


def test_in_force_from_hello_apply_and_a_drift(stack: ConsoleStack) -> None:
    assert stack.cluster is not None
    api = stack.api(OPERATOR)
    name = stack.broker_name(0)

    def in_force(broker: str) -> dict[str, Any] | None:
        return api.ok(f"/api/v1/brokers/{broker}/")["in_force"]

    first = stack.wait(lambda: in_force(name), 10, "in_force from the hello")
    assert first["sources"]["limits.frame_max"] in ("file", "default")
    assert "password_hash" not in str(first)
    default_frame = first["document"]["limits"]["frame_max"]
    assert sorted(first["document"]["known_hosts"]) == sorted(
        stack.broker_name(i) for i in range(2)
    )

    status, version = api.post(
        "/api/v1/configs/", {"document": {"limits": {"frame_max": 65536}}, "comment": "in force"}
    )
    assert status == 201, version
    number = version["number"]

    def applied(broker: str) -> bool:
        body = in_force(broker) or {}
        limits = (body.get("document") or {}).get("limits") or {}
        return (
            body.get("sources", {}).get("limits.frame_max") == "console"
            and limits.get("frame_max") == 65536
        )

    stack.wait(lambda: all(applied(stack.broker_name(i)) for i in range(2)), 20, "applied")
    rows = api.ok(f"/api/v1/configs/{number}/")["convergence"]
    assert all(r["state"] == "running" and r["differences"] == [] for r in rows), rows

    stack.cluster.servers[0].signal(signal.SIGHUP)  # its files again: the version's parts go

    def drifted() -> dict[str, Any] | None:
        rows = api.ok(f"/api/v1/configs/{number}/")["convergence"]
        row = next(r for r in rows if r["broker"] == name)
        return row if row["state"] == "drifted" and row["differences"] else None

    row = stack.wait(drifted, 15, f"{name} drifted with differences")
    frame = next(d for d in row["differences"] if d["key"] == "limits.frame_max")
    assert frame["status"] == "changed" and frame["version"] == 65536
    assert frame["broker"] == default_frame and frame["source"] in ("file", "default")
    other = next(
        r for r in api.ok(f"/api/v1/configs/{number}/")["convergence"] if r["broker"] != name
    )
    assert other["state"] == "running" and other["differences"] == []
