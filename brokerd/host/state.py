"""The supervising parent's state file, as a worker reads it.

The parent (``brokerd/host/supervisor.py``) writes ``DATA_DIR/host/state.json``
after every change. A worker reads one thing from it: whether the whole host
is stopping. A worker stopping alone hands root and its queues to its
siblings; when every worker stops at once there is no sibling to take them,
and each worker's journal keeps its durable queues for the next start.
"""

from __future__ import annotations

import json
from pathlib import Path

STATE_NAME = "state.json"


def host_stopping(path: Path | None) -> bool:
    """The parent is stopping every worker (a planned stop of the host)."""
    if path is None:
        return False
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and state.get("stopping") is True
