"""A whole-cluster restart gives each recovered queue back to its last owner
(``Placer.recovered``): the owner is recorded by address in the wiring store,
travels with the seeded declare while that server is not back, and the root
chooses from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pamqp import commands

from brokerd.cluster.placing import RECOVERY_WAIT, Placer
from brokerd.cluster.wiring import entries as rep
from brokerd.cluster.wiring import statelog as sl
from brokerd.cluster.wiring.entries import BucketError
from brokerd.store.wiring import StoredQueue, WiringStore


def test_the_store_keeps_each_queues_last_owner_and_forgets_it_with_the_queue(
    tmp_path: Path,
) -> None:
    store = WiringStore(tmp_path / "wiring.db")
    store.put_queue(StoredQueue("/", "q", False, {}, "j1"))
    store.put_owner("/", "q", "127.0.0.1:5701")
    store.put_owner("/", "q", "127.0.0.1:5702")  # moved: the last one counts
    store.put_owner("/", "r", "127.0.0.1:5703")
    store.put_owner("other", "q", "127.0.0.1:5704")
    store.close()
    store = WiringStore(tmp_path / "wiring.db")  # survives the restart
    assert store.owners("/") == {"q": "127.0.0.1:5702", "r": "127.0.0.1:5703"}
    store.delete_queue("/", "q")
    assert store.owners("/") == {"r": "127.0.0.1:5703"}
    store.close()


def declare(name: str = "q") -> sl.Entry:
    return rep.entry_for(commands.Queue.Declare(queue=name, durable=True), "/", origin="root")


def test_the_home_a_seeded_declare_waits_for_travels_in_its_header() -> None:
    entry = declare()
    waiting = dataclasses.replace(entry, props=sl.freeze(dict(entry.props) | {"home": "h2:5702"}))
    header = rep.entry_header(waiting)
    assert header["home"] == "h2:5702"
    back = rep.entry_from_header(header, waiting.frame)
    assert dict(back.props)["home"] == "h2:5702" and rep.placed_by(back) and not back.spid
    assert "home" not in rep.entry_header(entry) and not rep.placed_by(entry)
    with pytest.raises(BucketError, match="bad home"):
        rep.entry_from_header(header | {"home": 5}, waiting.frame)


def placer(recorded: dict[str, str], live: list[tuple[str, str]]) -> Placer:
    members: Any = SimpleNamespace(spid="root", address="h1:5701")
    p = Placer.__new__(Placer)
    p.members = members
    p.recovered_owners = recorded
    p.primaries = lambda: live  # type: ignore[method-assign]
    return p


@pytest.mark.parametrize(
    ("recorded", "spid", "home"),
    [
        ({}, "root", None),  # nothing recorded (an older store): the root's own copy
        ({"q": "h1:5701"}, "root", None),  # the root owned it
        ({"q": "h2:5702"}, "s2", None),  # its last owner is live: back to it
        ({"q": "h3:5703"}, "", "h3:5703"),  # not back yet: it waits for it
    ],
)
def test_a_recovered_queue_goes_back_to_its_last_owner_or_waits_for_it(
    recorded: dict[str, str], spid: str, home: str | None
) -> None:
    live = [("root", "h1:5701"), ("s2", "h2:5702")]
    placed = placer(recorded, live).recovered(declare())
    assert placed.spid == spid
    assert dict(placed.props).get("home") == home


def test_a_queue_waits_for_its_last_owner_for_a_bounded_time_only() -> None:
    p = placer({}, [])
    now = [0.0]
    p.members.clock = lambda: now[0]
    p.root_since = 0.0
    waiting: Any = SimpleNamespace(name="q", home="h3:5703")
    now[0] = RECOVERY_WAIT - 1
    assert not p._waited(waiting)
    now[0] = RECOVERY_WAIT
    assert p._waited(waiting)  # then it goes to the copy at hand
    assert p._waited(SimpleNamespace(name="r", home=None))  # waits for nobody
