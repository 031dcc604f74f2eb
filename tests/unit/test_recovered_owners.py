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

from brokerd.cluster.config import RECOVERY_WAIT
from brokerd.cluster.ownership.placer import Placer
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


def declare(name: str = "q", classic: bool = False) -> sl.Entry:
    arguments = {"x-queue-type": "classic"} if classic else None
    method = commands.Queue.Declare(queue=name, durable=True, arguments=arguments)
    return rep.entry_for(method, "/", origin="root")


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
    members: Any = SimpleNamespace(
        spid="root", address="h1:5701", config=SimpleNamespace(recovery_wait=RECOVERY_WAIT)
    )
    p = Placer.__new__(Placer)
    p.members = members
    p.queues = SimpleNamespace(default_queue_type=None)  # type: ignore[assignment]
    p.recovered_owners = recorded
    p.recovered_groups = {}
    p.primaries = lambda: live  # type: ignore[method-assign]
    return p


@pytest.mark.parametrize(
    ("recorded", "classic", "spid", "home"),
    [
        ({}, False, "root", None),  # nothing recorded (an older store): the root's own copy
        ({"q": "h1:5701"}, False, "root", None),  # the root owned it
        ({"q": "h2:5702"}, True, "s2", None),  # a classic queue's last owner is live
        # a replicated one waits for that server's status to show its copy
        ({"q": "h2:5702"}, False, "", "h2:5702"),
        ({"q": "h3:5703"}, False, "", "h3:5703"),  # not back yet: it waits for it
        ({"q": "h3:5703"}, True, "", "h3:5703"),
    ],
)
def test_a_recovered_queue_goes_back_to_its_last_owner_or_waits_for_it(
    recorded: dict[str, str], classic: bool, spid: str, home: str | None
) -> None:
    live = [("root", "h1:5701"), ("s2", "h2:5702")]
    placed = placer(recorded, live).recovered(declare(classic=classic))
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


