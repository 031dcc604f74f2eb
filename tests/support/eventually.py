"""Wait for a condition instead of sleeping a fixed time: the one polling loop
the tests share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def eventually(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
    tolerate: tuple[type[BaseException], ...] = (),
    explain: Callable[[], str] | None = None,
    each: Callable[[], Any] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    ``tolerate``: exceptions that mean "not yet" (a server still starting); the
    last one is reported if time runs out. ``each`` runs after every miss (a
    check that the processes under test are still alive fails fast). The
    failure says ``what`` was awaited, for how long, and ``explain()``."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = predicate()
        except tolerate as exc:
            value, last = None, exc  # type: ignore[assignment]
        if value:
            return value
        if time.monotonic() >= deadline:
            message = f"{what}: not within {timeout}s"
            if last is not None:
                message += f" (last error: {last!r})"
            if explain is not None:
                message += f"\n{explain()}"
            raise AssertionError(message)
        if each is not None:
            each()
        time.sleep(interval)
