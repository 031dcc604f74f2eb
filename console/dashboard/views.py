"""Dashboard views: pages (GET, login required) and operator actions (POST).

Pages render :mod:`console.dashboard.pages` contexts; actions go through the
clusterapi services (commands, configuration versions), never around them.
Actions answer htmx requests with a fragment swapped into the page and plain
form posts with a redirect back, so the pages also work without scripts.
Read-only users see no action buttons, and every action checks the role again
(403): hiding a button is not a permission.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_POST, require_safe

from clusterapi import commands, configs
from clusterapi.errors import InvalidRequest
from clusterapi.models import Broker, Command
from clusterapi.roles import is_operator
from console.dashboard.forms import ConfigForm, RootForm, diff, pretty
from console.dashboard.pages import PAGES


def is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


def render_page(
    request: HttpRequest, name: str, params: QueryDict, **extra: object
) -> HttpResponse:
    page = PAGES[name]
    context = page.context(params)
    context["can_operate"] = is_operator(request.user)
    context.update(extra)
    return render(request, page.template, context)


def page_view(name: str) -> Callable[[HttpRequest], HttpResponse]:
    @require_safe
    @login_required
    def view(request: HttpRequest) -> HttpResponse:
        return render_page(request, name, request.GET)

    view.__name__ = view.__qualname__ = name
    view.__doc__ = f"The {name} page (live)."
    return view


overview = page_view("overview")
brokers = page_view("brokers")
queues = page_view("queues")
exchanges = page_view("exchanges")
bindings = page_view("bindings")
command_log = page_view("commands")
audit_log = page_view("audit")
alarms = page_view("alarms")


@require_safe
@login_required
def broker(request: HttpRequest, name: str) -> HttpResponse:
    """One broker: state, peer links, queues, exchanges, bindings, commands, dump."""
    params = request.GET.copy()
    params["broker"] = name
    page = PAGES["broker"]
    context = page.context(params)
    if context["broker"] is None:
        raise Http404(f"no broker named {name}")
    context["can_operate"] = is_operator(request.user)
    return render(request, page.template, context)


# -- operator actions -----------------------------------------------------------------------


def require_operator(request: HttpRequest) -> None:
    if not is_operator(request.user):
        raise PermissionDenied("only operators may change the cluster")


def _command_answer(
    request: HttpRequest, broker: Broker, command: Command | None, error: str = ""
) -> HttpResponse:
    """The outcome of an action: a fragment for htmx, a message and a redirect otherwise."""
    if is_htmx(request):
        html = render_to_string(
            "dashboard/fragments/command_issued.html",
            {"command": command, "error": error, "broker": broker},
        )
        return HttpResponse(html, status=200 if command else 400)
    if command is not None:
        messages.success(request, f"{command.name} sent to {broker.name}")
    else:
        messages.error(request, error)
    return redirect("dashboard:broker", name=broker.name)


def _issue(request: HttpRequest, broker: Broker, name: str) -> HttpResponse:
    try:
        command = commands.issue(broker, name, None, request.user)
    except InvalidRequest as exc:
        return _command_answer(request, broker, None, exc.message)
    return _command_answer(request, broker, command)


@require_POST
@login_required
def broker_root(request: HttpRequest, name: str) -> HttpResponse:
    """Enable or disable a broker as root (``enabled`` = 1 or 0)."""
    require_operator(request)
    target = get_object_or_404(Broker, name=name)
    form = RootForm(request.POST)
    if not form.is_valid():
        return _command_answer(request, target, None, "enabled: must be 1 or 0")
    enabled = form.cleaned_data["enabled"]
    return _issue(request, target, Command.ROOT_ENABLE if enabled else Command.ROOT_DISABLE)


@require_POST
@login_required
def broker_dump(request: HttpRequest, name: str) -> HttpResponse:
    """Ask a broker for its state dump; the text shows on its page once acked."""
    require_operator(request)
    return _issue(request, get_object_or_404(Broker, name=name), Command.STATE_DUMP)


# -- configuration ------------------------------------------------------------------------


def _editor(
    request: HttpRequest, form: ConfigForm, *, checked: bool = False, pushed: object = None
) -> dict[str, object]:
    """Context of the editor fragment: the form, and once checked the diff to current."""
    current = configs.current()
    changes = None
    if checked and form.normalised is not None:
        label = f"version {current.number}" if current else "(no version yet)"
        changes = diff(current.document if current else None, form.normalised, label)
    return {
        "form": form,
        "checked": checked,
        "changes": changes,
        "current": current,
        "pushed": pushed,
        "can_operate": is_operator(request.user),
    }


def _fresh_form() -> ConfigForm:
    current = configs.current()
    return ConfigForm(initial={"document": pretty(current.document) if current else "{}"})


@login_required
def config(request: HttpRequest) -> HttpResponse:
    """The configuration page; POST (operators) validates, saves and pushes a version."""
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD, POST"})
    if request.method != "POST":
        return render_page(request, "config", request.GET, **_editor(request, _fresh_form()))
    require_operator(request)
    form = ConfigForm(request.POST)
    version = None
    if form.is_valid():
        try:
            version = configs.create_version(
                form.cleaned_data["document"], request.user, form.cleaned_data["comment"]
            )
        except InvalidRequest as exc:
            form.add_error("document", exc.message)
    if version is not None:
        if not is_htmx(request):
            messages.success(request, f"Version {version.number} saved and pushed")
            return redirect("dashboard:config")
        context = _editor(request, _fresh_form(), pushed=version)
        return HttpResponse(
            render_to_string("dashboard/fragments/config_editor.html", context, request=request)
        )
    context = _editor(request, form, checked=True)
    if is_htmx(request):
        return HttpResponse(
            render_to_string("dashboard/fragments/config_editor.html", context, request=request)
        )
    return render_page(request, "config", request.GET, **context)


@require_POST
@login_required
def config_validate(request: HttpRequest) -> HttpResponse:
    """Check an edited document without saving it: errors in place, or the diff."""
    require_operator(request)
    form = ConfigForm(request.POST)
    form.is_valid()
    context = _editor(request, form, checked=True)
    html = render_to_string("dashboard/fragments/config_editor.html", context, request=request)
    if is_htmx(request):
        return HttpResponse(html)
    return render_page(request, "config", request.GET, **context)
