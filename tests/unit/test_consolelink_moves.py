"""The broker's side of queue.move and queues.rebalance: arguments, the host, refusals."""

from __future__ import annotations

from typing import Any

import pytest

from brokerd.consolelink.commands import ConsoleCommands
from brokerd.consolelink.host import HostRefused


class MovingHost:
    """Just what the two commands touch: records each call, refuses when told to."""

    def __init__(self, refuse: str = "") -> None:
        self.refuse = refuse
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def move_queue(self, vhost: str, name: str, to: str) -> dict[str, Any]:
        self.calls.append(("move_queue", (vhost, name, to)))
        if self.refuse:
            raise HostRefused(self.refuse)
        return {"queue": name, "from": "spid-a", "to": to, "state": "requested"}

    def rebalance_queues(self, vhost: str) -> dict[str, Any]:
        self.calls.append(("rebalance_queues", (vhost,)))
        if self.refuse:
            raise HostRefused(self.refuse)
        return {"moves": [{"queue": "q1", "from": "spid-a", "to": "spid-b"}]}


def command(command_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"v": 1, "type": "command", "id": command_id, "command": name, "args": args}


MOVE = {"vhost": "/", "queue": "orders", "to": "spid-b"}


def test_a_move_asks_the_host_and_acks_its_answer() -> None:
    host = MovingHost()
    ack = ConsoleCommands(host).handle(command("m1", "queue.move", **MOVE))  # type: ignore[arg-type]
    assert ack["ok"] and ack["error"] is None
    assert ack["result"] == {
        "queue": "orders",
        "from": "spid-a",
        "to": "spid-b",
        "state": "requested",
    }
    assert host.calls == [("move_queue", ("/", "orders", "spid-b"))]


def test_a_retried_move_is_answered_as_before_without_moving_again() -> None:
    host = MovingHost()
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    first = commands.handle(command("m1", "queue.move", **MOVE))
    assert commands.handle(command("m1", "queue.move", **MOVE)) == first
    assert len(host.calls) == 1


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"queue": "orders", "to": "spid-b"}, "queue.move needs 'vhost', a non-empty string"),
        ({"vhost": "/", "to": "spid-b"}, "needs 'queue'"),
        ({"vhost": "/", "queue": "orders"}, "needs 'to'"),
        ({**MOVE, "to": 7}, "needs 'to', a non-empty string"),
        ({**MOVE, "queue": ""}, "needs 'queue', a non-empty string"),
        ({**MOVE, "queue": ["orders"]}, "needs 'queue'"),
        ({**MOVE, "queue": "é" * 128}, "'queue' is longer than 255 bytes"),
    ],
)
def test_bad_move_arguments_are_refused_before_the_host_is_asked(args, error) -> None:
    host = MovingHost()
    ack = ConsoleCommands(host).handle(command("m2", "queue.move", **args))  # type: ignore[arg-type]
    assert not ack["ok"] and error in ack["error"], ack
    assert host.calls == []


def test_what_the_host_refuses_fails_the_command_with_its_reason() -> None:
    host = MovingHost(refuse="queue 'orders' is classic: it cannot move")
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    ack = commands.handle(command("m3", "queue.move", **MOVE))
    assert ack == {
        "type": "ack",
        "id": "m3",
        "ok": False,
        "result": None,
        "error": "queue 'orders' is classic: it cannot move",
    }
    refused = commands.handle(command("r1", "queues.rebalance", vhost="/"))
    assert not refused["ok"] and "classic" in refused["error"]


def test_a_rebalance_acks_the_moves_it_ordered() -> None:
    host = MovingHost()
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    ack = commands.handle(command("r2", "queues.rebalance", vhost="/"))
    assert ack["ok"] and ack["result"]["moves"] == [
        {"queue": "q1", "from": "spid-a", "to": "spid-b"}
    ]
    assert host.calls == [("rebalance_queues", ("/",))]
    missing = commands.handle(command("r3", "queues.rebalance"))
    assert not missing["ok"] and "queues.rebalance needs 'vhost'" in missing["error"]


def test_the_unknown_command_error_lists_every_command() -> None:
    ack = ConsoleCommands(MovingHost()).handle(command("u1", "queue.teleport"))  # type: ignore[arg-type]
    assert not ack["ok"]
    assert ack["error"] == (
        "unknown command 'queue.teleport' (known: config.apply, root.enable, root.disable, "
        "state.dump, queue.move, queues.rebalance, cluster.forget, queues.grow, queues.shrink)"
    )
