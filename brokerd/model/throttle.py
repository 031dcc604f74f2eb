"""Failed-login throttling per (peer address, user name), in bounded memory.

Pure bookkeeping with the clock passed in; ``brokerd.server.login`` does the
waiting. After ``n`` consecutive failures of one key, each new attempt of
that key waits ``delay(n)`` (doubling from ``base`` up to ``cap``) before its
password is even checked, and attempts made in parallel queue behind each
other, so guessing from one address costs the guesser time, not the broker
CPU. A success clears the key; a key quiet for ``forget_after`` seconds is
forgotten; past ``max_entries`` keys the least recently failed go first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Entry:
    failures: int
    #: monotonic time before which the next attempt of this key may not start
    not_before: float
    last_failure: float


class LoginThrottle:
    def __init__(
        self,
        *,
        base: float = 0.1,
        cap: float = 3.0,
        forget_after: float = 300.0,
        max_entries: int = 10_000,
    ) -> None:
        self.base = base
        self.cap = cap
        self.forget_after = forget_after
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def delay(self, failures: int) -> float:
        """Seconds between attempts of a key after ``failures`` consecutive failures."""
        if failures <= 0:
            return 0.0
        return min(self.base * 2 ** min(failures - 1, 32), self.cap)

    def _live(self, key: tuple[str, str], now: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None and now - entry.last_failure > self.forget_after:
            del self._entries[key]
            return None
        return entry

    def reserve(self, key: tuple[str, str], now: float) -> float:
        """How long an attempt of ``key`` starting ``now`` must wait before its check.

        The slot is taken: a second attempt made at once waits one delay longer."""
        entry = self._live(key, now)
        if entry is None:
            return 0.0
        start = max(entry.not_before, now)
        entry.not_before = start + self.delay(entry.failures)
        return start - now

    def failed(self, key: tuple[str, str], now: float) -> float:
        """Record a failure; returns how long to hold the refusal before sending it."""
        entry = self._live(key, now)
        if entry is None:
            entry = _Entry(0, now, now)
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        entry.failures += 1
        entry.last_failure = now
        delay = self.delay(entry.failures)
        entry.not_before = max(entry.not_before, now + delay)
        return delay

    def succeeded(self, key: tuple[str, str]) -> None:
        self._entries.pop(key, None)
