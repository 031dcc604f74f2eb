"""The broker's side of queues.grow and queues.shrink: arguments, the host, refusals as a
whole and per queue, an ack that comes once the root answered, and the link reading on
while a grow waits."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.server import ServerConnection, serve

from brokerd.consolelink.commands import ConsoleCommands
from brokerd.consolelink.host import HostRefused
from brokerd.consolelink.link import ConsoleLink
from brokerd.consolelink.session import ConsoleSession
from brokerd.server.app import Server, ServerOptions

SHRINK_REFUSED = "queue 'pair' is kept by 2 members: fewer would not be a majority of its group"


class RegroupingHost:
    """Just what queues.grow|shrink touch: records each change, answers per queue as
    the root would, refuses or fails when told to, and waits on ``gate`` when set."""

    def __init__(self, refuse: str = "", worker_of: tuple[str, int, int] | None = None) -> None:
        self.refuse = refuse
        self.worker_of = worker_of
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None
        self.calls: list[tuple[str, str]] = []

    async def change_groups(self, action: str, address: str) -> dict[str, Any]:
        self.calls.append((action, address))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        if self.refuse:
            raise HostRefused(self.refuse)
        queues = [
            {"queue": "trio", "changed": True, "group": ["a:1", "b:1"], "reason": ""},
            {"queue": "pair", "changed": False, "group": ["a:1", address], "reason": ""},
        ]
        if action == "shrink":
            queues[1]["reason"] = SHRINK_REFUSED
        return {"address": address, "action": action, "queues": queues}


def command(command_id: str, name: str = "queues.grow", **args: Any) -> dict[str, Any]:
    return {"v": 1, "type": "command", "id": command_id, "command": name, "args": args}


@pytest.mark.parametrize("action", ["grow", "shrink"])
async def test_a_change_asks_the_host_and_acks_each_queues_answer_when_it_ends(action) -> None:
    host = RegroupingHost()
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    pending = commands.handle(command("g1", f"queues.{action}", address=" Node3.Example:5703"))
    assert isinstance(pending, asyncio.Future)  # answered later, not at once
    ack = await pending
    assert ack["ok"] and ack["error"] is None and ack["id"] == "g1"
    assert ack["result"]["address"] == "node3.example:5703"
    assert ack["result"]["action"] == action
    assert [(q["queue"], q["changed"]) for q in ack["result"]["queues"]] == [
        ("trio", True),
        ("pair", False),
    ]
    assert host.calls == [(action, "node3.example:5703")]  # normalised as the members list it
    assert commands.handle(command("g1", f"queues.{action}", address="x:1")) == ack
    assert len(host.calls) == 1  # a retry after the end: the same answer


async def test_the_roots_refusal_of_one_queue_is_in_the_result_not_an_error() -> None:
    ack = await ConsoleCommands(RegroupingHost()).handle(  # type: ignore[arg-type,misc]
        command("g2", "queues.shrink", address="10.0.0.3:5672")
    )
    assert ack["ok"]
    [pair] = [q for q in ack["result"]["queues"] if q["queue"] == "pair"]
    assert not pair["changed"] and pair["reason"] == SHRINK_REFUSED


async def test_what_the_host_refuses_fails_the_command_with_its_reason() -> None:
    reason = "queues.grow needs a clustered broker (--cluster)"
    host = RegroupingHost(refuse=reason)
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    ack = await commands.handle(command("g3", address="10.0.0.3:5672"))  # type: ignore[misc]
    assert ack == {"type": "ack", "id": "g3", "ok": False, "result": None, "error": reason}
    assert commands.handle(command("g3", address="10.0.0.3:5672")) == ack


@pytest.mark.parametrize("name", ["queues.grow", "queues.shrink"])
@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({}, "needs 'address', a non-empty string"),
        ({"address": ["10.0.0.3:5672"]}, "needs 'address', a non-empty string"),
        ({"address": "node3:amqp"}, "has a bad port"),
        ({"address": "node3:0"}, "port is out of range"),
        ({"address": "unix:/run/rookery/w1.sock"}, "must be HOST:PORT, not a link socket"),
        ({"address": "n" * 300}, "'address' is longer than 255 bytes"),
    ],
)
def test_a_bad_address_is_refused_at_once_before_the_host_is_asked(name, args, error) -> None:
    host = RegroupingHost()
    ack = ConsoleCommands(host).handle(command("g4", name, **args))  # type: ignore[arg-type]
    assert isinstance(ack, dict) and not ack["ok"] and error in ack["error"], ack
    assert ack["error"].startswith(name)
    assert host.calls == []


def test_a_worker_of_a_host_has_no_groups_to_change() -> None:
    host = RegroupingHost(worker_of=("10.0.0.1:5672", 1, 2))
    ack = ConsoleCommands(host).handle(command("g5", "queues.shrink", address="10.0.0.3:5672"))  # type: ignore[arg-type]
    assert isinstance(ack, dict) and not ack["ok"]
    assert ack["error"] == "queues.shrink: a worker of a host has no quorum groups to change"
    assert host.calls == []


async def test_a_retry_while_the_change_runs_gets_the_same_answer_without_a_second_ask() -> None:
    host = RegroupingHost()
    host.gate = asyncio.Event()
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    first = commands.handle(command("g6", address="10.0.0.3:5672"))
    await asyncio.sleep(0)
    again = commands.handle(command("g6", address="10.0.0.3:5672"))
    assert again is first and not first.done()  # type: ignore[union-attr]
    host.gate.set()
    assert (await first)["ok"]  # type: ignore[misc]
    assert host.calls == [("grow", "10.0.0.3:5672")]


async def test_a_change_that_breaks_is_answered_with_the_error_not_left_unanswered() -> None:
    host = RegroupingHost()
    host.fail = RuntimeError("state log closed")
    ack = await ConsoleCommands(host).handle(command("g7", address="10.0.0.3:5672"))  # type: ignore[arg-type,misc]
    assert not ack["ok"] and ack["error"] == "queues.grow failed: state log closed"


@pytest.mark.parametrize("name", ["queues.grow", "queues.shrink"])
async def test_a_standalone_server_refuses_the_change(tmp_path: Path, name: str) -> None:
    server = Server(ServerOptions(bind="127.0.0.1", port=5998, data_dir=tmp_path))
    ack = await ConsoleCommands(server).handle(command("g8", name, address="10.0.0.3:5672"))  # type: ignore[misc]
    assert ack["error"] == f"{name} needs a clustered broker (--cluster)"


class GatedServer:
    """A real (never started) standalone server whose group change waits on a gate:
    the link's ``hello``, statuses and other commands are the server's own."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    async def change_groups(self, action: str, address: str) -> dict[str, Any]:
        await self.gate.wait()
        return {"address": address, "action": action, "queues": []}


