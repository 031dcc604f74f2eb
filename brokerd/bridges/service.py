"""The bridges one server runs: their definitions, and one runner each.

Definitions come from one of two places:

- the console's configuration document, when it has a ``bridges`` part
  (``configure``): in a cluster each runs on the one server the root placed it
  on (``cluster.ownership.bridges``), and only while that server is part of
  the cluster (``runs_here``); standalone, every one runs here;
- else, on a standalone server, ``brokerd ctl bridges set NAME JSON``
  (RabbitMQ's ``rabbitmqctl set_parameter shovel NAME JSON``), kept in
  ``DATA_DIR/bridges.json`` (mode 0600: the URIs carry passwords); a restart
  of the server starts them again.

``reconcile`` makes the runners match what should run here; the server calls
it at each tick too, so a placement or a root link that changes starts or
stops runners within a heartbeat. Whatever leaves this service for a person
(``list``, ``status``, errors) has its passwords redacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from brokerd.bridges.definitions import DefinitionError, ShovelDefinition, parse_shovel
from brokerd.bridges.runner import TERMINATED, LocalBroker, ShovelRunner
from brokerd.bridges.uri import redact

log = logging.getLogger("brokerd.bridges")

FILE_NAME = "bridges.json"
#: bridges one server runs at most (each holds two connections and a window)
BRIDGES_MAX = 256
#: seconds a bridge may stay down (starting, blocked) before the ``bridge-down``
#: alarm; a terminated one (refused credentials, a failed certificate) raises it at once
BRIDGE_ALARM_AFTER = 30.0


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
        write_private(self.path, doc)


async def wait_stopped(task: asyncio.Task[None], patience: float = 5.0) -> None:
    """Let a stopped runner's task end (what was in flight goes back to its source);
    one that takes longer than ``patience`` seconds is cancelled."""
    try:
        await asyncio.wait_for(asyncio.shield(task), patience)
    except TimeoutError:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def write_private(path: Path, doc: object) -> None:
    """``doc`` as JSON at ``path``, replaced atomically, readable by this user only
    (definitions carry the far brokers' passwords)."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(doc, out, indent=1, sort_keys=True)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def down_alarm(
    kind: str, runners: dict[Any, ShovelRunner], now: float, describe: Callable[[Any], str]
) -> dict[str, Any] | None:
    """``kind`` alarm for ``runners``: one terminated, or down past
    ``BRIDGE_ALARM_AFTER`` (None: none is); ``describe(key)`` names the eldest."""
    down = sorted(
        (runner.down_since, key, runner)
        for key, runner in runners.items()
        if runner.down_since is not None
        and (runner.state == TERMINATED or now - runner.down_since >= BRIDGE_ALARM_AFTER)
    )
    if not down:
        return None
    since, key, runner = down[0]
    more = f" (and {len(down) - 1} more)" if len(down) > 1 else ""
    return {
        "kind": kind,
        "message": f"{describe(key)} is down: {runner.state}: {redact(runner.reason)}{more}",
        "since": since,
    }


