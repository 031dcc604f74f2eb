"""The console and a real 3-broker cluster: what the API shows follows what the brokers do.

One stack per module (Redis, Daphne, Celery worker + beat, three linked brokers
with a 0.3 s heartbeat); the tests run in file order and each leaves the
cluster whole again.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
import websockets.exceptions
import websockets.sync.client

from tests.console_stack import OPERATOR, VIEWER, Api, ConsoleStack, console_stack  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def stack(console_stack: ConsoleStack) -> Iterator[ConsoleStack]:  # noqa: F811
    """The console with three primaries linked to it, agreed on a root."""
    cluster = console_stack.start_cluster(3)
    cluster.wait_until(cluster.agreed_root, timeout=30)
    yield console_stack


@pytest.fixture(scope="module")
def api(stack: ConsoleStack) -> Api:
    return stack.api(OPERATOR)


def index_of_spid(stack: ConsoleStack, spid: str) -> int:
    assert stack.cluster is not None
    for index in stack.cluster.running():
        if stack.cluster.status(index)["spid"] == spid:
            return index
    raise AssertionError(f"no running broker has spid {spid}")


def brokers_by_name(api: Api) -> dict[str, dict[str, Any]]:
    return {b["name"]: b for b in api.items("/api/v1/brokers/")}


def api_root_matches_cluster(stack: ConsoleStack, api: Api) -> str | None:
    """The root's spid when the API's cluster state shows the root the brokers agree on."""
    assert stack.cluster is not None
    agreed = stack.cluster.agreed_root()
    state = api.ok("/api/v1/cluster/")
    if agreed and state["ready"] and state["root"] and state["root"]["spid"] == agreed:
        return agreed
    return None


def wait_command(stack: ConsoleStack, api: Api, command_id: str, timeout: float = 15) -> dict:
    """The command once it reached a final state."""

    def final() -> dict | None:
        command = api.ok(f"/api/v1/commands/{command_id}/")
        return command if command["state"] in ("acked", "failed", "timed_out") else None

    return stack.wait(final, timeout, f"command {command_id} final")


def test_api_shows_three_brokers_and_the_root(stack: ConsoleStack, api: Api) -> None:
    names = {stack.broker_name(i) for i in range(3)}

    def three_up() -> bool:
        brokers = brokers_by_name(api)
        return set(brokers) == names and all(
            b["state"] == "up" and b["connected"] and b["ready"] and b["broker_type"] == "primary"
            for b in brokers.values()
        )

    # ready too: the endpoints below list the brokers that are up and ready
    stack.wait(three_up, 10, "three brokers up and ready in the API")
    root_spid = stack.wait(lambda: api_root_matches_cluster(stack, api), 5, "API root")

    state = api.ok("/api/v1/cluster/")
    assert state["brokers_up"] == 3 and state["brokers_total"] == 3
    root_name = stack.broker_name(index_of_spid(stack, root_spid))
    assert state["root"]["name"] == root_name
    flagged = [b["name"] for b in api.items("/api/v1/brokers/?is_root=true")]
    assert flagged == [root_name]
    detail = api.ok(f"/api/v1/brokers/{root_name}/")
    assert detail["is_root"] and detail["ready"] and detail["heartbeat_age"] < 5
    assert len(detail["view"]["peers"]) == 2

    samples = api.ok(f"/api/v1/heartbeats/?broker={root_name}")
    assert samples["count"] >= 1 and samples["results"][0]["broker"] == root_name

    endpoints = api.ok("/api/v1/endpoints/")
    urls = sorted(e["url"] for e in endpoints)
    assert urls == sorted(f"amqp://{name}/%2F" for name in names)


def connect(stack: ConsoleStack, index: int) -> pika.BlockingConnection:
    assert stack.cluster is not None
    params = pika.ConnectionParameters(
        "127.0.0.1",
        stack.cluster.ports[index],
        credentials=pika.PlainCredentials("guest", "guest"),
    )
    return pika.BlockingConnection(params)


def root_and_others(stack: ConsoleStack, api: Api) -> tuple[str, list[int]]:
    """The root's name, and the indexes of the other brokers."""
    root_spid = stack.wait(lambda: api_root_matches_cluster(stack, api), 10, "API root")
    root = index_of_spid(stack, root_spid)
    return stack.broker_name(root), [i for i in range(3) if i != root]