class _Plane:
    """What ``_recover_elsewhere`` reads of the plane: the root's own report."""

    def __init__(self, mine: dict[str, int], fenced: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.mine = mine
        self.fenced = fenced

    def recovered_report(self) -> dict[str, int]:
        return self.mine

    def is_fenced(self, spid: str) -> bool:
        return spid in self.fenced


def recovering(
    mine: int | None, peers: dict[str, int | None], known: int = 3
) -> tuple[Placer, list[tuple[str, int, int | None]]]:
    """A root whose wait for q's last owner (h9, never back) is over: its copy's
    highest id ``mine``, and each live peer's report (None: no status with one)."""
    p = placer({}, [])
    p.queues = _Plane({} if mine is None else {"q": mine})  # type: ignore[assignment]
    p.members.clock = lambda: 100.0
    p.members.known_primaries = lambda now: known
    p.members.holds_state = True
    p.members.peers = {
        spid: SimpleNamespace(
            status=SimpleNamespace(recovered={} if top is None else {"q": top}, holds_state=True)
        )
        for spid, top in peers.items()
    }
    p._short = set()
    ordered: list[tuple[str, int, int | None]] = []
    p.order_place = lambda name, owner, epoch, home: ordered.append((name, owner, home))  # type: ignore[method-assign,assignment]
    return p, ordered


def _waiting() -> Any:
    return SimpleNamespace(name="q", home="h9:5709", epoch=4, group=None)


@pytest.mark.parametrize(
    ("mine", "peers", "heir"),
    [
        (50, {"s2": 350}, "s2"),  # the root lagged: the other copy has what it confirmed
        (350, {"s2": 50}, "root"),
        (0, {"s2": 7}, "s2"),  # the root recovered nothing of it
        (80, {"s2": 80}, "root"),  # alike: the most senior (the root is first here)
    ],
)
def test_a_queue_whose_last_owner_never_returns_goes_to_the_most_complete_copy(
    mine: int, peers: dict[str, int | None], heir: str
) -> None:
    """Before, it went to the first live primary whatever its copy held: the root's
    copy, which lagged, lost what the owner and the other replica confirmed."""
    p, ordered = recovering(mine, peers)
    p._recover_elsewhere(_waiting(), ["root", "s2"])
    assert ordered == [("q", heir, None)]


def test_it_waits_until_a_majority_of_the_known_primaries_reported() -> None:
    """With 3 known, the owner gone: a confirmed message is on one of the other two
    at least, so both must be heard before either is chosen."""
    p, ordered = recovering(50, {"s2": None})
    p._recover_elsewhere(_waiting(), ["root", "s2"])
    assert ordered == []
    p.members.peers["s2"].status.recovered = {"q": 350}
    p._recover_elsewhere(_waiting(), ["root", "s2"])
    assert ordered == [("q", "s2", None)]


def test_a_fenced_server_does_not_take_it() -> None:
    p, ordered = recovering(50, {"s2": 350, "s3": 10}, known=5)
    p.queues.fenced = {"s2"}  # type: ignore[attr-defined]
    p._recover_elsewhere(_waiting(), ["root", "s2", "s3"])
    assert ordered == [("q", "root", None)]


@pytest.mark.parametrize(
    ("home_report", "placed"),
    [
        (None, []),  # its status has not said yet: wait
        (0, [("q", "s2", None)]),  # back with its (empty) copy: its queue again
        (120, [("q", "s2", None)]),
        # back without its copy (a new disk): not it, and its empty report is none of
        # the two others' reports the choice needs (s3 has not said: wait)
        (-1, []),
    ],
)
def test_a_last_owner_back_at_its_address_gets_its_queue_only_with_its_copy(
    home_report: int | None, placed: list[tuple[str, str, None]]
) -> None:
    """Before, the server answering at the last owner's address got the queue back
    whatever its disk held: with a new disk, its empty copy replaced every other
    (the owner resets the replicas), and what it had confirmed was lost."""
    p, ordered = recovering(50, {"s2": home_report})
    p.members.peers["s2"].status.recovered = {} if home_report is None else {"q": home_report}
    p._homeless = set()
    p.primaries = lambda: [("root", "h1:5701"), ("s2", "h2:5702")]  # type: ignore[method-assign]
    waiting: Any = SimpleNamespace(
        name="q", home="h2:5702", epoch=4, replicated_kind=True, group=None
    )
    p._home_again(waiting, "s2", ["root", "s2"])
    assert ordered == placed


def test_a_quorum_groups_members_travel_in_its_declares_header() -> None:
    entry = declare()
    grouped = dataclasses.replace(
        entry, spid="s2", props=sl.freeze(dict(entry.props) | {"group": ("h2:5702", "h1:5701")})
    )
    header = rep.entry_header(grouped)
    assert header["group"] == ["h2:5702", "h1:5701"]  # owner first, as chosen
    back = rep.entry_from_header(header, grouped.frame)
    assert dict(back.props)["group"] == ("h2:5702", "h1:5701")
    assert "group" not in rep.entry_header(entry)
    for bad in (5, [], ["h1:5701", 7], "h1:5701"):
        with pytest.raises(BucketError, match="bad group"):
            rep.entry_from_header(header | {"group": bad}, grouped.frame)


def test_a_recovered_quorum_queue_keeps_its_group() -> None:
    p = placer({"q": "h1:5701"}, [("root", "h1:5701")])
    p.recovered_groups = {"q": ("h1:5701", "h3:5703")}
    placed = p.recovered(declare())
    assert dict(placed.props)["group"] == ("h1:5701", "h3:5703") and placed.spid == "root"


def test_a_queue_of_a_group_goes_to_a_member_once_a_majority_of_its_group_reported() -> None:
    """Group h9 (gone), h1 (the root) and h3 (s3), among five primaries: the copies
    are on h1 and h3 only, so s2, which reports a higher id for a queue it never
    kept, is not heard, and the two members besides the owner are enough."""
    p, ordered = recovering(50, {"s2": 400, "s3": None}, known=5)
    p.primaries = lambda: [("root", "h1:5701"), ("s2", "h2:5702"), ("s3", "h3:5703")]  # type: ignore[method-assign]
    grouped: Any = SimpleNamespace(
        name="q", home="h9:5709", epoch=4, group=("h9:5709", "h1:5701", "h3:5703")
    )
    p._recover_elsewhere(grouped, ["root", "s2", "s3"])
    assert ordered == []  # one report of the group's two: s3 may hold what h9 confirmed
    p.members.peers["s3"].status.recovered = {"q": 120}
    p._recover_elsewhere(grouped, ["root", "s2", "s3"])
    assert ordered == [("q", "s3", None)]


def test_a_last_owner_on_a_new_disk_waits_for_both_other_copies_and_the_fullest_wins() -> None:
    """Seed 94's kill-all-wipe: the owner s2 confirmed with s3 (350), the root lagged
    (50), then every server was killed and s2's disk replaced. Counting s2's empty
    report as one of the two needed gave the queue to the root: 300 confirmed
    messages lost. Now the choice waits for s3, and s3's copy wins."""
    p, ordered = recovering(50, {"s2": -1, "s3": None})
    p.members.peers["s2"].status.holds_state = False  # a new disk: no wiring either
    p._homeless = set()
    p.primaries = lambda: [("root", "h1:5701"), ("s2", "h2:5702"), ("s3", "h3:5703")]  # type: ignore[method-assign]
    waiting: Any = SimpleNamespace(
        name="q", home="h2:5702", epoch=4, replicated_kind=True, group=None
    )
    p._home_again(waiting, "s2", ["root", "s2", "s3"])
    assert ordered == []
    p.members.peers["s3"].status.recovered = {"q": 350}
    p._home_again(waiting, "s2", ["root", "s2", "s3"])
    assert ordered == [("q", "s3", None)]


def test_a_server_on_a_new_disk_is_no_report_but_one_that_kept_its_state_is() -> None:
    """Owner h9 never back: s2 on a new disk (-1, no state) does not count towards
    the two reports needed; once it holds state, its -1 does (it never had a copy)."""
    p, ordered = recovering(50, {"s2": -1})
    p.members.peers["s2"].status.holds_state = False
    p._recover_elsewhere(_waiting(), ["root", "s2"])
    assert ordered == []
    p.members.peers["s2"].status.holds_state = True
    p._recover_elsewhere(_waiting(), ["root", "s2"])
    assert ordered == [("q", "root", None)]


def test_a_group_of_one_back_on_a_new_disk_starts_empty_rather_than_waiting_forever() -> None:
    p, ordered = recovering(None, {"s2": -1})
    p.members.peers["s2"].status.holds_state = False
    p._homeless = set()
    p.primaries = lambda: [("root", "h1:5701"), ("s2", "h2:5702")]  # type: ignore[method-assign]
    waiting: Any = SimpleNamespace(
        name="q", home="h2:5702", epoch=4, replicated_kind=True, group=("h2:5702",)
    )
    p._home_again(waiting, "s2", ["root", "s2"])
    assert ordered == [("q", "s2", None)]
