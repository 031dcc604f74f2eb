"""The broker's side of cluster.forget and of the members in every status: arguments, the
host, refusals, an ack that comes later than the acks sent after it, and the link
reading on while a forget waits for the root."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.asyncio.server import ServerConnection, serve

from brokerd.consolelink import messages
from brokerd.consolelink.commands import ConsoleCommands
from brokerd.consolelink.host import HostRefused
from brokerd.consolelink.link import ConsoleLink
from brokerd.consolelink.session import ConsoleSession
from brokerd.server.app import Server, ServerOptions

TABLE = {
    "version": 2,
    "term": 3,
    "node": "0123456789abcdef",
    "committed": True,
    "forgotten": [{"address": "10.0.0.5:5672", "node": "fedcba9876543210"}],
    "joining": False,
    "checksum": "aa11bb22cc33dd44",
    "root": "spid-a",
    "members": [
        {"address": "10.0.0.1:5672", "spid": "spid-a", "type": "primary", "state": "self"},
        {"address": "10.0.0.4:5672", "spid": None, "type": "primary", "state": "never heard"},
    ],
}


class ForgettingHost:
    """Just what cluster.forget and a clustered status touch: records each forget,
    refuses or fails when told to, and waits on ``gate`` when one is set."""

    def __init__(self, refuse: str = "", worker_of: tuple[str, int, int] | None = None) -> None:
        self.refuse = refuse
        self.worker_of = worker_of
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None
        self.calls: list[str] = []

    async def forget_member(self, address: str) -> dict[str, Any]:
        self.calls.append(address)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        if self.refuse:
            raise HostRefused(self.refuse)
        return {"forgotten": address, "version": 3, "committed": True, "members": ["a:1"]}

    # -- a clustered server's status ------------------------------------------------

    def cluster_status(self) -> dict[str, Any]:
        return {"is_root": True, "root": "spid-a", "ready": True, "checksum": "c", "peers": []}

    def cluster_members(self) -> dict[str, Any]:
        return TABLE

    def resource_alarms(self) -> list[dict[str, Any]]:
        return []

    def resource_status(self) -> dict[str, Any]:
        return {}

    def bridge_status(self) -> list[dict[str, Any]]:
        return []

    def loop_status(self) -> dict[str, Any]:
        return {}


def command(command_id: str, name: str = "cluster.forget", **args: Any) -> dict[str, Any]:
    return {"v": 1, "type": "command", "id": command_id, "command": name, "args": args}


async def test_a_forget_asks_the_host_and_acks_its_answer_when_it_ends() -> None:
    host = ForgettingHost()
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    pending = commands.handle(command("f1", address=" Node4.Example:5701"))
    assert isinstance(pending, asyncio.Future)  # answered later, not at once
    ack = await pending
    assert ack == {
        "type": "ack",
        "id": "f1",
        "ok": True,
        "result": {
            "forgotten": "node4.example:5701",
            "version": 3,
            "committed": True,
            "members": ["a:1"],
        },
        "error": None,
    }
    assert host.calls == ["node4.example:5701"]  # normalised as the members list it
    assert commands.handle(command("f1", address="node4.example:5701")) == ack
    assert host.calls == ["node4.example:5701"]  # a retry after the end: the same answer


async def test_a_port_left_out_is_5672_as_ctl_takes_it() -> None:
    host = ForgettingHost()
    ack = await ConsoleCommands(host).handle(command("f2", address="node4"))  # type: ignore[arg-type,misc]
    assert ack["ok"] and host.calls == ["node4:5672"]


async def test_what_the_root_refuses_fails_the_command_with_its_reason() -> None:
    reason = "10.0.0.4:5672 is running (spid s4): stop it before forgetting it"
    host = ForgettingHost(refuse=reason)
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    ack = await commands.handle(command("f3", address="10.0.0.4:5672"))  # type: ignore[misc]
    assert ack == {"type": "ack", "id": "f3", "ok": False, "result": None, "error": reason}
    assert commands.handle(command("f3", address="10.0.0.4:5672")) == ack
    assert host.calls == ["10.0.0.4:5672"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({}, "cluster.forget needs 'address', a non-empty string"),
        ({"address": ""}, "needs 'address', a non-empty string"),
        ({"address": 5672}, "needs 'address', a non-empty string"),
        ({"address": "node4:http"}, "has a bad port"),
        ({"address": "node4:70000"}, "port is out of range"),
        ({"address": ":5672"}, "has no host name"),
        ({"address": "unix:/run/rookery/w1.sock"}, "must be HOST:PORT, not a link socket"),
        ({"address": "n" * 300}, "'address' is longer than 255 bytes"),
    ],
)
def test_a_bad_address_is_refused_at_once_before_the_host_is_asked(args, error) -> None:
    host = ForgettingHost()
    ack = ConsoleCommands(host).handle(command("f4", **args))  # type: ignore[arg-type]
    assert isinstance(ack, dict) and not ack["ok"] and error in ack["error"], ack
    assert host.calls == []


def test_a_worker_of_a_host_has_no_members_to_forget() -> None:
    host = ForgettingHost(worker_of=("10.0.0.1:5672", 1, 2))
    ack = ConsoleCommands(host).handle(command("f5", address="10.0.0.4:5672"))  # type: ignore[arg-type]
    assert isinstance(ack, dict) and not ack["ok"]
    assert "a worker of a host has no cluster members to forget" in ack["error"]
    assert host.calls == []


async def test_a_retry_while_the_forget_runs_gets_the_same_answer_without_a_second_ask() -> None:
    host = ForgettingHost()
    host.gate = asyncio.Event()
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    first = commands.handle(command("f6", address="10.0.0.4:5672"))
    await asyncio.sleep(0)
    again = commands.handle(command("f6", address="10.0.0.4:5672"))
    assert again is first and not first.done()  # type: ignore[union-attr]
    host.gate.set()
    assert (await first)["ok"]  # type: ignore[misc]
    assert host.calls == ["10.0.0.4:5672"]


async def test_a_forget_that_breaks_is_answered_with_the_error_not_left_unanswered() -> None:
    host = ForgettingHost()
    host.fail = RuntimeError("state log closed")
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    ack = await commands.handle(command("f7", address="10.0.0.4:5672"))  # type: ignore[misc]
    assert not ack["ok"] and ack["error"] == "cluster.forget failed: state log closed"


def test_every_clustered_status_carries_the_members_table() -> None:
    view = messages.view(ForgettingHost())  # type: ignore[arg-type]
    assert view["members"] == TABLE
    json.dumps(view)  # sent as is


def test_a_standalone_broker_says_nothing_of_members(tmp_path: Path) -> None:
    server = Server(ServerOptions(bind="127.0.0.1", port=5998, data_dir=tmp_path))
    assert server.cluster_members() is None
    assert "members" not in messages.view(server)


async def test_a_standalone_server_refuses_the_forget(tmp_path: Path) -> None:
    server = Server(ServerOptions(bind="127.0.0.1", port=5998, data_dir=tmp_path))
    ack = await ConsoleCommands(server).handle(command("f8", address="10.0.0.4:5672"))  # type: ignore[misc]
    assert ack["error"] == "cluster.forget needs a clustered broker (--cluster)"


class GatedServer:
    """A real (never started) standalone server whose forget waits on a gate: the
    link's ``hello``, statuses and other commands are the server's own."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    async def forget_member(self, address: str) -> dict[str, Any]:
        await self.gate.wait()
        return {"forgotten": address, "version": 1, "committed": True, "members": []}


async def test_the_link_reads_and_answers_on_while_a_forget_waits(tmp_path: Path) -> None:
    """Over a real websocket: a state.dump sent after a forget is answered first, then
    the forget's ack once the root answered it."""
    host = GatedServer(Server(ServerOptions(bind="127.0.0.1", port=5997, data_dir=tmp_path)))
    acks: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def console(ws: ServerConnection) -> None:
        async for text in ws:
            message = json.loads(text)
            if message["type"] == "hello":
                await ws.send(json.dumps(command("f9", address="10.0.0.4:5672")))
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
            forget = await asyncio.wait_for(acks.get(), 10)
            assert forget["id"] == "f9" and forget["ok"]
            assert forget["result"]["forgotten"] == "10.0.0.4:5672"
        finally:
            with contextlib.suppress(websockets.ConnectionClosed):
                await link.stop()


async def test_a_session_hands_the_link_a_future_for_a_forget() -> None:
    host = ForgettingHost()
    session = ConsoleSession(host, ConsoleCommands(host))  # type: ignore[arg-type]
    [reply] = session.receive(json.dumps(command("f10", address="10.0.0.4:5672")))
    assert isinstance(reply, asyncio.Future)
    assert (await reply)["id"] == "f10"
