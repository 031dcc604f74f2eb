"""Forms of the dashboard: the configuration editor, the root switch, queue moves."""

from __future__ import annotations

from typing import Any

from django import forms

from clusterapi import configs
from clusterapi.configs import COMMENT_MAX
from clusterapi.errors import InvalidRequest
from console.jsonlimits import JsonRefused, load_json


class ConfigForm(forms.Form):
    """A new configuration version: the JSON document and a comment.

    Cleaning parses and validates with the console's own rules
    (:func:`clusterapi.configs.validate`), so an error names the bad key before
    anything is saved; ``normalised`` and ``checksum`` are then set.
    """

    document = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 18, "spellcheck": "false", "class": "code"}),
        help_text="The complete cluster configuration document (JSON). A key left out "
        "means each broker's own setting (listed below with its default), not what an "
        "earlier version set. Users' password hashes are not shown: a user without "
        "'password_hash' keeps the one it has; give one (brokerd hash-password) to set "
        "or change it.",
        strip=False,
    )
    comment = forms.CharField(max_length=COMMENT_MAX, required=False)
    #: the version the edit started from: saving after someone else pushed is refused
    base = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    normalised: dict[str, Any] | None = None
    checksum: str = ""

    def clean_document(self) -> Any:
        text = self.cleaned_data["document"]
        try:
            # the API's reader: a deep or absurd document is a form error, never a 500
            document = load_json(text)
        except JsonRefused as exc:
            raise forms.ValidationError(f"not accepted: {exc}") from None
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


class MoveForm(forms.Form):
    """The primary a queue moves to: its spid (the page's choice) or its name. Checked
    against the cluster by ``clusterapi.commands`` (a 409 names what is wrong)."""

    to = forms.CharField(max_length=255, strip=False)


class RebalanceForm(forms.Form):
    """The vhost whose shared queues a rebalance spreads."""

    vhost = forms.CharField(max_length=255, strip=False)
