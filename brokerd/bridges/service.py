"""The bridges one server runs: their definitions, kept on disk, and one runner each.

A standalone server takes definitions from ``brokerd ctl bridges set NAME JSON``
(RabbitMQ's ``rabbitmqctl set_parameter shovel NAME JSON``), keeps them in
``DATA_DIR/bridges.json`` (mode 0600: the URIs carry passwords) and starts a
runner for each; a restart of the server starts them again. Whatever leaves
this service for a person (``list``, ``status``, errors) has its passwords
redacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from brokerd.bridges.definitions import DefinitionError, ShovelDefinition, parse_shovel
from brokerd.bridges.runner import LocalBroker, ShovelRunner
from brokerd.bridges.uri import redact

log = logging.getLogger("brokerd.bridges")

FILE_NAME = "bridges.json"
#: bridges one server runs at most (each holds two connections and a window)
BRIDGES_MAX = 256


class BridgeError(ValueError):
    """A refused request: unknown bridge, bad definition (``field`` names the key)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class DefinitionFile:
    """``bridges.json``: {vhost: {name: definition}}, replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[tuple[str, str], dict[str, Any]]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.error("bridges file %s unreadable (%s): no bridges started", self.path, exc)
            return {}
        out: dict[tuple[str, str], dict[str, Any]] = {}
        for vhost, named in raw.items() if isinstance(raw, dict) else ():
            for name, value in named.items() if isinstance(named, dict) else ():
                out[(vhost, name)] = value
        return out

    def save(self, definitions: dict[tuple[str, str], dict[str, Any]]) -> None:
        doc: dict[str, dict[str, Any]] = {}
        for (vhost, name), value in sorted(definitions.items()):
            doc.setdefault(vhost, {})[name] = value
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(doc, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)


class BridgeService:
    """Definitions and their runners on this server."""

    def __init__(
        self,
        file: DefinitionFile,
        *,
        node: str,
        local: Callable[[], LocalBroker | None],
        runner: Callable[..., ShovelRunner] = ShovelRunner,
    ) -> None:
        self.file = file
        self.node = node
        self.local = local
        self.make_runner = runner
        self.definitions: dict[tuple[str, str], ShovelDefinition] = {}
        self.runners: dict[tuple[str, str], ShovelRunner] = {}
        self.tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    # -- life -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the saved bridges (a definition that no longer parses is logged and
        left out, never fatal: the server must come up)."""
        for (vhost, name), value in self.file.load().items():
            try:
                self.definitions[(vhost, name)] = parse_shovel(name, value, vhost)
            except DefinitionError as exc:
                log.error("bridge=%s vhost=%s not started: %s", name, vhost, redact(str(exc)))
                continue
            self._run((vhost, name))

    async def close(self) -> None:
        for key in list(self.tasks):
            await self._stop(key)

    def _run(self, key: tuple[str, str]) -> None:
        runner = self.make_runner(
            self.definitions[key], node=self.node, local=self.local(), on_done=self._done(key)
        )
        self.runners[key] = runner
        self.tasks[key] = asyncio.ensure_future(runner.run())

    async def _stop(self, key: tuple[str, str]) -> None:
        runner, task = self.runners.pop(key, None), self.tasks.pop(key, None)
        if runner is not None:
            runner.stop()
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def _done(self, key: tuple[str, str]) -> Callable[[str], None]:
        def done(_name: str) -> None:
            # src-delete-after reached: the shovel deletes itself, as in RabbitMQ
            log.warning("bridge=%s vhost=%s done (src-delete-after): deleted", key[1], key[0])
            self.definitions.pop(key, None)
            self.runners.pop(key, None)
            self.tasks.pop(key, None)
            self._save()

        return done

    def _save(self) -> None:
        self.file.save({key: d.document for key, d in self.definitions.items()})

    # -- requests (ctl, and later the configuration document) ------------------------------

    async def set(self, name: str, value: object, vhost: str = "/") -> dict[str, Any]:
        """Create or replace bridge ``name``; a replaced one restarts with the new
        definition (RabbitMQ's set_parameter on an existing shovel does the same)."""
        try:
            definition = parse_shovel(name, value, vhost)
        except DefinitionError as exc:
            raise BridgeError(redact(str(exc)), exc.field) from None
        key = (vhost, name)
        if key not in self.definitions and len(self.definitions) >= BRIDGES_MAX:
            raise BridgeError(f"at most {BRIDGES_MAX} bridges on one server")
        if key in self.tasks:
            await self._stop(key)
        self.definitions[key] = definition
        self._save()
        self._run(key)
        return {"name": name, "vhost": vhost, "definition": definition.public()}

    async def delete(self, name: str, vhost: str = "/") -> dict[str, Any]:
        key = self._known(name, vhost)
        await self._stop(key)
        del self.definitions[key]
        self._save()
        return {"name": name, "vhost": vhost, "deleted": True}

    async def restart(self, name: str, vhost: str = "/") -> dict[str, Any]:
        key = self._known(name, vhost)
        await self._stop(key)
        self._run(key)
        return {"name": name, "vhost": vhost, "restarted": True}

    def list(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "vhost": vhost, "definition": d.public()}
            for (vhost, name), d in sorted(self.definitions.items())
        ]

    def status(self) -> list[dict[str, Any]]:
        return [runner.status() for _key, runner in sorted(self.runners.items())]

    def _known(self, name: str, vhost: str) -> tuple[str, str]:
        key = (vhost, name)
        if key not in self.definitions:
            raise BridgeError(f"no bridge '{name}' in vhost '{vhost}'")
        return key
