"""The console and a cluster that grows and shrinks (issue 43): the REST API shows the
members as the root reports them, forgets a stopped one, and grows and shrinks a quorum
queue's group through the command path (Celery delivery, the broker link,
``cluster.forget`` or ``queues.grow|shrink`` on a broker, the root's order).

One stack (Redis, Daphne, Celery worker + beat) and three primaries with a 0.3 s
heartbeat; a fourth joins with ``--join``, linked to the console too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.console_stack import OPERATOR, VIEWER, Api, ConsoleStack, console_stack  # noqa: F401
from tests.integration.test_cluster_grow import queue_row
from tests.support.clients import connect

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def stack(console_stack: ConsoleStack) -> Iterator[ConsoleStack]:  # noqa: F811
    """The console with three primaries linked to it, agreed on a root."""
    cluster = console_stack.start_cluster(3)
    cluster.wait_until(cluster.agreed_root, timeout=30)
    yield console_stack


def members_at(api: Api, version: int, count: int) -> dict[str, Any] | None:
    """The members the API shows once they are at ``version``, held by a majority, with
    ``count`` primaries."""
    status, body = api.get("/api/v1/cluster/members/")
    if status != 200:
        return None
    primaries = [m for m in body["members"] if m["type"] == "primary"]
    if body["version"] == version and body["committed"] and len(primaries) == count:
        return body
    return None


def test_a_joined_primary_is_stopped_then_forgotten_through_the_api(stack: ConsoleStack) -> None:
    cluster = stack.cluster
    assert cluster is not None
    api, viewer = stack.api(OPERATOR), stack.api(VIEWER)
    first = stack.wait(lambda: members_at(viewer, 0, 3), 30, "the file's three members")
    assert {m["state"] for m in first["members"]} <= {"self", "up"}

    joiner = cluster.add_primary()
    link = ["--console", stack.link_url, f"--console-token={stack.broker_token}"]
    cluster.start(joiner, extra=["--join", cluster.address(0), *link])
    address = cluster.address(joiner)
    grown = stack.wait(lambda: members_at(viewer, 1, 4), 30, "members version 1 (4 primaries)")
    row = next(m for m in grown["members"] if m["address"] == address)
    assert row["state"] == "up" and not row["forgettable"]

    status, refused = api.post("/api/v1/cluster/members/forget/", {"address": address})
    assert status == 409 and "is running" in refused["error"], refused

    cluster.stop(joiner)  # a planned stop: its queues move first

    def stopped() -> dict[str, Any] | None:
        status, body = viewer.get("/api/v1/cluster/members/")
        rows = {m["address"]: m for m in body["members"]} if status == 200 else {}
        return rows.get(address) if rows.get(address, {}).get("forgettable") else None

    stack.wait(stopped, 30, f"{address} shown as not running")
    status, forgot = api.post("/api/v1/cluster/members/forget/", {"address": address})
    assert status == 200, forgot
    assert forgot["forgotten"] == address and forgot["version"] == 2, forgot
    assert forgot["committed"] and address not in forgot["members"]
    command = api.ok(f"/api/v1/commands/{forgot['command']}/")
    assert (command["name"], command["state"]) == ("cluster.forget", "acked")

    shrunk = stack.wait(lambda: members_at(viewer, 2, 3), 30, "members version 2 (3 primaries)")
    assert address in {f["address"] for f in shrunk["forgotten"]}
    assert address not in {m["address"] for m in shrunk["members"]}
    assert shrunk["source"] in {stack.broker_name(i) for i in range(3)}
    status, again = api.post("/api/v1/cluster/members/forget/", {"address": address})
    assert status == 409 and "not a member" in again["error"], again


def test_a_quorum_group_grows_and_shrinks_through_the_api(stack: ConsoleStack) -> None:
    """A group of two: a shrink is refused (the root's reason in the answer), the
    third primary is grown into it (``ctl queues`` on a server shows three), and a
    member that does not own it is shrunk off again."""
    cluster = stack.cluster
    assert cluster is not None
    api = stack.api(OPERATOR)
    setup = connect(cluster.ports[0])
    setup.channel().queue_declare(
        "console-growing",
        durable=True,
        arguments={"x-queue-type": "quorum", "x-quorum-initial-group-size": 2},
    )
    setup.close()
    row = cluster.wait_until(
        lambda: (
            (r := queue_row(cluster, 0, "console-growing"))["group"] and r["owner_address"] and r
        ),
        timeout=20,
        what="the queue placed",
    )
    owner, group = row["owner_address"], row["group"]
    assert len(group) == 2 and owner in group, row
    other = next(a for a in group if a != owner)
    third = next(cluster.address(i) for i in range(3) if cluster.address(i) not in group)

    def answer(action: str, address: str) -> dict[str, Any]:
        status, body = api.post(f"/api/v1/queues/{action}/", {"address": address})
        assert status == 200, body
        assert (body["action"], body["address"]) == (action, address), body
        return next(q for q in body["queues"] if q["queue"] == "console-growing")

    refused = answer("shrink", other)
    assert not refused["changed"] and "not be a majority" in refused["reason"], refused
    assert sorted(queue_row(cluster, 1, "console-growing")["group"]) == sorted(group)

    grown = answer("grow", third)
    assert grown["changed"] and sorted(grown["group"]) == sorted([*group, third]), grown
    cluster.wait_until(
        lambda: all(
            sorted(queue_row(cluster, i, "console-growing")["group"]) == sorted([*group, third])
            for i in range(3)
        ),
        timeout=20,
        what="the group of three on every server",
    )

    leaving = third if third != owner else other
    shrunk = answer("shrink", leaving)
    assert shrunk["changed"] and leaving not in shrunk["group"], shrunk
    cluster.wait_until(
        lambda: (
            len(g := queue_row(cluster, 2, "console-growing")["group"]) == 2 and leaving not in g
        ),
        timeout=20,
        what="the group of two again",
    )
    shrinks = api.items("/api/v1/commands/?name=queues.shrink")
    assert [c["state"] for c in shrinks] == ["acked", "acked"], shrinks
