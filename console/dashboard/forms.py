"""Forms of the dashboard: the configuration editor and the root switch."""

from __future__ import annotations

import difflib
import json
from typing import Any

from django import forms

from clusterapi import configs
from clusterapi.configs import COMMENT_MAX
from clusterapi.errors import InvalidRequest


def pretty(document: Any) -> str:
    """A document as the editor shows it and diffs compare it (sorted keys, 2 spaces)."""
    return json.dumps(document, indent=2, sort_keys=True)


def diff(current: Any, proposed: Any, current_label: str) -> list[tuple[str, str]]:
    """Unified diff of two documents as (css class, line) pairs; empty when equal."""
    lines = difflib.unified_diff(
        pretty(current).splitlines() if current is not None else [],
        pretty(proposed).splitlines(),
        fromfile=current_label,
        tofile="edited",
        lineterm="",
    )
    out = []
    for line in lines:
        if line.startswith(("+++", "---")):
            kind = "head"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "same"
        out.append((kind, line))
    return out


class ConfigForm(forms.Form):
    """A new configuration version: the JSON document and a comment.

    Cleaning parses and validates with the console's own rules
    (:func:`clusterapi.configs.validate`), so an error names the bad key before
    anything is saved; ``normalised`` and ``checksum`` are then set.
    """

    document = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 18, "spellcheck": "false", "class": "code"}),
        help_text="The cluster configuration document (JSON); every key is optional.",
        strip=False,
    )
    comment = forms.CharField(max_length=COMMENT_MAX, required=False)

    normalised: dict[str, Any] | None = None
    checksum: str = ""

    def clean_document(self) -> Any:
        text = self.cleaned_data["document"]
        try:
            document = json.loads(text)
        except ValueError as exc:
            line = getattr(exc, "lineno", None)
            where = f" (line {line}, column {exc.colno})" if line else ""
            message = getattr(exc, "msg", str(exc))
            raise forms.ValidationError(f"not valid JSON: {message}{where}") from None
        try:
            self.normalised, self.checksum = configs.validate(document)
        except InvalidRequest as exc:
            raise forms.ValidationError(exc.message) from None
        return document


class RootForm(forms.Form):
    """Enable (1) or disable (0) a broker as root."""

    enabled = forms.TypedChoiceField(
        choices=[("1", "enable"), ("0", "disable")], coerce=lambda v: v == "1"
    )
