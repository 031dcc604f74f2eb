"""Polling every brokerd's status during the flood, and the percentile it summarises with.

A control plane starved by data is one of issue 21's symptoms; the sampler
measures it from outside, over the control socket (imported lazily).
"""

from __future__ import annotations

import math
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from brokerd.bench.failover import Node


class StatusSampler:
    """Asks every brokerd for its status each ``period`` seconds, in a thread.

    Why: a control plane starved by data shows as unanswered polls (the
    server's event loop is busy), role changes and stale peer statuses.
    """

    def __init__(
        self, nodes: list[Node], labels: list[str], period: float, wait: float = 3.0
    ) -> None:
        self.nodes, self.labels, self.period, self.wait = nodes, labels, period, wait
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="flood-status", daemon=True)
        self.per: list[dict[str, Any]] = [
            {
                "polls": 0,
                "unanswered": 0,
                "not_ready": 0,
                "suspended": 0,
                "role_changes": 0,
                "poll_ms": [],
                "peer_rtt_ms": [],
                "peer_age_max_s": 0.0,
                "_was_root": None,
                "_last": None,
            }
            for _ in nodes
        ]

    def start(self) -> None:
        if self.period > 0 and self.nodes:
            self.thread.start()

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(5.0)

    def _loop(self) -> None:
        while not self.done.wait(self.period):
            for node, per in zip(self.nodes, self.per, strict=True):
                t0 = time.monotonic()
                view = _status(node, self.wait)
                per["polls"] += 1
                if view is None:
                    per["unanswered"] += 1
                    continue
                per["poll_ms"].append((time.monotonic() - t0) * 1000)
                per["_last"] = view
                per["not_ready"] += not view.get("ready")
                per["suspended"] += bool(view.get("suspended"))
                is_root = bool(view.get("is_root"))
                if per["_was_root"] is not None and per["_was_root"] != is_root:
                    per["role_changes"] += 1
                per["_was_root"] = is_root
                for peer in view.get("peers", []):
                    if peer.get("rtt_ms") is not None:
                        per["peer_rtt_ms"].append(float(peer["rtt_ms"]))
                    age = peer.get("last_seen_age")
                    if age is not None:
                        per["peer_age_max_s"] = max(per["peer_age_max_s"], float(age))

    def summary(self) -> list[dict[str, Any]]:
        out = []
        for label, per in zip(self.labels, self.per, strict=True):
            rtt = sorted(per["peer_rtt_ms"])
            polls = sorted(per["poll_ms"])
            out.append(
                {
                    "server": label,
                    "polls": per["polls"],
                    "unanswered": per["unanswered"],
                    "not_ready": per["not_ready"],
                    "suspended": per["suspended"],
                    "role_changes": per["role_changes"],
                    "poll_ms_p50": round(percentile(polls, 0.5), 1) if polls else None,
                    "poll_ms_max": round(polls[-1], 1) if polls else None,
                    "peer_rtt_ms_p50": round(percentile(rtt, 0.5), 1) if rtt else None,
                    "peer_rtt_ms_p99": round(percentile(rtt, 0.99), 1) if rtt else None,
                    "peer_rtt_ms_max": round(rtt[-1], 1) if rtt else None,
                    "peer_status_age_max_s": round(per["peer_age_max_s"], 2),
                    **_server_side(per["_last"]),
                }
            )
        return out


def _server_side(view: dict[str, Any] | None) -> dict[str, Any]:
    """What the server measured itself, from its last status: its status-echo round
    trips and event-loop lag (windows of recent samples that span the flood) and how
    often flow control came on, by cause."""
    view = view or {}
    echo = view.get("echo_rtt") or {}
    lag = (view.get("loop") or {}).get("lag") or {}
    flow = (view.get("flow") or {}).get("episodes") or {}
    return {
        "echo_rtt_ms": [echo.get("p50_ms"), echo.get("p99_ms"), echo.get("max_ms")],
        "echo_count": echo.get("count"),
        "loop_lag_ms": [lag.get("p50_ms"), lag.get("p99_ms"), lag.get("max_ever_ms")],
        "flow_episodes": dict(flow),
    }


def _status(node: Node, wait: float) -> dict[str, Any] | None:
    """``ctl status`` over the control socket, as bench.failover's ``Node.status`` but
    waiting ``wait`` seconds, not 0.5: under the flood a slow answer is a figure (the
    server's event-loop lag), where a poll given up early would only count as unanswered."""
    from brokerd.server.control import request

    try:
        reply = request(node.data_dir, "status", timeout=wait)
    except (OSError, ValueError):
        return None
    return reply.get("result") if reply.get("ok") else None


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not ordered:
        raise ValueError("no values")
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]
