"""Stall dumps: what every server held while a confirmed publish waited too long.

A soak measures outages per fault kind, but a long one is explained only by
the servers' state *during* it: which queue owner a forward waits for, whether
flow control paused a connection, what the orphans keep. ``StallWatch``
watches the confirmed publishers; when one has waited ``after`` seconds for a
confirm, it writes every answering server's state dump (``brokerd ctl dump``)
to ``stall-N.txt`` in the run's directory, at most ``limit`` times a run and
once per stall. Opt-in (``--stall-dumps N``): a dump walks every queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

from brokerd.server.control import request
from tests.cluster_harness import Cluster
from tests.faults.workload import Publisher


class StallWatch(threading.Thread):
    def __init__(
        self,
        cluster: Cluster,
        publishers: Sequence[Publisher],
        into: Path,
        *,
        limit: int,
        after: float = 1.5,
    ) -> None:
        super().__init__(name="stall-watch", daemon=True)
        self.cluster = cluster
        self.publishers = list(publishers)
        self.into = into
        self.limit = limit
        self.after = after
        self.halted = threading.Event()
        self.written: list[Path] = []

    def halt(self) -> None:
        self.halted.set()

    def run(self) -> None:
        seen: set[tuple[str, int]] = set()  # (publisher, seq) stalls dumped already
        while not self.halted.wait(0.1) and len(self.written) < self.limit:
            now = time.time()
            stalled = [
                p
                for p in self.publishers
                if (since := p.waiting_since) is not None
                and now - since > self.after
                and (p.name, p.seq) not in seen
            ]
            if not stalled:
                continue
            seen.update((p.name, p.seq) for p in stalled)
            self._dump(stalled, now)

    def _dump(self, stalled: list[Publisher], now: float) -> None:
        lines = [
            f"{p.name} seq {p.seq} to {p.waiting_for} on server [{p.server}] waiting "
            f"{now - (p.waiting_since or now):.2f}s"
            for p in stalled
        ]
        for node in self.cluster.nodes:
            if node.slow is not None:  # the proxy in front of its known-host address
                lines.append(f"\n===== [{node.index}]'s slow-link proxy =====")
                lines.extend(node.slow.describe())
        for node in self.cluster.nodes:
            lines.append(f"\n===== [{node.index}] =====")
            if not node.answering():
                lines.append("not answering (stopped, paused or dead)")
                continue
            try:
                reply = request(node.data_dir, "dump", timeout=2)
                lines.append(reply.get("result", {}).get("dump", str(reply)))
            except (OSError, ValueError) as exc:
                lines.append(f"no dump: {exc}")
        path = self.into / f"stall-{len(self.written) + 1}.txt"
        path.write_text("\n".join(lines) + "\n")
        self.written.append(path)
