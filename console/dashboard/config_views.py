"""The configuration page's actions: validate, save and push, push a version again.

Every action is for operators (checked again here: a hidden button is not a
permission) and goes through :mod:`clusterapi.configs`. Saving pushes to every
broker, so the page asks for a confirmation first (``hx-confirm``); a document
equal to the current one saves nothing, one equal to an older version pushes
that version again, and an edit that started from a version that is no longer
current is refused rather than silently replacing someone else's push.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.loader import render_to_string
from django.views.decorators.http import require_POST

from clusterapi import configs, convergence
from clusterapi.errors import InvalidRequest
from clusterapi.models import ConfigVersion
from clusterapi.roles import is_operator
from console.dashboard.config_context import diff, pretty, running_diffs
from console.dashboard.forms import ConfigForm
from console.dashboard.views import is_htmx, render_page, require_operator

OUTCOMES = {
    configs.CREATED: "Version {n} saved and pushed to every broker that is up.",
    configs.UNCHANGED: "No change: this document is version {n}, the current one. Nothing "
    "was saved or pushed.",
    configs.REPUSHED: "This document is version {n}: it was pushed again and is current.",
}


def editor_context(
    request: HttpRequest, form: ConfigForm, *, checked: bool = False, notice: str = ""
) -> dict[str, object]:
    """The editor fragment's context: the form, the unset keys with their defaults, and
    once checked, the diffs against the current version and what brokers run."""
    current = configs.current()
    document = form.normalised if checked and form.normalised is not None else None
    changes = None
    running = []
    if document is not None:
        label = f"version {current.number}" if current else "(no version yet)"
        changes = diff(current.document if current else None, document, label)
        running = running_diffs(document, "edited")
    shown = document if document is not None else (current.document if current else {})
    return {
        "form": form,
        "checked": checked,
        "changes": changes,
        "editor_running": running,
        "editor_unset": convergence.unset_keys(shown),
        "current": current,
        "notice": notice,
        "can_operate": is_operator(request.user),
    }


def fresh_form() -> ConfigForm:
    """The editor as it opens: the current document, based on the current version."""
    current = configs.current()
    return ConfigForm(
        initial={
            "document": pretty(current.document) if current else "{}",
            "base": current.number if current else None,
        }
    )


def _editor_answer(request: HttpRequest, context: dict[str, object]) -> HttpResponse:
    if is_htmx(request):
        return HttpResponse(
            render_to_string("dashboard/fragments/config_editor.html", context, request=request)
        )
    return render_page(request, "config", request.GET, **context)


@login_required
def config(request: HttpRequest) -> HttpResponse:
    """The configuration page; POST (operators) saves and pushes the edited document."""
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD, POST"})
    if request.method != "POST":
        return render_page(request, "config", request.GET, **editor_context(request, fresh_form()))
    require_operator(request)
    form = ConfigForm(request.POST)
    saved = None
    if form.is_valid():
        try:
            saved = configs.save(
                form.cleaned_data["document"],
                request.user,
                form.cleaned_data["comment"],
                base=form.cleaned_data.get("base"),
            )
        except InvalidRequest as exc:
            form.add_error("document", exc.message)
    if saved is None:
        return _editor_answer(request, editor_context(request, form, checked=True))
    notice = OUTCOMES[saved.outcome].format(n=saved.version.number)
    if not is_htmx(request):
        messages.success(request, notice)
        return redirect("dashboard:config")
    return _editor_answer(request, editor_context(request, fresh_form(), notice=notice))


@require_POST
@login_required
def config_validate(request: HttpRequest) -> HttpResponse:
    """Check an edited document without saving it: errors in place, or the diffs."""
    require_operator(request)
    form = ConfigForm(request.POST)
    form.is_valid()
    return _editor_answer(request, editor_context(request, form, checked=True))


@require_POST
@login_required
def config_push(request: HttpRequest, number: int) -> HttpResponse:
    """Push a version again (operators): back to an older one, or to fix a drift."""
    require_operator(request)
    version = get_object_or_404(ConfigVersion, number=number)
    configs.repush(version, request.user, request.POST.get("comment", "")[:500])
    notice = f"Version {version.number} pushed again to every broker that is up; it is current."
    if not is_htmx(request):
        messages.success(request, notice)
        return redirect("dashboard:config")
    return _editor_answer(request, editor_context(request, fresh_form(), notice=notice))
