"""What a worker of ``brokerd --workers`` reads of its parent's state file.

The parent (``brokerd/host/supervisor.py``) writes ``DATA_DIR/host/state.json``
after every change. A worker reads one thing from it: whether the whole host
is stopping. It lives here, in the server, so that imports go one way: the
host (the parent) knows the server, the server never imports the host.

A worker stopping alone hands root and its queues to its siblings; when
every worker stops at once there is no sibling to take them, and each
worker's journal keeps its durable queues for the next start.
"""

from __future__ import annotations

import json
from pathlib import Path


def host_stopping(path: Path | None) -> bool:
    """The parent is stopping every worker (a planned stop of the host)."""
    if path is None:
        return False
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and state.get("stopping") is True
