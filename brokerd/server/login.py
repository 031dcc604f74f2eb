"""Password checks off the event loop, with bounded concurrency and throttling.

A PBKDF2 check costs tens of milliseconds; run on the loop, a flood of bad
logins stalls every client of the broker. Here a check first waits out the
throttle of its (address, user) key, then takes one of ``concurrency``
executor slots (hashlib releases the GIL while stretching), and a refusal is
held back by the key's delay before the connection hears it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from brokerd.model.auth import User, UserDatabase
from brokerd.model.throttle import LoginThrottle
from brokerd.protocol.handshake import EXTERNAL, LoginCheck

log = logging.getLogger("brokerd.login")


def default_concurrency() -> int:
    """Half the cores (at least one): logins never take the whole machine."""
    return max(1, (os.cpu_count() or 2) // 2)


class LoginService:
    def __init__(
        self,
        users: Callable[[], UserDatabase],
        *,
        concurrency: int | None = None,
        throttle: LoginThrottle | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._users = users
        self.concurrency = concurrency or default_concurrency()
        self.throttle = throttle if throttle is not None else LoginThrottle()
        self._clock = clock
        self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="brokerd-login")
        self._slots = asyncio.Semaphore(self.concurrency)
        #: password hashes computed (for tests and metrics)
        self.checks = 0
        self.refused = 0

    async def check(self, check: LoginCheck) -> tuple[User | None, str]:
        """The user, or None and the reason; never raises for bad credentials."""
        users = self._users()
        if check.mechanism == EXTERNAL:  # no password: the certificate was checked
            user, reason = users.identify(check.username, check.peer_host)
            if user is None:
                self.refused += 1
            return user, reason
        cached = users.cached(check.username, check.password, check.peer_host)
        if cached is not None:
            return cached, ""
        key = (check.peer_host, check.username)
        wait = self.throttle.reserve(key, self._clock())
        if wait > 0:
            await asyncio.sleep(wait)
        async with self._slots:
            self.checks += 1
            loop = asyncio.get_running_loop()
            user, reason = await loop.run_in_executor(
                self._executor, users.authenticate, check.username, check.password, check.peer_host
            )
        if user is not None:
            self.throttle.succeeded(key)
            return user, ""
        self.refused += 1
        hold = self.throttle.failed(key, self._clock())
        if hold > 0:
            await asyncio.sleep(hold)
        return None, reason

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
