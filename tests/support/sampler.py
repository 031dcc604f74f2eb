"""Samples of every answering server's status, taken in the background while a test
runs (``Sampler``), so a safety property (never two roots with quorum) is checked
over the whole run, not just at its end."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.cluster_harness import Cluster

#: one server's status, as its control socket answers ``status``
View = dict[str, Any]


def brief(view: View) -> str:
    """One line per view, for failure messages."""
    root = (view.get("root") or "-")[-9:]
    return (
        f"{view.get('type', '?')[0]}:{str(view.get('spid', '?'))[-9:]} root={root} "
        f"is_root={view.get('is_root')} quorum={view.get('quorum')} ready={view.get('ready')} "
        f"vote={(view.get('vote') or '-')[-9:]} reason={view.get('reason')!r} "
        f"active={sum(bool(p.get('active')) for p in view.get('peers', []))}"
    )


def roots_with_quorum(views: dict[int, View]) -> list[int]:
    """Indexes of the sampled servers that believe they are root and have quorum."""
    return sorted(i for i, v in views.items() if v.get("is_root") and v.get("quorum"))


@dataclass
class Sample:
    #: when the sample was started and when its last answer came (monotonic)
    at: float
    views: dict[int, View]
    ended: float = 0.0


@dataclass
class Sampler:
    """Samples every answering server about every ``period`` seconds in a thread.

    The servers of one sample are asked at the same moment (one thread each),
    so their answers are at most a few milliseconds apart. A sample in which
    two servers claim is_root with quorum is asked again at once: a claim that
    holds on the second asking is a split brain (``double_roots``); one that
    does not was a hand-over caught mid-way between two answers
    (``passing_roots``, informational: the old root released before the new
    one took over, a few milliseconds apart).

    Use as a context manager; ``samples`` holds every sample.
    """

    cluster: Cluster
    period: float = 0.1
    #: per-request socket timeout: a server that does not answer in time is left out
    timeout: float = 0.3
    indexes: list[int] | None = None
    samples: list[Sample] = field(default_factory=list)
    double_roots: list[tuple[float, dict[int, str]]] = field(default_factory=list)
    passing_roots: list[tuple[float, dict[int, str]]] = field(default_factory=list)
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> Sampler:
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="sampler")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _ask(self, indexes: list[int]) -> dict[int, View]:
        assert self._pool is not None
        answering = [i for i in indexes if self.cluster.nodes[i].answering()]
        answers = self._pool.map(lambda i: self.cluster.status(i, timeout=self.timeout), answering)
        return {i: v for i, v in zip(answering, answers, strict=True) if v is not None}

    def _run(self) -> None:
        while not self._halt.is_set():
            started = time.monotonic()
            indexes = self.indexes if self.indexes is not None else self.cluster.running()
            views = self._ask(indexes)
            self.samples.append(Sample(started, views, time.monotonic()))
            if len(roots := roots_with_quorum(views)) > 1:
                again = self._ask(roots)
                seen = {i: brief(views[i]) for i in roots}
                if len(roots_with_quorum(again)) > 1:
                    seen.update({i + 100: "again " + brief(v) for i, v in again.items()})
                    self.double_roots.append((started, seen))
                else:
                    self.passing_roots.append((started, seen))
            self._halt.wait(max(0.0, self.period - (time.monotonic() - started)))

    def since(self, moment: float) -> list[Sample]:
        return [s for s in self.samples if s.at >= moment]
