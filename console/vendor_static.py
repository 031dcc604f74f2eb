"""Serve the third-party browser scripts straight from ``node_modules``.

htmx, its websocket extension and uPlot come from the npm registry
(``package.json`` + ``package-lock.json``, installed by ``make setup``); none is
committed. This staticfiles finder publishes a fixed set of files from
``node_modules`` under ``static/vendor/``, so templates write
``{% static 'vendor/htmx.min.js' %}`` and ``collectstatic`` copies exactly these
files (not whole package directories) to ``STATIC_ROOT``.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.staticfiles.finders import BaseFinder
from django.core.checks import CheckMessage, Warning
from django.core.files.storage import FileSystemStorage

PREFIX = "vendor"

# Static name under vendor/  ->  file inside node_modules.
VENDOR_FILES: dict[str, str] = {
    "htmx.min.js": "htmx.org/dist/htmx.min.js",
    "htmx-ext-ws.min.js": "htmx-ext-ws/dist/ws.min.js",
    "uPlot.iife.min.js": "uplot/dist/uPlot.iife.min.js",
    "uPlot.min.css": "uplot/dist/uPlot.min.css",
}


def node_modules_dir() -> Path:
    """``settings.NODE_MODULES_DIR``, default ``node_modules`` in the checkout."""
    return Path(getattr(settings, "NODE_MODULES_DIR", settings.BASE_DIR / "node_modules"))


class VendorStorage(FileSystemStorage):
    """Read-only view of ``node_modules`` in which each vendor name is its own file.

    collectstatic reads the source through ``path()``/``open()`` and writes it to
    ``prefix/name``, so mapping the names here is all it takes to publish
    ``ws.min.js`` of htmx-ext-ws as ``vendor/htmx-ext-ws.min.js``.
    """

    def __init__(self, files: dict[str, Path]) -> None:
        super().__init__(location=str(node_modules_dir()))
        self.prefix = PREFIX
        self.files = files

    def path(self, name: str) -> str:
        return str(self.files[name])

    def exists(self, name: str) -> bool:
        return name in self.files and self.files[name].is_file()


class NodeModulesFinder(BaseFinder):
    """Find ``vendor/<name>`` in ``node_modules`` for the names in ``VENDOR_FILES``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        root = node_modules_dir()
        self.files = {name: root / relative for name, relative in VENDOR_FILES.items()}
        self.storage = VendorStorage(self.files)

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        missing = [str(path) for path in self.files.values() if not path.is_file()]
        if not missing:
            return []
        return [
            Warning(
                f"Vendor scripts are missing from node_modules: {', '.join(missing)}",
                hint="Run `make setup` (npm ci) in the checkout.",
                id="rookery.W001",
            )
        ]

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> str | list[str]:
        prefix = PREFIX + "/"
        normalized = path.replace(os.sep, "/")
        found = None
        if normalized.startswith(prefix):
            candidate = self.files.get(normalized.removeprefix(prefix))
            if candidate is not None and candidate.is_file():
                found = str(candidate)
        if find_all:
            return [found] if found else []
        return found or []

    def list(self, ignore_patterns: list[str] | None) -> Iterator[tuple[str, FileSystemStorage]]:
        for name, path in self.files.items():
            if ignore_patterns and any(fnmatch.fnmatchcase(name, p) for p in ignore_patterns):
                continue
            if path.is_file():
                yield name, self.storage
