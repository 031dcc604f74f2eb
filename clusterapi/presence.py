"""Whether the console was there to hear the brokers: its processes' beats.

A broker's silence means it is down only if a console process (Daphne, serving
the broker link) was up to hear it. Stale-broker detection runs in Celery, which
keeps running while the console is restarted; without this it took every
console restart for an outage of every broker. So each console process beats (a
:class:`ConsoleProcess` row, updated every ``BEAT_SECONDS`` by a thread started
with its first request), and :func:`hearing` tells detection:

- whether a console process beats now (if none does, nobody is judged: the
  silence is the console's);
- the latest beat (a broker is judged only once a console was beating after the
  broker became overdue, so a console that died just before does not count);
- since when the link has been disturbed: the newest start of a beating process,
  or the last beat of one that stopped recently (its brokers move to another). A
  broker last heard before that is given ``BROKER_RECONNECT_GRACE`` seconds to
  come back (the brokers' reconnect backoff is capped well below it) before its
  heartbeat allowance starts.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
from dataclasses import dataclass

from django.db import close_old_connections
from django.db.models import Max
from django.utils import timezone

from clusterapi.models import ConsoleProcess

log = logging.getLogger(__name__)

#: seconds between two beats of a console process
BEAT_SECONDS = 1.0
#: a process whose last beat is older than this is not hearing (a few missed beats:
#: a busy database or a paused process is not taken for a stopped console at once)
BEAT_STALE_SECONDS = 5.0
#: a process that stopped this recently still disturbs the link (its brokers reconnect)
RECENT_STOP = dt.timedelta(minutes=10)
#: rows of processes silent this long are deleted
FORGET_AFTER = dt.timedelta(days=1)


@dataclass(frozen=True)
class Hearing:
    """What stale detection may conclude from the console's beats (see the module)."""

    #: a console process beats now
    live: bool
    #: its latest beat (None: none beats)
    latest_beat: dt.datetime | None
    #: the link's last disturbance: a beating process's start, or a recent stop
    disturbed: dt.datetime | None


def hearing(now: dt.datetime | None = None) -> Hearing:
    now = now or timezone.now()
    fresh = now - dt.timedelta(seconds=BEAT_STALE_SECONDS)
    live = ConsoleProcess.objects.filter(beat_at__gte=fresh).aggregate(
        latest=Max("beat_at"), started=Max("started_at")
    )
    if live["latest"] is None:
        return Hearing(False, None, None)
    stopped = (
        ConsoleProcess.objects.filter(beat_at__lt=fresh, beat_at__gte=now - RECENT_STOP)
        .aggregate(last=Max("beat_at"))
        .get("last")
    )
    disturbed = max(d for d in (live["started"], stopped) if d is not None)
    return Hearing(True, live["latest"], disturbed)


class Beat:
    """This process's beat: its row, updated from a daemon thread."""

    def __init__(self, interval: float = BEAT_SECONDS) -> None:
        self.interval = interval
        self.row: ConsoleProcess | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="console-beat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def beat(self) -> None:
        """One beat (the first registers the process; old rows are forgotten then)."""
        now = timezone.now()
        if self.row is None:
            ConsoleProcess.objects.filter(beat_at__lt=now - FORGET_AFTER).delete()
            self.row = ConsoleProcess.objects.create(
                host=socket.gethostname()[:255], pid=os.getpid(), started_at=now, beat_at=now
            )
            log.info("console process %s beating (for stale-broker detection)", self.row)
            return
        ConsoleProcess.objects.filter(pk=self.row.pk).update(beat_at=now)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                close_old_connections()
                self.beat()
            except Exception as exc:  # the database is away: beat again next time
                log.warning("console beat failed: %s", exc)
            self._stop.wait(self.interval)


_beat: Beat | None = None
_lock = threading.Lock()


def start_beating() -> Beat:
    """Start this process's beat once (the ASGI application calls it)."""
    global _beat
    with _lock:
        if _beat is None:
            _beat = Beat()
            _beat.start()
        return _beat
