"""How many examples a hypothesis property runs.

The full suite (``make test``, CI) runs each property at the count written in
the test. The unit loop (``make test-fast`` sets ``ROOKERY_TEST_FAST=1``) runs
a fifth of it, at least 20: quick feedback while editing, the full search
before a change lands.
"""

from __future__ import annotations

import os

FAST = os.environ.get("ROOKERY_TEST_FAST") == "1"


def examples(count: int) -> int:
    """``count`` examples, or a fifth of them (at least 20) in the fast loop."""
    return max(20, count // 5) if FAST else count