def test_queues_declared_on_a_broker_show_in_the_api(stack: ConsoleStack, api: Api) -> None:
    """A replicated shared queue (durable, no type) shows once, from its owner that holds
    its messages (the declaring broker: client-local), whichever broker the client
    used; its exchange and binding (wiring on every broker) once too."""
    name = f"api-q-{uuid.uuid4().hex[:8]}"
    root_and_others(stack, api)
    owner = stack.broker_name(1)
    conn = connect(stack, 1)
    try:
        channel = conn.channel()
        channel.queue_declare(name, durable=True)
        channel.exchange_declare(f"{name}-x", "direct")
        channel.queue_bind(name, f"{name}-x", routing_key="jobs")
        channel.basic_publish(f"{name}-x", "jobs", b"hello")
        channel.basic_publish("", name, b"again")

        def listed() -> dict | None:
            body = api.ok(f"/api/v1/queues/?name={name}")
            rows = body["results"]
            # every broker has a row for it, but the list shows the queue once
            return rows[0] if body["count"] == 1 and rows[0]["messages"] == 2 else None

        queue = stack.wait(listed, 10, "queue in the API with its real depth")
        assert (
            queue["broker"],
            queue["vhost"],
            queue["shared"],
            queue["master"],
            queue["type"],
        ) == (owner, "/", True, True, "replicated")
        detail = stack.wait(
            lambda: (
                (body := api.ok(f"/api/v1/queues/{queue['id']}/"))
                and len(body["per_broker"]) == 3
                and body
            ),
            10,
            "the queue's master and two proxies",
        )
        roles = {r["broker"]: r["master"] for r in detail["per_broker"]}
        assert roles == {stack.broker_name(i): stack.broker_name(i) == owner for i in range(3)}
        assert all(r["messages"] == 0 for r in detail["per_broker"] if not r["master"])
        assert api.ok(f"/api/v1/queues/?name={name}&broker={owner}")["count"] == 1

        # Exchanges and shared bindings are wiring, replicated to every broker: once each.
        def wiring_everywhere() -> tuple[dict, dict] | None:
            [exchange] = api.ok(f"/api/v1/exchanges/?name={name}-x")["results"]
            [binding] = api.ok(f"/api/v1/bindings/?destination={name}")["results"]
            ready = exchange["servers"] == 3 and binding["servers"] == 3
            return (exchange, binding) if ready else None

        exchange, binding = stack.wait(wiring_everywhere, 10, "wiring on every broker")
        assert (exchange["type"], exchange["shared"]) == ("direct", True)
        assert (binding["source"], binding["routing_key"], binding["shared"]) == (
            f"{name}-x",
            "jobs",
            True,
        )
        brokers = api.ok(f"/api/v1/exchanges/{exchange['id']}/")["per_broker"]
        assert sorted(b["broker"] for b in brokers) == sorted(
            stack.broker_name(i) for i in range(3)
        )
        for index in range(3):  # each broker has it
            has = api.ok(f"/api/v1/exchanges/?name={name}-x&broker={stack.broker_name(index)}")
            assert has["count"] == 1
        assert api.ok("/api/v1/cluster/")["shared_queues"] >= 1

        channel.queue_delete(name)
        channel.exchange_delete(f"{name}-x")
        stack.wait(
            lambda: api.ok(f"/api/v1/queues/?name={name}")["count"] == 0, 10, "queue removed"
        )
    finally:
        conn.close()


