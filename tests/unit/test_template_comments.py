"""Django's ``{# ... #}`` comments are one line only: one that spans lines is shown
on the page as text (the broker page once showed a fragment's notes)."""

from __future__ import annotations

from pathlib import Path

import pytest

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


@pytest.mark.parametrize(
    "path", sorted(TEMPLATES.rglob("*.html")), ids=lambda p: str(p.relative_to(TEMPLATES))
)
def test_no_comment_spans_lines(path: Path) -> None:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        start = line.find("{#")
        assert start < 0 or "#}" in line[start:], (
            f"{path.relative_to(TEMPLATES)}:{number}: a {{# comment #}} must end on its "
            "line (use {% comment %} for more)"
        )
