"""The rules of operators' queue moves and rebalances (``brokerd.cluster.ownership.moves``)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from brokerd.cluster.ownership.moves import MoveRefused, check_move, plan_evacuation, plan_rebalance
from brokerd.model.errors import NOT_FOUND, PRECONDITION_FAILED

LIVE = ["a", "b", "c"]


def queue(**fields: Any) -> Any:
    base = {"replicated_kind": True, "owner": "a", "moving": None, "group": None}
    return SimpleNamespace(**(base | fields))


@pytest.mark.parametrize(
    ("found", "to", "code", "why"),
    [
        (None, "b", NOT_FOUND, "no shared queue"),
        (queue(replicated_kind=False), "b", PRECONDITION_FAILED, "classic queue"),
        (queue(owner=None), "b", PRECONDITION_FAILED, "no owner now"),
        (queue(moving="c"), "b", PRECONDITION_FAILED, "moving to c already"),
        (queue(), "a", PRECONDITION_FAILED, "owned by a already"),
        (queue(), "d", PRECONDITION_FAILED, "d is not a live primary"),
        (queue(owner="x"), "b", PRECONDITION_FAILED, "its owner x is not live"),
    ],
)
def test_a_move_the_rules_forbid_is_refused_with_the_reason(
    found: Any, to: str, code: int, why: str
) -> None:
    with pytest.raises(MoveRefused, match=why) as refused:
        check_move(found, "q", to, LIVE)
    assert refused.value.reply_code == code


def test_no_queue_moves_to_a_stopping_primary_and_a_stopping_owner_may_hand_its_over() -> None:
    with pytest.raises(MoveRefused, match="b is stopping"):
        check_move(queue(), "q", "b", LIVE, {"b"})
    found = queue()
    assert check_move(found, "q", "b", LIVE, {"a"}) is found  # its owner is stopping


def test_a_stopping_server_spreads_its_queues_over_the_others_by_what_they_own() -> None:
    owners = {"x1": "c", "x2": "c", "m1": "a", "m2": "a", "m3": "a"}
    moves = plan_evacuation(["m3", "m1", "m2"], owners, ["b", "c"])
    # b owned none, c two: b takes two, then the tie goes to the more senior, b
    assert moves == [("m1", "b"), ("m2", "b"), ("m3", "b")]
    assert plan_evacuation(["m1"], owners, []) == []


@given(
    st.lists(st.sampled_from("abc"), max_size=12),
    st.integers(min_value=1, max_value=9),
)
def test_an_evacuation_moves_every_queue_and_ends_with_the_targets_within_one(
    others: list[str], count: int
) -> None:
    owners = {f"o{i}": owner for i, owner in enumerate(others)}
    mine = [f"m{i}" for i in range(count)]
    owners |= {name: "s" for name in mine}
    moves = plan_evacuation(mine, owners, LIVE)
    assert sorted(name for name, _to in moves) == sorted(mine)
    before = Counter(o for o in owners.values() if o in LIVE)
    after = before + Counter(to for _name, to in moves)
    # each goes to the least loaded: the targets end within one of each other, or
    # the ones that owned more to start with were never given any
    low = min(after[t] for t in LIVE)
    assert all(after[t] <= low + 1 or not any(to == t for _n, to in moves) for t in LIVE)


def test_a_replicated_queue_moves_to_another_live_primary() -> None:
    found = queue()
    assert check_move(found, "q", "b", LIVE) is found


def test_rebalance_moves_the_excess_to_the_least_loaded_in_name_order() -> None:
    owners = {f"q{i}": "a" for i in range(6)}
    moves = plan_rebalance(owners, set(owners), LIVE)
    assert moves == [
        ("q0", "a", "b"),
        ("q1", "a", "c"),
        ("q2", "a", "b"),
        ("q3", "a", "c"),
    ]
    assert plan_rebalance({"q0": "a", "q1": "b", "q2": "c"}, {"q0", "q1", "q2"}, LIVE) == []
    assert plan_rebalance(owners, set(owners), []) == []


def test_classic_queues_count_for_the_share_but_stay() -> None:
    owners = {"c0": "a", "c1": "a", "c2": "a", "r0": "a", "r1": "b"}
    moves = plan_rebalance(owners, {"r0", "r1"}, LIVE)
    assert moves == [("r0", "a", "c")]


@given(
    st.dictionaries(
        st.text("abcdefgh", min_size=1, max_size=4),
        st.tuples(st.sampled_from(["a", "b", "c", "d", "gone"]), st.booleans()),
        max_size=30,
    ),
    st.integers(1, 4),
)
def test_a_rebalance_leaves_no_primary_past_its_share_that_a_move_could_relieve(
    queues: dict[str, tuple[str, bool]], count: int
) -> None:
    primaries = ["a", "b", "c", "d"][:count]
    owners = {name: owner for name, (owner, _m) in queues.items()}
    movable = {name for name, (_o, m) in queues.items() if m}
    moves = plan_rebalance(owners, movable, primaries)
    assert len({name for name, _f, _t in moves}) == len(moves)  # each queue moves once
    after = dict(owners)
    for name, source, to in moves:
        assert name in movable and after[name] == source and to in primaries and to != source
        after[name] = to
    owned = Counter(owner for owner in after.values() if owner in primaries)
    share = -(-sum(owned.values()) // len(primaries))
    for spid in primaries:
        if owned[spid] > share:  # only queues that cannot move keep it over
            stuck = [n for n, o in after.items() if o == spid and n not in movable]
            assert len(stuck) >= owned[spid] - share or all(
                owned[other] >= share for other in primaries
            )
    assert plan_rebalance(after, movable, primaries) == [] or max(owned.values()) > share


def test_a_quorum_queue_kept_by_some_primaries_moves_within_its_group_only() -> None:
    grouped = queue(group=("h1:1", "h2:1"))
    addresses = {"a": "h1:1", "b": "h2:1", "c": "h3:1"}
    with pytest.raises(MoveRefused, match="its quorum group"):
        check_move(grouped, "q", "c", LIVE, (), addresses)
    assert check_move(grouped, "q", "b", LIVE, (), addresses) is grouped


def test_rebalance_and_evacuation_keep_each_queue_within_its_group() -> None:
    owners = {f"q{i}": "a" for i in range(6)}
    within = {name: {"a", "b"} for name in owners}  # c keeps no copy of any
    moves = plan_rebalance(owners, set(owners), LIVE, within)
    assert {to for _name, _from, to in moves} == {"b"}
    assert plan_rebalance(owners, set(owners), LIVE, {n: {"a"} for n in owners}) == []
    assert plan_evacuation(["m1", "m2"], {"m1": "a", "m2": "a"}, ["b", "c"], {"m1": {"a"}}) == [
        ("m2", "b")
    ]
