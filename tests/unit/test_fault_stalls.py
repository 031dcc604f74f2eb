"""The fault harness's stall dumps (tests/faults/stalls.py), without servers."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.faults.stalls import StallWatch


def _publisher(name: str, since: float | None, seq: int = 1) -> Any:
    return SimpleNamespace(
        name=name, seq=seq, waiting_since=since, waiting_for="jepsen-0", server=3
    )


def test_a_stalled_confirm_is_dumped_once_and_the_dumps_are_bounded(tmp_path: Path) -> None:
    node = SimpleNamespace(index=0, answering=lambda: False, slow=None)
    cluster: Any = SimpleNamespace(nodes=[node])
    stalled, fresh = _publisher("p0", time.time() - 5), _publisher("p1", time.time())
    idle = _publisher("p2", None)
    watch = StallWatch(cluster, [stalled, fresh, idle], tmp_path, limit=2, after=1.5)
    watch.start()
    time.sleep(0.5)
    assert len(watch.written) == 1, "one stall, one dump, however long it lasts"
    text = watch.written[0].read_text()
    assert "p0 seq 1 to jepsen-0 on server [3] waiting" in text and "p1" not in text
    assert "===== [0] =====\nnot answering" in text
    stalled.seq, stalled.waiting_since = 2, time.time() - 5  # the next publish stalls
    fresh.waiting_since = time.time() - 5
    time.sleep(0.5)
    watch.halt()
    watch.join(5)
    assert len(watch.written) == 2 and not watch.is_alive()
    assert "p0 seq 2" in watch.written[1].read_text()
