"""The staticfiles finder that serves htmx, htmx-ext-ws and uPlot from node_modules."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.templatetags.static import static

from console.vendor_static import VENDOR_FILES, NodeModulesFinder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_finders() -> None:
    finders.get_finder.cache_clear()


def test_every_vendor_name_resolves_to_its_file_in_node_modules() -> None:
    for name, relative in VENDOR_FILES.items():
        found = finders.find(f"vendor/{name}")
        assert found == str(REPO / "node_modules" / relative), name
        assert Path(found).stat().st_size > 1000
    assert static("vendor/htmx.min.js") == "/static/vendor/htmx.min.js"


def test_unknown_and_escaping_names_are_not_found() -> None:
    finder = NodeModulesFinder()
    assert finder.find("vendor/nope.js") == []
    assert finder.find("vendor/../package.json") == []
    assert finder.find("htmx.min.js") == []
    assert finder.find("vendor/htmx.min.js", find_all=True) == [
        str(REPO / "node_modules/htmx.org/dist/htmx.min.js")
    ]


def test_collectstatic_copies_exactly_the_vendor_files(settings, tmp_path: Path) -> None:
    settings.STATIC_ROOT = tmp_path / "static"
    call_command("collectstatic", interactive=False, verbosity=0)
    vendor = sorted(p.name for p in (tmp_path / "static" / "vendor").iterdir())
    assert vendor == sorted(VENDOR_FILES)
    copied = (tmp_path / "static/vendor/htmx-ext-ws.min.js").read_bytes()
    assert copied == (REPO / "node_modules/htmx-ext-ws/dist/ws.min.js").read_bytes()


def test_missing_node_modules_is_a_check_warning(settings, tmp_path: Path) -> None:
    settings.NODE_MODULES_DIR = tmp_path / "node_modules"
    finder = NodeModulesFinder()
    [warning] = finder.check()
    assert warning.id == "rookery.W001" and "make setup" in warning.hint
    assert finder.find("vendor/htmx.min.js") == []
    assert list(finder.list(None)) == []
