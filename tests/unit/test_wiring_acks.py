"""The root's held answers (brokerd.cluster.wiring.applied): a change is answered
once every follower applied it, a lost follower is not waited for, and nothing
waits longer than the limit."""

from __future__ import annotations

from brokerd.cluster.wiring.applied import Acknowledgements


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[Acknowledgements, Clock, list[int]]:
    clock = Clock()
    return Acknowledgements(clock, lambda: 3.0), clock, []


def test_without_followers_a_change_is_answered_at_once() -> None:
    acks, _clock, answered = make()
    assert not acks.wanted
    acks.expect(1, lambda: answered.append(1))
    assert answered == [1] and not acks.awaiting


def test_a_change_waits_for_every_follower_and_a_later_ack_counts_for_earlier_ones() -> None:
    acks, _clock, answered = make()
    acks.follow("b")
    acks.follow("c")
    acks.expect(5, lambda: answered.append(5))
    acks.expect(6, lambda: answered.append(6))
    acks.applied("b", 5)
    assert answered == []
    acks.applied("c", 6)  # applied in order: 6 implies 5
    assert answered == [5]
    acks.applied("b", 6)
    assert answered == [5, 6] and not acks.awaiting


def test_a_lost_follower_is_not_waited_for_nor_followed() -> None:
    acks, _clock, answered = make()
    acks.follow("b")
    acks.follow("c")
    acks.expect(1, lambda: answered.append(1))
    acks.applied("b", 1)
    acks.lost("c")
    assert answered == [1] and acks.followers == {"b"}


def test_a_slow_follower_delays_an_answer_by_the_limit_at_most() -> None:
    acks, clock, answered = make()
    acks.follow("slow")
    acks.expect(1, lambda: answered.append(1))
    clock.now += 2.9
    acks.expire()
    assert answered == []
    clock.now += 0.2
    acks.expire()
    assert answered == [1]


def test_a_root_stepping_down_answers_what_waits_and_forgets_its_followers() -> None:
    acks, _clock, answered = make()
    acks.follow("b")
    acks.expect(1, lambda: answered.append(1))
    acks.expect(2, lambda: answered.append(2))
    acks.release()
    assert answered == [1, 2] and not acks.followers and not acks.wanted
