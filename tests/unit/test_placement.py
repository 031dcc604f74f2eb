"""The placement rules of shared queues (``cluster.queues.placement``): examples,
and a hypothesis state machine over any interleaving of declares, deletes,
moves, rebalances, servers lost, returning and joining."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from brokerd.cluster.ownership.rules import (
    BALANCED,
    CLASSIC,
    CLIENT_LOCAL,
    QUORUM,
    REPLICATED,
    Placement,
    PlacementError,
    PlacementTable,
    choose_owner,
    group_of,
    group_size,
    kind_of,
    locator_of,
    replica_count,
)
from tests.support.examples import examples

A, B, C, D = "a", "b", "c", "d"


def test_client_local_owns_on_the_declaring_primary_and_balanced_on_the_least_loaded() -> None:
    assert choose_owner(CLIENT_LOCAL, B, [A, B, C], {B: 9}) == B
    assert choose_owner("random", B, [A, B, C], {}) == B  # any other value: client-local
    assert choose_owner(BALANCED, B, [A, B, C], {A: 2, B: 1, C: 1}) == B  # a tie: seniority
    assert choose_owner(CLIENT_LOCAL, "secondary", [A, B, C], {A: 1}) == B
    with pytest.raises(PlacementError):
        choose_owner(CLIENT_LOCAL, A, [], {})


def test_each_kind_keeps_its_number_of_copies() -> None:
    assert replica_count(CLASSIC, None, 5) == 0
    assert replica_count(QUORUM, None, 5) == 2  # a group of 3
    assert replica_count(QUORUM, 5, 3) == 2  # never more than the primaries
    assert replica_count(QUORUM, 1, 3) == 0
    assert replica_count(REPLICATED, None, 4) == 3


def test_a_lost_owner_hands_each_queue_to_its_furthest_replica_and_only_those() -> None:
    table = PlacementTable()
    table.declare("q1", kind=QUORUM, durable=True, declared_on=A, primaries=[A, B, C, D])
    table.declare("q2", kind=QUORUM, durable=True, declared_on=B, primaries=[A, B, C, D])
    q1 = table.queues["q1"]
    q2 = table.queues["q2"]
    assert q1.owner == A and len(q1.replicas) == 2
    changed = table.lost(A, [B, C, D], {("q1", q1.replicas[1]): 7, ("q1", q1.replicas[0]): 3})
    assert list(changed) == ["q1"]  # q2's owner is alive: no outage there
    heir = table.queues["q1"]
    assert heir.owner == q1.replicas[1] and heir.epoch == q1.epoch + 1
    assert A in heir.replicas  # it catches up when it returns
    assert table.queues["q2"] == q2


def test_a_classic_queue_is_lost_with_its_owner_if_transient_and_waits_for_it_if_durable() -> None:
    table = PlacementTable()
    table.declare("t", kind=CLASSIC, durable=False, declared_on=A, primaries=[A, B])
    table.declare("d", kind=CLASSIC, durable=True, declared_on=A, primaries=[A, B])
    changed = table.lost(A, [B], {})
    assert changed["t"] is None and "t" not in table.queues
    assert table.queues["d"].owner is None and table.queues["d"].home == A
    with pytest.raises(PlacementError, match="no copy"):
        table.move("d", B)
    assert table.returned(A)["d"].owner == A


def test_a_move_goes_to_a_replica_only_and_swaps_the_two() -> None:
    table = PlacementTable()
    table.declare("q", kind=REPLICATED, durable=True, declared_on=A, primaries=[A, B, C])
    moved = table.move("q", C)
    assert moved.owner == C and set(moved.replicas) == {A, B} and moved.epoch == 2
    table.declare("c", kind=CLASSIC, durable=True, declared_on=A, primaries=[A, B, C])
    with pytest.raises(PlacementError, match="stays on its owner"):
        table.move("c", B)
    with pytest.raises(PlacementError, match="no shared queue"):
        table.move("nope", B)


def test_rebalance_spreads_owners_over_the_primaries() -> None:
    table = PlacementTable()
    for i in range(6):
        table.declare(f"q{i}", kind=QUORUM, durable=True, declared_on=A, primaries=[A, B, C])
    assert table.owned() == {A: 6}
    moves = table.rebalance([A, B, C])
    assert len(moves) == 4 and table.owned() == {A: 2, B: 2, C: 2}
    assert table.rebalance([A, B, C]) == []  # balanced: nothing to do


NAMES = [f"q{i}" for i in range(6)]


class Placements(RuleBasedStateMachine):
    """Whatever happens, each available queue has exactly one owner, a live
    primary, which is not among its replicas; an owner change always raises the
    epoch; a failover picks the furthest live copy; only a transient classic
    queue is ever lost."""

    def __init__(self) -> None:
        super().__init__()
        self.table = PlacementTable()
        self.primaries: list[str] = []
        self.live: list[str] = []
        self.copies: dict[str, int] = {}
        self.seen: dict[str, Placement] = {}

    @initialize(count=st.integers(1, 4))
    def start(self, count: int) -> None:
        self.primaries = [f"p{i}" for i in range(count)]
        self.live = list(self.primaries)

    def alive(self) -> list[str]:
        return [spid for spid in self.primaries if spid in self.live]

    @precondition(lambda self: self.live)
    @rule(
        name=st.sampled_from(NAMES),
        kind=st.sampled_from([CLASSIC, QUORUM, REPLICATED]),
        durable=st.booleans(),
        on=st.integers(0, 9),
        locator=st.sampled_from([CLIENT_LOCAL, BALANCED, "random"]),
        group=st.none() | st.integers(1, 5),
    )
    def declare(
        self, name: str, kind: str, durable: bool, on: int, locator: str, group: int | None
    ) -> None:
        durable = durable or kind != CLASSIC  # quorum and replicated queues are durable
        alive = self.alive()
        existed = name in self.table.queues
        placement = self.table.declare(
            name,
            kind=kind,
            durable=durable,
            declared_on=alive[on % len(alive)],
            primaries=alive,
            locator=locator,
            group_size=group,
        )
        if not existed:
            assert len(placement.replicas) == replica_count(kind, group, len(alive))
            self.copies[name] = len(placement.replicas)

    @rule(name=st.sampled_from(NAMES))
    def delete(self, name: str) -> None:
        self.table.delete(name)
        self.seen.pop(name, None)

    @rule(name=st.sampled_from(NAMES), to=st.integers(0, 9))
    def move(self, name: str, to: int) -> None:
        if not self.live:
            return
        target = self.alive()[to % len(self.alive())]
        before = self.table.queues.get(name)
        try:
            after = self.table.move(name, target)
        except PlacementError:
            assert before is None or target not in before.replicas or before.owner is None
            return
        assert after.owner == target

    @precondition(lambda self: len(self.live) > 1)
    @rule(which=st.integers(0, 9), data=st.data())
    def lose(self, which: int, data: st.DataObject) -> None:
        spid = self.alive()[which % len(self.alive())]
        self.live.remove(spid)
        alive = self.alive()
        positions = {
            (name, replica): data.draw(st.integers(0, 3))
            for name, placement in self.table.queues.items()
            for replica in placement.replicas
        }
        before = dict(self.table.queues)
        changed = self.table.lost(spid, alive, positions)
        for name, placement in before.items():
            if placement.owner != spid:
                assert name not in changed  # no outage for queues owned elsewhere
                continue
            new = changed[name]
            heirs = [r for r in placement.replicas if r in alive]
            if heirs:
                assert new is not None and new.owner in heirs
                best = max(positions.get((name, r), 0) for r in heirs)
                assert positions.get((name, new.owner), 0) == best  # the furthest copy
            elif placement.durable:
                assert new is not None and new.owner is None and new.home == spid
            else:
                assert new is None and name not in self.table.queues
                self.seen.pop(name, None)

    @precondition(lambda self: len(self.live) < len(self.primaries))
    @rule(which=st.integers(0, 9))
    def come_back(self, which: int) -> None:
        away = [spid for spid in self.primaries if spid not in self.live]
        spid = away[which % len(away)]
        self.live.append(spid)
        for placement in self.table.returned(spid).values():
            assert placement.owner == spid

    @precondition(lambda self: len(self.primaries) < 6)
    @rule()
    def join(self) -> None:
        spid = f"p{len(self.primaries)}"
        self.primaries.append(spid)
        self.live.append(spid)

    @precondition(lambda self: self.live)
    @rule()
    def rebalance(self) -> None:
        alive = self.alive()
        self.table.rebalance(alive)
        owned = self.table.owned()
        share = -(-sum(owned.values()) // len(alive))
        for placement in self.table.queues.values():
            owner = placement.owner
            if owner is not None and owned.get(owner, 0) > share:
                # over its share only where no replica could take the queue
                assert all(owned.get(r, 0) >= share or r not in alive for r in placement.replicas)

    @invariant()
    def one_live_owner_never_a_replica(self) -> None:
        for name, placement in self.table.queues.items():
            assert len(set(placement.replicas)) == len(placement.replicas)
            assert placement.owner not in placement.replicas
            assert len(placement.replicas) == self.copies[name]  # moves and failovers swap
            if placement.owner is None:
                assert placement.durable and placement.home not in self.live
            else:
                assert placement.owner in self.live

    @invariant()
    def an_owner_change_raises_the_epoch(self) -> None:
        for name, placement in self.table.queues.items():
            before = self.seen.get(name)
            if before is not None:
                assert placement.epoch >= before.epoch
                if placement.owner != before.owner:
                    assert placement.epoch > before.epoch
            self.seen[name] = placement


TestPlacements = Placements.TestCase
TestPlacements.settings = settings(
    max_examples=examples(300), stateful_step_count=40, deadline=None
)


@pytest.mark.parametrize(
    ("durable", "arguments", "default", "kind"),
    [
        (True, {}, None, REPLICATED),  # our promise: no confirmed message lost
        (False, {}, None, CLASSIC),  # RPC replies, results: on their owner alone
        (True, {"x-queue-type": "classic"}, None, CLASSIC),
        (True, {"x-queue-type": b"quorum"}, None, QUORUM),
        (True, {}, QUORUM, QUORUM),
        (False, {}, QUORUM, CLASSIC),  # a quorum queue is durable only
        (True, {}, CLASSIC, CLASSIC),
        (False, {}, REPLICATED, REPLICATED),
        (False, {"x-queue-type": "classic"}, REPLICATED, CLASSIC),
    ],
)
def test_kind_of_an_untyped_queue_follows_its_durability_or_the_default(
    durable: bool, arguments: dict, default: str | None, kind: str
) -> None:
    assert kind_of(durable, arguments, default) == kind


def test_locators_of_both_families_map_to_client_local_or_balanced() -> None:
    assert locator_of({}) == CLIENT_LOCAL
    assert locator_of({"x-queue-leader-locator": "balanced"}) == BALANCED
    assert locator_of({"x-queue-master-locator": b"min-masters"}) == BALANCED
    assert locator_of({"x-queue-master-locator": "random"}) == BALANCED
    assert locator_of({"x-queue-master-locator": "client-local"}) == CLIENT_LOCAL


def test_a_declare_that_names_no_locator_gets_the_cluster_default() -> None:
    """The cluster file's ``queue_leader_locator`` covers clients that send none (as
    RabbitMQ's setting of that name does); a locator the declare names wins."""
    assert locator_of({}, BALANCED) == BALANCED
    assert locator_of({"x-queue-leader-locator": "client-local"}, BALANCED) == CLIENT_LOCAL
    assert locator_of({"x-queue-master-locator": b"client-local"}, BALANCED) == CLIENT_LOCAL
    assert locator_of({"x-queue-leader-locator": "balanced"}, CLIENT_LOCAL) == BALANCED
    assert locator_of({"x-queue-leader-locator": "nearest"}, BALANCED) == BALANCED  # unknown


