"""How many examples a hypothesis property runs.

The full suite (``make test``, CI) runs each property at the count written in
the test. The unit loop (``make test-fast`` sets ``ROOKERY_TEST_FAST=1``) runs
a fifth of it, at least 20: quick feedback while editing, the full search
before a change lands.
"""

from __future__ import annotations

import os

FAST = os.environ.get("ROOKERY_TEST_FAST") == "1"


def examples(count: int, fast: int | None = None) -> int:
    """``count`` examples, or in the fast loop ``fast`` (default: a fifth of them, at
    least 20; a costly state machine says fewer)."""
    if not FAST:
        return count
    return fast if fast is not None else max(20, count // 5)