class Rates:
    """Each runner's ``status`` row with ``rate``: messages forwarded per second over
    the last second or more (whoever asks, however often)."""

    def __init__(self) -> None:
        #: per runner key: (when, forwarded then, the rate measured then)
        self._seen: dict[Any, tuple[float, int, float]] = {}

    def rows(self, runners: dict[Any, ShovelRunner]) -> list[dict[str, Any]]:
        now = time.monotonic()
        rows = []
        for key, runner in sorted(runners.items()):
            row = runner.status()
            then, forwarded, rate = self._seen.get(key, (now, row["forwarded"], 0.0))
            if now - then >= 1.0:
                rate = (row["forwarded"] - forwarded) / (now - then)
                then, forwarded = now, row["forwarded"]
            self._seen[key] = (then, forwarded, rate)
            row["rate"] = round(max(rate, 0.0), 1)
            rows.append(row)
        for key in self._seen.keys() - runners.keys():
            del self._seen[key]
        return rows


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
        #: the bridges ``ctl bridges set`` saved (``bridges.json``)
        self.definitions: dict[tuple[str, str], ShovelDefinition] = {}
        #: the configuration document's bridges (None: it has no ``bridges`` part)
        self.document: dict[tuple[str, str], ShovelDefinition] | None = None
        #: a document bridge runs here now (a cluster: placed here, the root linked)
        self.runs_here: Callable[[tuple[str, str]], bool] = lambda _key: True
        #: where a document bridge is placed, for ``list`` ("" standalone)
        self.where: Callable[[tuple[str, str]], str] = lambda _key: ""
        #: document bridges that reached their ``src-delete-after``: not run again
        #: until the document changes their definition
        self.finished: dict[tuple[str, str], ShovelDefinition] = {}
        self.runners: dict[tuple[str, str], ShovelRunner] = {}
        self.tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        #: the definition each runner runs
        self.running: dict[tuple[str, str], ShovelDefinition] = {}
        self._reconciling: asyncio.Task[None] | None = None
        self._again = False
        self._closed = False
        #: messages the runners stopped since the start had forwarded (``forwarded_total``)
        self.retired_forwarded = 0
        self._rates = Rates()

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
        self.reconcile()

    async def close(self) -> None:
        self._closed = True
        if self._reconciling is not None:
            await asyncio.shield(self._reconciling)
        for key in list(self.tasks):
            await self._stop(key)

    def configure(self, bridges: list[dict[str, Any]] | None) -> None:
        """The configuration document's bridges, validated (``configdoc``); None: the
        document has no ``bridges`` part, and those ``ctl bridges set`` saved run."""
        if bridges is None:
            self.document = None
        else:
            before = self.document or {}
            document: dict[tuple[str, str], ShovelDefinition] = {}
            for b in bridges:
                key = (b["vhost"], b["name"])
                same = before.get(key)
                # an unchanged definition keeps its runner (every push carries them all)
                if same is None or same.document != b["value"]:
                    same = parse_shovel(b["name"], b["value"], b["vhost"])
                document[key] = same
            self.document = document
        self.reconcile()

    def wanted(self) -> list[tuple[str, str]]:
        """The document's bridges, for the root to place."""
        return sorted(self.document or ())

    def should_run(self) -> dict[tuple[str, str], ShovelDefinition]:
        """What runs here now, by key."""
        if self._closed:
            return {}
        if self.document is None:
            return dict(self.definitions)
        return {
            key: d
            for key, d in self.document.items()
            if self.runs_here(key) and self.finished.get(key) != d
        }

    def tick(self) -> None:
        """The server's tick: a placement or a root link may have changed."""
        wanted = self.should_run()
        if wanted.keys() != self.running.keys() or any(
            self.running[key] is not d for key, d in wanted.items()
        ):
            self.reconcile()

    def reconcile(self) -> None:
        """Start and stop runners until they match ``should_run`` (in a task: a
        runner stops in its own time, and requests must not interleave)."""
        if self._reconciling is not None and not self._reconciling.done():
            self._again = True
            return
        try:
            self._reconciling = asyncio.ensure_future(self._reconcile())
        except RuntimeError:  # no loop: nothing runs (unit tests of the parts)
            self._reconciling = None

    async def _reconcile(self) -> None:
        while True:
            self._again = False
            wanted = self.should_run()
            for key in [k for k, d in self.running.items() if wanted.get(k) is not d]:
                await self._stop(key)
            for key, definition in wanted.items():
                if key not in self.running and len(self.running) < BRIDGES_MAX:
                    self._run(key, definition)
            if not self._again:
                return

    def _run(self, key: tuple[str, str], definition: ShovelDefinition) -> None:
        runner = self.make_runner(
            definition, node=self.node, local=self.local(), on_done=self._done(key)
        )
        self.runners[key] = runner
        self.running[key] = definition
        self.tasks[key] = asyncio.ensure_future(runner.run())

    async def _stop(self, key: tuple[str, str]) -> None:
        self.running.pop(key, None)
        runner, task = self.runners.pop(key, None), self.tasks.pop(key, None)
        if runner is not None:
            runner.stop()
            self._retire(runner)
        if task is not None:
            await wait_stopped(task)

    def _done(self, key: tuple[str, str]) -> Callable[[str], None]:
        def done(_name: str) -> None:
            # src-delete-after reached: the shovel deletes itself, as in RabbitMQ (one
            # of the document's is not run again until its definition changes there)
            log.warning("bridge=%s vhost=%s done (src-delete-after): deleted", key[1], key[0])
            definition = self.running.pop(key, None)
            runner = self.runners.pop(key, None)
            if runner is not None:
                self._retire(runner)
            self.tasks.pop(key, None)
            if self.document is not None and key in self.document:
                if definition is not None:
                    self.finished[key] = definition
                return
            self.definitions.pop(key, None)
            self._save()

        return done

    def _save(self) -> None:
        self.file.save({key: d.document for key, d in self.definitions.items()})

    # -- requests (ctl, and later the configuration document) ------------------------------

    async def set(self, name: str, value: object, vhost: str = "/") -> dict[str, Any]:
        """Create or replace bridge ``name``; a replaced one restarts with the new
        definition (RabbitMQ's set_parameter on an existing shovel does the same)."""
        self._not_documented()
        try:
            definition = parse_shovel(name, value, vhost)
        except DefinitionError as exc:
            raise BridgeError(redact(str(exc)), exc.field) from None
        key = (vhost, name)
        if key not in self.definitions and len(self.definitions) >= BRIDGES_MAX:
            raise BridgeError(f"at most {BRIDGES_MAX} bridges on one server")
        self.definitions[key] = definition
        self._save()
        await self._settle()
        return {"name": name, "vhost": vhost, "definition": definition.public()}

    async def delete(self, name: str, vhost: str = "/") -> dict[str, Any]:
        self._not_documented()
        key = self._known(name, vhost)
        del self.definitions[key]
        self._save()
        await self._settle()
        return {"name": name, "vhost": vhost, "deleted": True}

    async def restart(self, name: str, vhost: str = "/") -> dict[str, Any]:
        key = self._known(name, vhost)
        definition = self.running.get(key)
        if definition is None:
            raise BridgeError(f"bridge '{name}' in vhost '{vhost}' does not run on this server")
        await self._stop(key)
        self._run(key, definition)
        return {"name": name, "vhost": vhost, "restarted": True}

    async def _settle(self) -> None:
        """Reconcile now and wait for it (a request answers once it is in force)."""
        self.reconcile()
        while self._reconciling is not None and not self._reconciling.done():
            await asyncio.shield(self._reconciling)

    def _not_documented(self) -> None:
        if self.document is not None:
            raise BridgeError(
                "bridges come from the console's configuration document here: change them "
                "there (the console or the REST API)"
            )

    def list(self) -> list[dict[str, Any]]:
        if self.document is not None:
            return [
                {
                    "name": name,
                    "vhost": vhost,
                    "definition": d.public(),
                    "node": self.where((vhost, name)),
                }
                for (vhost, name), d in sorted(self.document.items())
            ]
        return [
            {"name": name, "vhost": vhost, "definition": d.public()}
            for (vhost, name), d in sorted(self.definitions.items())
        ]

    def alarm(self, now: float | None = None) -> dict[str, Any] | None:
        """The ``bridge-down`` alarm (the server's alarm list, hence the console's), or
        None: a bridge here terminated, or down past ``BRIDGE_ALARM_AFTER``. It clears
        by itself once they run again."""
        now = time.time() if now is None else now
        return down_alarm(
            "bridge-down", self.runners, now, lambda key: f"bridge {key[1]} (vhost {key[0]})"
        )

    def _retire(self, runner: ShovelRunner) -> None:
        """A runner leaves: what it forwarded stays in ``forwarded_total``."""
        self.retired_forwarded += runner.status().get("forwarded", 0)

    def forwarded_total(self) -> int:
        """Messages this server's bridges forwarded since it started (a counter that
        only grows: the console's heartbeat history, and the traffic reports)."""
        running = sum(r.status().get("forwarded", 0) for r in self.runners.values())
        return self.retired_forwarded + running

    def status(self) -> list[dict[str, Any]]:
        """Each runner's status, with ``rate``: messages forwarded per second, over the
        last second or more (whoever asks, however often)."""
        return self._rates.rows(self.runners)

    def _known(self, name: str, vhost: str) -> tuple[str, str]:
        key = (vhost, name)
        if key not in (self.definitions if self.document is None else self.document):
            raise BridgeError(f"no bridge '{name}' in vhost '{vhost}'")
        return key