def test_a_quorum_group_smaller_than_the_primaries_names_its_members_owner_first() -> None:
    live = ["h1", "h2", "h3", "h4", "h5"]
    two = {"x-quorum-initial-group-size": 2}
    assert group_of(QUORUM, two, "h3", live, 5, {}) == ("h3", "h1")
    # the members go to the primaries in fewest groups, then by seniority
    assert group_of(QUORUM, {}, "h1", live, 5, {"h2": 2, "h3": 1}) == ("h1", "h4", "h5")
    assert group_of(QUORUM, {"x-quorum-initial-group-size": 1}, "h2", live, 5, {}) == ("h2",)
    # as large as the known primaries (or larger), or not quorum: every primary keeps one
    assert group_of(QUORUM, {}, "h1", live[:3], 3, {}) is None
    assert group_of(QUORUM, {"x-quorum-initial-group-size": 7}, "h1", live, 5, {}) is None
    assert group_of(REPLICATED, two, "h1", live, 5, {}) is None
    assert group_of(CLASSIC, two, "h1", live, 5, {}) is None
    # fewer live primaries than the group: as many as are live (RabbitMQ's nodes running)
    assert group_of(QUORUM, {}, "h1", ["h1", "h2"], 5, {}) == ("h1", "h2")
    assert group_size({}) == 3 and group_size({"x-quorum-initial-group-size": 5}) == 5