def ctl_queues(stack: ConsoleStack, index: int) -> dict[str, Any]:
    """``brokerd ctl queues --json`` on broker ``index``, as an operator would run it."""
    assert stack.cluster is not None
    data_dir = stack.cluster.nodes[index].data_dir
    done = subprocess.run(
        [sys.executable, "-m", "brokerd", "ctl", "--data-dir", str(data_dir), "queues", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_queue_moved_through_the_api_changes_owner_on_the_brokers(
    stack: ConsoleStack, api: Api
) -> None:
    """POST /queues/{id}/move/ goes through Celery to a primary, the cluster hands the
    queue over, and the new owner is what the brokers (and then the API) report."""
    assert stack.cluster is not None
    name = f"move-q-{uuid.uuid4().hex[:8]}"
    root_and_others(stack, api)
    source, target = 1, 2
    source_spid, target_spid = stack.cluster.spid(source), stack.cluster.spid(target)

    def held_by(index: int) -> dict[str, Any] | None:
        """The API's row of the queue once broker ``index`` reports holding its message."""
        rows = api.ok(f"/api/v1/queues/?name={name}")["results"]
        row = rows[0] if len(rows) == 1 else None
        owner = stack.broker_name(index)
        held = row and row["broker"] == owner and row["master"] and row["messages"] == 1
        return row if held else None

    def owner_in_ctl() -> set[str]:
        """The queue's owner as ``brokerd ctl queues --json`` shows it on each broker."""
        return {
            row["owner"]
            for index in range(3)
            for row in ctl_queues(stack, index)["queues"]
            if row["name"] == name
        }

    conn = connect(stack, source)
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.queue_declare(name, durable=True)  # replicated, owned where declared
        channel.basic_publish("", name, b"kept across the move")
        queue = stack.wait(lambda: held_by(source), 10, "the queue on its first owner")
        assert queue["type"] == "replicated" and owner_in_ctl() == {source_spid}

        status, refused = api.post(
            f"/api/v1/queues/{queue['id']}/move/", {"to": stack.broker_name(source)}
        )
        assert status == 409 and "already owns" in refused["error"]
        status, body = api.post(
            f"/api/v1/queues/{queue['id']}/move/", {"to": stack.broker_name(target)}
        )
        assert status == 202, body
        assert body["args"] == {"vhost": "/", "queue": name, "to": target_spid}
        command = wait_command(stack, api, body["id"])
        assert command["state"] == "acked", command
        assert (command["result"]["from"], command["result"]["to"]) == (source_spid, target_spid)

        stack.wait(lambda: owner_in_ctl() == {target_spid}, 10, "the new owner in brokerd ctl")
        moved = stack.wait(lambda: held_by(target), 10, "the new owner in the API")
        assert moved["type"] == "replicated"
        audit = api.ok("/api/v1/audit/?action_prefix=queue.move")["results"]
        assert any(e["details"].get("id") == body["id"] for e in audit), audit
        channel.queue_delete(name)
    finally:
        conn.close()


def test_consumers_on_two_brokers_show_as_one_queue_and_private_queues_per_server(
    stack: ConsoleStack, api: Api
) -> None:
    root, others = root_and_others(stack, api)
    first, second = others
    name = f"spread-{uuid.uuid4().hex[:8]}"
    private = f"own-{uuid.uuid4().hex[:8]}"
    conns = [connect(stack, first), connect(stack, second), connect(stack, second)]
    try:
        conns[0].channel().queue_declare(name)
        for conn in conns:
            conn.channel().basic_consume(name, lambda *_: None)
        # an exclusive queue on each non-root broker: private queues, one per server (a
        # second of the same name is refused with 405 anywhere, as RabbitMQ refuses it)
        for i, conn in enumerate(conns[:2]):
            conn.channel().queue_declare(f"{private}-{i}", exclusive=True)

        def spread() -> dict | None:
            rows = api.ok(f"/api/v1/queues/?name={name}")["results"]
            if len(rows) != 1 or rows[0]["consumers"] != 3:
                return None
            return rows[0]

        queue = stack.wait(spread, 15, "one queue with three consumers")
        # transient, no type: classic, owned by the broker it was declared on
        assert (queue["broker"], queue["master"], queue["type"]) == (
            stack.broker_name(first),
            True,
            "classic",
        )
        assert {s["broker"]: s["consumers"] for s in queue["consumer_servers"]} == {
            stack.broker_name(first): 1,
            stack.broker_name(second): 2,
        }
        for index in (first, second):
            # with the name too: the stack's other tests' queues may push it off page 1;
            # waited for: this filter reads each broker's own status, which may come
            # after the root's (where the spread above comes from)
            found = f"/api/v1/queues/?consumers_on={stack.broker_name(index)}&name={name}"

            def listed(found: str = found) -> bool:
                return [q["name"] for q in api.ok(found)["results"]] == [name]

            stack.wait(listed, 10, f"the queue listed with consumers on broker {index}")
        assert api.ok(f"/api/v1/queues/?consumers_on={root}&name={name}")["count"] == 0

        def per_server() -> list[dict] | None:
            rows = [
                row
                for i in range(2)
                for row in api.ok(f"/api/v1/queues/?name={private}-{i}")["results"]
            ]
            return rows if len(rows) == 2 else None

        rows = stack.wait(per_server, 10, "the private queues on their brokers")
        assert [r["broker"] for r in sorted(rows, key=lambda r: r["name"])] == [
            stack.broker_name(i) for i in (first, second)
        ]
        assert all(not r["shared"] and r["master"] for r in rows)
    finally:
        for conn in conns:
            conn.close()
    stack.wait(
        lambda: api.ok(f"/api/v1/queues/?name={private}")["count"] == 0,
        10,
        "exclusive queues gone with their connections",
    )
    stack.wait(
        lambda: api.ok(f"/api/v1/queues/?name={name}")["results"][0]["consumer_servers"] == [],
        10,
        "consumers gone everywhere",
    )
    conn = connect(stack, first)
    try:
        conn.channel().queue_delete(name)
    finally:
        conn.close()


def test_disabling_the_root_through_the_api_elects_another(stack: ConsoleStack, api: Api) -> None:
    old_spid = stack.wait(lambda: api_root_matches_cluster(stack, api), 10, "API root")
    old_name = stack.broker_name(index_of_spid(stack, old_spid))

    status, command = api.post(f"/api/v1/brokers/{old_name}/root/", {"enabled": False})
    assert status == 202, command
    assert command["name"] == "root.disable" and command["broker"] == old_name
    done = wait_command(stack, api, command["id"])
    assert done["state"] == "acked", done
    assert done["result"]["root_enabled"] is False

    def new_root() -> str | None:
        spid = api_root_matches_cluster(stack, api)
        return spid if spid and spid != old_spid else None

    new_spid = stack.wait(new_root, 15, "a new root in the API")
    assert api.ok("/api/v1/cluster/")["root"]["name"] != old_name
    assert stack.wait(
        lambda: api.ok(f"/api/v1/brokers/{old_name}/")["root_enabled"] is False, 5, "flag"
    )
    audit = api.ok("/api/v1/audit/?action_prefix=command.root")["results"]
    assert any(a["username"] == OPERATOR[0] and old_name in a["target"] for a in audit), audit

    # Enable it again: the cluster keeps its new root (no flapping back).
    status, command = api.post(f"/api/v1/brokers/{old_name}/root/", {"enabled": True})
    assert status == 202, command
    assert wait_command(stack, api, command["id"])["state"] == "acked"
    assert api_root_matches_cluster(stack, api) in (new_spid, None)


def test_state_dump_arrives_in_the_command_result(stack: ConsoleStack, api: Api) -> None:
    name = stack.broker_name(2)
    status, command = api.post(f"/api/v1/brokers/{name}/dump/")
    assert status == 202, command
    done = wait_command(stack, api, command["id"])
    assert done["state"] == "acked", done
    assert isinstance(done["result"]["dump"], str) and done["result"]["dump"].strip()
    listed = api.ok(f"/api/v1/commands/?broker={name}&name=state.dump")["results"]
    assert command["id"] in [c["id"] for c in listed]


def test_new_configuration_converges_on_every_broker(stack: ConsoleStack, api: Api) -> None:
    document = {
        "heartbeat": {"interval": 0.3, "timeout": 1.2, "open_timeout": 8.0},
        "limits": {"max_returns_per_second": 500},
    }
    status, version = api.post("/api/v1/configs/", {"document": document, "comment": "test"})
    assert status == 201, version
    number, checksum = version["number"], version["checksum"]
    assert len(checksum) == 16 and version["created_by"] == OPERATOR[0]

    def converged() -> dict | None:
        body = api.ok(f"/api/v1/configs/{number}/")
        return body if body["converged"] else None

    body = stack.wait(converged, 20, f"version {number} converged")
    rows = body["convergence"]
    assert sorted(r["broker"] for r in rows) == sorted(stack.broker_name(i) for i in range(3))
    assert all(r["state"] == "running" and r["checksum"] == checksum for r in rows), rows
    assert api.ok("/api/v1/configs/current/")["number"] == number
    assert api.ok("/api/v1/cluster/")["config_version"] == number

    def brokers_report_it() -> bool:
        return all(
            b["config_version"] == number and b["config_checksum"] == checksum
            for b in brokers_by_name(api).values()
        )

    stack.wait(brokers_report_it, 10, "brokers report the version in their hello/status")

    status, error = api.post("/api/v1/configs/", {"document": {"heartbeat": {"interval": -1}}})
    assert status == 422 and "heartbeat" in error["error"], error
    assert api.ok("/api/v1/configs/current/")["number"] == number


def test_killed_broker_is_marked_down_with_an_alarm_and_cleared_on_return(
    stack: ConsoleStack, api: Api
) -> None:
    assert stack.cluster is not None
    root_spid = stack.wait(lambda: api_root_matches_cluster(stack, api), 10, "API root")
    victim = next(i for i in range(3) if i != index_of_spid(stack, root_spid))
    name = stack.broker_name(victim)
    stack.cluster.servers[victim].signal(signal.SIGKILL)
    stack.cluster.servers[victim].proc.wait(5)

    def down_with_alarm() -> bool:
        broker = api.ok(f"/api/v1/brokers/{name}/")
        alarms = api.ok(f"/api/v1/alarms/?active=true&broker={name}&kind=broker.down")
        return broker["state"] == "down" and alarms["count"] == 1

    started = time.monotonic()
    stack.wait(down_with_alarm, 15, f"{name} down with an alarm")
    down_after = time.monotonic() - started
    state = api.ok("/api/v1/cluster/")
    assert state["brokers_up"] == 2 and state["alarms_active"] >= 1
    assert name not in [e["broker"] for e in api.ok("/api/v1/endpoints/")]

    stack.start_broker(victim)

    def back_and_cleared() -> bool:
        broker = api.ok(f"/api/v1/brokers/{name}/")
        active = api.ok(f"/api/v1/alarms/?active=true&broker={name}&kind=broker.down")
        return broker["state"] == "up" and active["count"] == 0

    stack.wait(back_and_cleared, 20, f"{name} up again, alarm cleared")
    cleared = api.ok(f"/api/v1/alarms/?active=false&broker={name}&kind=broker.down")["results"]
    assert cleared and cleared[0]["cleared_at"] is not None
    stack.cluster.wait_until(stack.cluster.agreed_root, timeout=20)
    print(f"broker marked down {down_after:.1f}s after kill -9")


def test_a_wrong_token_is_refused_on_the_link_and_the_api(stack: ConsoleStack) -> None:
    for headers in ({"Authorization": "Bearer not-the-token"}, {}):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            websockets.sync.client.connect(
                stack.link_url, additional_headers=headers, open_timeout=5
            )
        assert refused.value.response.status_code == 403

    # The right token opens the link (so the refusal above is about the token).
    good = {"Authorization": f"Bearer {stack.broker_token}"}
    with websockets.sync.client.connect(stack.link_url, additional_headers=good, open_timeout=5):
        pass

    anonymous = stack.api(None)
    for token in ("not-a-token", None):
        status, body = anonymous.get("/api/v1/brokers/", token=token)
        assert status == 401, body
        assert body["error"], body
    status, body = anonymous.request(
        "POST", "/api/v1/auth/token/", {"username": OPERATOR[0], "password": "wrong"}
    )
    assert status == 401 and body["error"], body


def test_a_read_only_user_reads_but_cannot_send_commands(stack: ConsoleStack, api: Api) -> None:
    viewer = stack.api(VIEWER)
    name = stack.broker_name(0)
    commands_before = api.ok("/api/v1/commands/")["count"]
    versions_before = api.ok("/api/v1/configs/")["count"]

    assert viewer.ok("/api/v1/cluster/")["brokers_total"] == 3
    assert len(viewer.items("/api/v1/brokers/")) == 3
    assert viewer.ok(f"/api/v1/brokers/{name}/")["name"] == name
    for path in ("/api/v1/commands/", "/api/v1/configs/", "/api/v1/alarms/", "/api/v1/audit/"):
        assert "results" in viewer.ok(path)

    for path, body in (
        (f"/api/v1/brokers/{name}/root/", {"enabled": False}),
        (f"/api/v1/brokers/{name}/dump/", {}),
        ("/api/v1/configs/", {"document": {}}),
    ):
        status, error = viewer.post(path, body)
        assert status == 403, (path, error)
        assert "operator" in error["error"], error

    assert api.ok("/api/v1/commands/")["count"] == commands_before
    assert api.ok("/api/v1/configs/")["count"] == versions_before


def test_api_errors_are_json(stack: ConsoleStack, api: Api) -> None:
    for path, code in (
        ("/api/v1/brokers/no-such-broker/", 404),
        ("/api/v1/nothing-here/", 404),
        ("/api/v1/brokers", 404),
        ("/api/v1/heartbeats/?since=yesterday", 400),
        ("/api/v1/configs/999999/", 404),
    ):
        status, body = api.get(path)
        assert status == code, (path, body)
        assert isinstance(body, dict) and body["error"], (path, body)
    status, body = api.post("/api/v1/brokers/1/root/", {"enabled": "maybe"})
    assert status in (400, 404) and body["error"], body
    status, body = api.request("DELETE", "/api/v1/brokers/1/")
    assert status == 405 and body["error"], body