async def test_the_link_reads_and_answers_on_while_a_grow_waits(tmp_path: Path) -> None:
    """Over a real websocket: a state.dump sent after a grow is answered first, then the
    grow's ack once the root answered it."""
    host = GatedServer(Server(ServerOptions(bind="127.0.0.1", port=5997, data_dir=tmp_path)))
    acks: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def console(ws: ServerConnection) -> None:
        async for text in ws:
            message = json.loads(text)
            if message["type"] == "hello":
                await ws.send(json.dumps(command("g9", address="10.0.0.3:5672")))
                await ws.send(json.dumps(command("d9", "state.dump")))
            elif message["type"] == "ack":
                await acks.put(message)

    async with serve(console, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        link = ConsoleLink(host, f"ws://127.0.0.1:{port}/ws/brokers/", "token")  # type: ignore[arg-type]
        link.start()
        try:
            dump = await asyncio.wait_for(acks.get(), 10)
            assert dump["id"] == "d9" and dump["ok"]
            host.gate.set()
            grow = await asyncio.wait_for(acks.get(), 10)
            assert grow["id"] == "g9" and grow["ok"]
            assert grow["result"] == {"address": "10.0.0.3:5672", "action": "grow", "queues": []}
        finally:
            with contextlib.suppress(websockets.ConnectionClosed):
                await link.stop()


async def test_a_session_hands_the_link_a_future_for_a_shrink() -> None:
    host = RegroupingHost()
    session = ConsoleSession(host, ConsoleCommands(host))  # type: ignore[arg-type]
    [reply] = session.receive(json.dumps(command("g10", "queues.shrink", address="a:1")))
    assert isinstance(reply, asyncio.Future)
    assert (await reply)["id"] == "g10"
