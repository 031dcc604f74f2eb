"""``tests.support.eventually``: the polling loop the tests share."""

from __future__ import annotations

import itertools

import pytest

from tests.support.eventually import eventually


def test_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert eventually(lambda: next(counter) >= 3 and "ready", 2.0, interval=0.001) == "ready"


def test_fails_with_what_it_waited_for_the_last_error_and_the_explanation() -> None:
    def broken() -> bool:
        raise OSError("refused")

    with pytest.raises(AssertionError) as caught:
        eventually(
            broken, 0.05, "the root", interval=0.01, tolerate=(OSError,), explain=lambda: "v"
        )
    text = str(caught.value)
    assert "the root: not within 0.05s" in text and "refused" in text and text.endswith("\nv")


def test_an_exception_not_tolerated_is_raised_at_once() -> None:
    with pytest.raises(KeyError):
        eventually(lambda: {}["x"], 1.0, tolerate=(OSError,))


def test_each_runs_after_every_miss() -> None:
    misses: list[int] = []
    with pytest.raises(AssertionError):
        eventually(lambda: False, 0.03, interval=0.01, each=lambda: misses.append(1))
    assert len(misses) >= 2
