"""The bridges page's context: each bridge with where it runs and its state."""

from __future__ import annotations

from typing import Any

from django.http import QueryDict

from clusterapi import bridges
from console.dashboard.readable import stamp


def build_bridges(params: QueryDict) -> dict[str, Any]:
    """The rows of ``clusterapi.bridges``, each with its state's time for ``when.html``."""
    rows = bridges.rows()
    for row in rows:
        row["since_stamp"] = stamp(row["since_at"]) if row["since_at"] else None
    return {"bridges": rows}
