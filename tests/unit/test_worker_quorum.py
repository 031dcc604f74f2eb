"""The quorum of a host's workers (``brokerd --workers``) counts only live workers.

``Standing.known_primaries`` leaves out of the count a sibling whose socket
refuses (its process has ended: it never votes again, and a restarted one
counts again once it links), and, on the sitting root only, one restarted
sibling that has not yet named that root. The first is safe because a dead
process casts no vote. The second is the one place where two servers count
differently: this property shows that a root's majority over the count less
one newcomer still meets every majority of the full count, so no interleaving
of votes elects a second root, while leaving out two could.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.election import Member, View, has_quorum
from tests.support.examples import examples


def _majority(voters: frozenset[int], count: int) -> bool:
    me = Member(spid=f"s{min(voters)}")
    peers = tuple(Member(spid=f"s{v}", vote="x") for v in sorted(voters) if v != min(voters))
    return has_quorum(View(me=me, peers=peers, known_primaries=count))


@st.composite
def _split(draw: st.DrawFn, newcomers: int) -> tuple[int, frozenset[int], frozenset[int], int]:
    """Workers 0..n-1 (dead ones already left out of n), the root 0, the newcomers
    n-newcomers..n-1; a group backing the root among the old workers, and any
    group at all that might back another root."""
    n = draw(st.integers(min_value=newcomers + 1, max_value=9))
    old = list(range(n - newcomers))
    backing = frozenset([*draw(st.lists(st.sampled_from(old), unique=True, min_size=1)), 0])
    other = frozenset(draw(st.lists(st.sampled_from(range(n)), unique=True, min_size=1)))
    return n, backing, other, newcomers


@settings(max_examples=examples(400))
@given(_split(1))
def test_leaving_out_one_newcomer_never_makes_two_disjoint_majorities(
    split: tuple[int, frozenset[int], frozenset[int], int],
) -> None:
    n, backing, other, newcomers = split
    if _majority(backing, n - newcomers) and _majority(other, n):
        assert backing & other, f"two roots: {sorted(backing)} and {sorted(other)} of {n}"


def test_leaving_out_two_newcomers_could_make_two_roots() -> None:
    """Why the rule stops at one: 5 workers, 2 of them new. The root counts 3 and
    has 0 and 1; workers 2, 3 and 4 are a majority of 5 without either."""
    assert _majority(frozenset({0, 1}), 3)
    assert _majority(frozenset({2, 3, 4}), 5)
