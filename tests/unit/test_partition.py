"""``partition.Partition``: which servers send their clients away on losing the root
(RabbitMQ's pause_minority), as properties over every count of heard, ended and
silent primaries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.partition import Partition
from tests.support.examples import examples

GRACE = 0.5


@st.composite
def counts(draw: st.DrawFn) -> tuple[int, int, int]:
    known = draw(st.integers(1, 9))
    voters = draw(st.integers(0, known))
    ended = draw(st.integers(0, known - voters))
    return known, voters, ended


@given(counts(), st.booleans(), st.booleans())
@settings(max_examples=examples(500))
def test_only_a_minority_a_majority_may_be_serving_without_is_partitioned(
    sizes: tuple[int, int, int], had_root: bool, has_root: bool
) -> None:
    known, voters, ended = sizes
    partition = Partition()
    asked: list[bool] = []

    def ended_now() -> int:
        asked.append(True)
        return ended

    args = dict(had_root=had_root, root="r" if has_root else None, voters=voters, known=known)
    first = partition.check(**args, ended=ended_now, now=0.0, grace=GRACE)  # type: ignore[arg-type]
    later = partition.check(**args, ended=ended_now, now=GRACE, grace=GRACE)  # type: ignore[arg-type]
    assert first is None  # never before the grace
    silent = known - voters - ended
    expected = had_root and not has_root and 2 * voters <= known and 2 * silent > known
    assert (later is not None) == expected, (sizes, had_root, has_root, later)
    if later is not None:
        # the two sides of any split: the side with a quorum is never partitioned, and
        # the other side is only where the silent ones could be that quorum
        assert 2 * voters <= known < 2 * silent
        assert f"hears {voters} of {known}" in later
    if has_root or not had_root or 2 * voters > known:
        assert asked == []  # the peers are looked at only when it could matter


def test_the_grace_starts_again_when_the_minority_ends() -> None:
    partition = Partition()
    args = dict(had_root=True, voters=1, known=3, ended=lambda: 0, grace=GRACE)
    assert partition.check(root=None, now=0.0, **args) is None  # type: ignore[arg-type]
    assert partition.check(root="r", now=0.3, **args) is None  # type: ignore[arg-type]
    assert partition.check(root=None, now=0.6, **args) is None  # type: ignore[arg-type]
    assert partition.check(root=None, now=1.1, **args) is not None  # type: ignore[arg-type]
