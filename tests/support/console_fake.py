"""A websocket server playing the console (its broker link, docs/protocol.md): it
records what brokers send and sends them commands, for tests of the link."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.http11 import Request, Response

from tests.brokerd_process import free_port
from tests.support.eventually import eventually

if TYPE_CHECKING:
    from tests.cluster_harness import Cluster

TOKEN = "console-token-1"


class FakeConsole:
    """A websocket server on its own thread and loop: records what brokers send,
    sends what a test asks, refuses a wrong token with 403 like the console."""

    def __init__(
        self, port: int | None = None, token: str = TOKEN, host: str = "127.0.0.1"
    ) -> None:
        #: where it listens: a test bed's gateway for servers in namespaces
        self.host = host
        self.port = port or free_port()
        self.token = token
        self.received: list[dict[str, Any]] = []
        self.attempts: list[tuple[float, str | None]] = []
        self.connections: list[ServerConnection] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/ws/brokers/"

    def start(self) -> FakeConsole:
        self._thread.start()
        assert self._started.wait(5)
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)

    def _main(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()

        def check(connection: ServerConnection, request: Request) -> Response | None:
            header = request.headers.get("Authorization")
            self.attempts.append((time.monotonic(), header))
            if header != f"Bearer {self.token}":
                return connection.respond(HTTPStatus.FORBIDDEN, "bad broker token\n")
            return None

        async def handler(ws: ServerConnection) -> None:
            index = len(self.connections)
            self.connections.append(ws)
            async for text in ws:
                with self._lock:
                    self.received.append({**json.loads(text), "_connection": index})

        async with serve(handler, self.host, self.port, process_request=check):
            self._started.set()
            await self._stop.wait()

    def send(self, message: dict[str, Any], connection: int = -1) -> None:
        ws = self.connections[connection]
        future = asyncio.run_coroutine_threadsafe(
            ws.send(json.dumps({"v": 1, **message})), self._loop
        )
        future.result(5)

    def messages(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [m for m in self.received if m["type"] == kind]

    def wait_for(
        self, predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition"
    ) -> Any:
        return eventually(
            predicate, timeout, what, explain=lambda: f"received {len(self.received)}"
        )

    def command(self, name: str, args: dict[str, Any] | None = None, command_id: str = "") -> dict:
        """Send a command and wait for its ack."""
        command_id = command_id or str(uuid.uuid4())
        before = len([a for a in self.messages("ack") if a["id"] == command_id])
        self.send({"type": "command", "id": command_id, "command": name, "args": args or {}})
        acks = self.wait_for(
            lambda: [a for a in self.messages("ack") if a["id"] == command_id][before:],
            what=f"ack of {name}",
        )
        return acks[0]

    def statuses_after(self, seq: int) -> list[dict[str, Any]]:
        return [s for s in self.messages("status") if s["seq"] > seq]

    def apply_config(self, version: int, config: dict[str, Any], connections: int) -> None:
        """``config.apply`` on each of the first ``connections`` broker links, as the
        console pushes a version; every broker must accept it."""
        for connection in range(connections):
            command_id = str(uuid.uuid4())
            args = {"version": version, "config": config}
            self.send(
                {"type": "command", "id": command_id, "command": "config.apply", "args": args},
                connection=connection,
            )
            ack = self.wait_for(
                lambda cid=command_id: [a for a in self.messages("ack") if a["id"] == cid]
            )[0]
            if not ack["ok"]:
                raise AssertionError(f"config.apply refused: {ack}")

    def link_cluster(self, cluster: Cluster, count: int) -> None:
        """Start ``cluster``'s first ``count`` servers linked to this console, eldest
        first, and wait until they agree on a root and every link is up."""
        for index in range(count):
            cluster.start(index, extra=["--console", self.url, f"--console-token={self.token}"])
            time.sleep(0.15)
        cluster.wait_until(cluster.agreed_root)
        self.wait_for(lambda: len(self.connections) == count, what=f"{count} broker links")
