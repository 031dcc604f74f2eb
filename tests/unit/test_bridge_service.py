"""The bridge service's bookkeeping: definitions kept on disk (0600), one runner each,
replaced ones restarted, deleted ones stopped, passwords never in what it shows.
The runner is a stand-in here (this module's unit); the real one runs in
tests/integration/test_shovel_runner.py and test_bridges_ctl.py."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from brokerd.bridges.service import BRIDGES_MAX, BridgeError, BridgeService, DefinitionFile

DEFINITION = {
    "src-uri": "amqp://",
    "src-queue": "in",
    "dest-uri": "amqp://user:hunter2@far.example/site",
    "dest-queue": "out",
}


class FakeRunner:
    made: list[FakeRunner] = []

    def __init__(self, definition: Any, **kw: Any) -> None:
        self.definition = definition
        self.kw = kw
        self.stopped = asyncio.Event()
        self.state, self.reason, self.down_since = "running", "", None
        FakeRunner.made.append(self)

    async def run(self) -> None:
        await self.stopped.wait()

    def stop(self) -> None:
        self.stopped.set()

    def status(self) -> dict[str, Any]:
        return {"name": self.definition.name, "state": "running", "forwarded": 0}


def _service(tmp_path: Path) -> BridgeService:
    FakeRunner.made = []
    return BridgeService(
        DefinitionFile(tmp_path / "bridges.json"),
        node="n1",
        local=lambda: None,
        runner=FakeRunner,  # type: ignore[arg-type]
    )


def test_set_keeps_the_definition_privately_and_shows_it_redacted(tmp_path: Path) -> None:
    async def go() -> None:
        service = _service(tmp_path)
        answer = await service.set("s", DEFINITION)
        assert answer["definition"]["dest-uri"] == "amqp://user:***@far.example/site"
        assert "hunter2" not in json.dumps(service.list()) + json.dumps(answer)
        path = tmp_path / "bridges.json"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert json.loads(path.read_text())["/"]["s"]["dest-uri"].endswith(
            "hunter2@far.example/site"
        )
        assert len(FakeRunner.made) == 1 and service.status() == [
            {"name": "s", "state": "running", "forwarded": 0, "rate": 0.0}
        ]
        # replaced: the old runner stops, a new one runs the new definition
        await service.set("s", {**DEFINITION, "src-prefetch-count": 10})
        assert FakeRunner.made[0].stopped.is_set() and len(FakeRunner.made) == 2
        assert FakeRunner.made[1].definition.prefetch == 10
        await service.restart("s")
        assert FakeRunner.made[1].stopped.is_set() and len(FakeRunner.made) == 3
        await service.delete("s")
        assert FakeRunner.made[2].stopped.is_set() and service.list() == []
        assert json.loads(path.read_text()) == {}
        await service.close()

    asyncio.run(go())


def test_saved_bridges_start_again_and_a_broken_one_does_not_stop_the_rest(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        service = _service(tmp_path)
        await service.set("a", DEFINITION)
        await service.set("b", DEFINITION, vhost="other")
        await service.close()
        doc = json.loads((tmp_path / "bridges.json").read_text())
        doc["/"]["broken"] = {"src-uri": "http://nope"}
        (tmp_path / "bridges.json").write_text(json.dumps(doc))
        again = _service(tmp_path)
        again.start()
        await asyncio.sleep(0)  # the runners start in the service's own task
        assert [(b["vhost"], b["name"]) for b in again.list()] == [("/", "a"), ("other", "b")]
        assert len(FakeRunner.made) == 2
        await again.close()

    asyncio.run(go())


def test_refusals_name_the_field_and_never_echo_a_password(tmp_path: Path) -> None:
    async def go() -> None:
        service = _service(tmp_path)
        with pytest.raises(BridgeError) as caught:
            await service.set("s", {**DEFINITION, "dest-uri": "amqp://u:hunter2@h:99999"})
        assert caught.value.field == "dest-uri" and "hunter2" not in str(caught.value)
        with pytest.raises(BridgeError, match="no bridge 'x'"):
            await service.delete("x")
        with pytest.raises(BridgeError, match="no bridge 'x' in vhost 'v'"):
            await service.restart("x", "v")
        await service.set("b0", DEFINITION)
        for i in range(1, BRIDGES_MAX):
            service.definitions[("/", f"b{i}")] = service.definitions[("/", "b0")]
        with pytest.raises(BridgeError, match="at most"):
            await service.set("one-more", DEFINITION)
        for key in [k for k in service.definitions if k[1] != "b0"]:
            del service.definitions[key]
        await service.close()

    asyncio.run(go())


def _doc(name: str = "d", **changes: Any) -> list[dict[str, Any]]:
    return [{"name": name, "vhost": "/", "value": {**DEFINITION, **changes}}]


def test_the_documents_bridges_replace_the_saved_ones_and_refuse_ctl_changes(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        service = _service(tmp_path)
        await service.set("saved", DEFINITION)
        service.configure(_doc())
        await service._settle()
        assert FakeRunner.made[0].stopped.is_set()  # the saved one no longer runs
        assert [r.definition.name for r in service.runners.values()] == ["d"]
        assert [b["name"] for b in service.list()] == ["d"]
        assert "hunter2" not in json.dumps(service.list())
        with pytest.raises(BridgeError, match="configuration document"):
            await service.set("other", DEFINITION)
        with pytest.raises(BridgeError, match="configuration document"):
            await service.delete("d")
        # a changed definition restarts it; an unchanged one keeps its runner
        service.configure(_doc(**{"src-prefetch-count": 5}))
        await service._settle()
        running = service.runners[("/", "d")]
        assert running.definition.prefetch == 5 and len(FakeRunner.made) == 3
        service.configure(_doc(**{"src-prefetch-count": 5}))
        await service._settle()
        assert len(FakeRunner.made) == 3 and service.runners[("/", "d")] is running
        # the part gone from the document: the saved ones run again
        service.configure(None)
        await service._settle()
        assert [r.definition.name for r in service.runners.values()] == ["saved"]
        await service.close()
        assert not service.runners

    asyncio.run(go())


def test_a_document_bridge_runs_only_where_it_is_placed(tmp_path: Path) -> None:
    async def go() -> None:
        service = _service(tmp_path)
        here: set[tuple[str, str]] = set()
        service.runs_here = here.__contains__
        service.configure(_doc("a") + _doc("b"))
        await service._settle()
        assert service.wanted() == [("/", "a"), ("/", "b")] and not service.runners
        here.add(("/", "b"))  # placed here: the next tick starts it
        service.tick()
        await service._settle()
        assert list(service.runners) == [("/", "b")]
        here.clear()  # moved away, or cut off from the root: stopped
        service.tick()
        await service._settle()
        assert not service.runners and FakeRunner.made[0].stopped.is_set()
        await service.close()

    asyncio.run(go())


def test_a_bridge_down_past_the_threshold_or_terminated_raises_the_alarm(
    tmp_path: Path,
) -> None:
    from brokerd.bridges.service import BRIDGE_ALARM_AFTER

    async def go() -> None:
        service = _service(tmp_path)
        await service.set("a", DEFINITION)
        runner = FakeRunner.made[0]
        runner.state, runner.reason, runner.down_since = "starting", "connection refused", 100.0
        assert service.alarm(now=100.0 + BRIDGE_ALARM_AFTER - 1) is None  # not yet
        alarm = service.alarm(now=100.0 + BRIDGE_ALARM_AFTER)
        assert alarm is not None and alarm["kind"] == "bridge-down" and alarm["since"] == 100.0
        assert "bridge a (vhost /)" in alarm["message"] and "connection refused" in alarm["message"]
        runner.state, runner.down_since = "running", None  # recovered: cleared
        assert service.alarm(now=1e9) is None
        runner.state, runner.reason, runner.down_since = "terminated", "ACCESS_REFUSED", 500.0
        assert service.alarm(now=500.0) is not None  # at once
        await service.close()

    asyncio.run(go())
