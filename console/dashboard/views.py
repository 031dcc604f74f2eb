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
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST, require_safe

from clusterapi import (
    alarms,
    cluster,
    commands,
    decommission,
    groups,
    members,
    objects,
    owners,
)
from clusterapi.cluster import notify_dashboard
from clusterapi.errors import Conflict, InvalidRequest, Unavailable
from clusterapi.models import Alarm, Broker, Command, QueueSnapshot
from clusterapi.roles import is_operator
from console.dashboard.broker_page import banner_commands
from console.dashboard.forms import MoveForm, RebalanceForm, RootForm
from console.dashboard.pages import PAGES, queue_moves, rebalance_view
from console.dashboard.readable import with_stamps


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
alarm_list = page_view("alarms")
bridge_list = page_view("bridges")


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


def object_view(name: str) -> Callable[[HttpRequest, int], HttpResponse]:
    """One queue, exchange or binding by the id of any broker's row (live); 404 if none."""

    @require_safe
    @login_required
    def view(request: HttpRequest, pk: int) -> HttpResponse:
        params = request.GET.copy()
        params["id"] = str(pk)
        page = PAGES[name]
        context = page.context(params)
        if context["object"] is None:
            raise Http404(f"no {name} with id {pk}")
        context["can_operate"] = is_operator(request.user)
        return render(request, page.template, context)

    view.__name__ = view.__qualname__ = f"{name}_detail"
    view.__doc__ = f"One {name}: as the cluster shows it, and as each broker reports it."
    return view


queue_detail = object_view("queue")
exchange_detail = object_view("exchange")
binding_detail = object_view("binding")


# -- operator actions -----------------------------------------------------------------------


def require_operator(request: HttpRequest) -> None:
    if not is_operator(request.user):
        raise PermissionDenied("only operators may change the cluster")


def _command_answer(
    request: HttpRequest,
    broker: Broker,
    command: Command | None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    """The outcome of an action: for htmx, the broker page's banner (the same live
    fragment that then follows the command to its outcome); a message and a redirect
    otherwise."""
    if is_htmx(request):
        html = render_to_string(
            "dashboard/fragments/command_banner.html",
            {"banner": banner_commands(broker), "error": error, "broker": broker},
        )
        return HttpResponse(html, status=status)
    if command is not None:
        messages.success(request, f"{command.name} sent to {broker.name}")
    else:
        messages.error(request, error)
    return redirect("dashboard:broker", name=broker.name)


def _issue(request: HttpRequest, broker: Broker, name: str) -> HttpResponse:
    try:
        command = commands.issue(broker, name, None, request.user)
    except InvalidRequest as exc:
        status = 409 if isinstance(exc, Conflict) else 400
        return _command_answer(request, broker, None, exc.message, status)
    return _command_answer(request, broker, command)


@require_POST
@login_required
def broker_root(request: HttpRequest, name: str) -> HttpResponse:
    """Enable or disable a broker as root (``enabled`` = 1 or 0)."""
    require_operator(request)
    target = get_object_or_404(Broker, name=name)
    form = RootForm(request.POST)
    if not form.is_valid():
        return _command_answer(request, target, None, "enabled: must be 1 or 0", 400)
    enabled = form.cleaned_data["enabled"]
    return _issue(request, target, Command.ROOT_ENABLE if enabled else Command.ROOT_DISABLE)


@login_required
def broker_decommission(request: HttpRequest, name: str) -> HttpResponse:
    """Retire a broker that is gone for good (operators; audited): GET is the
    confirmation step (what retiring does, what to edit on the servers, the name to type
    again), POST retires it and shows what is left to do on the servers."""
    require_operator(request)
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD, POST"})
    broker = get_object_or_404(Broker, name=name)
    context: dict[str, object] = {
        "broker": broker,
        "page": "brokers",
        "can_operate": True,
        "refusal": decommission.refusal(broker),
        "next_steps": decommission.advice(broker),
        "error": "",
        "done": None,
    }
    status = 200
    if request.method == "POST":
        try:
            context["done"] = decommission.retire(
                broker, request.user, request.POST.get("confirm", "").strip()
            )
        except InvalidRequest as exc:
            context["error"] = exc.message
            status = 409 if isinstance(exc, Conflict) else 400
        else:
            messages.success(request, f"{broker.name} is retired.")
            context["next_steps"] = context["done"]["next"]  # type: ignore[index]
    context["cluster"] = cluster.state()
    return render(request, "dashboard/broker_decommission.html", context, status=status)


def _error_status(exc: InvalidRequest) -> int:
    if isinstance(exc, Unavailable):
        return 503
    return 409 if isinstance(exc, Conflict) else 400


def _member_command(
    request: HttpRequest,
    template: str,
    send: Callable[[str], Command],
    extra: dict[str, object] | None = None,
) -> HttpResponse:
    """A command about one member, from the dashboard (operators; audited): GET is the
    confirmation step (``template``, with the member as the root reports it), POST
    sends the command (``send(address)``) and goes back to the overview, whose Members
    section follows it to its outcome, the root's refusal included."""
    require_operator(request)
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD, POST"})
    source = request.POST if request.method == "POST" else request.GET
    address = source.get("address", "").strip()
    shown = members.shown()
    row = next((m for m in shown["members"] if m["address"] == address), None)
    context: dict[str, object] = {
        "page": "overview",
        "address": address,
        "member": row,
        "members": shown,
        "error": "",
        "can_operate": True,
        "cluster": cluster.state(),
        **(extra or {}),
    }
    status = 200
    if request.method == "POST":
        try:
            command = send(address)
        except InvalidRequest as exc:
            context["error"], status = exc.message, _error_status(exc)
        else:
            messages.success(
                request,
                f"{command.name} of {command.args['address']} sent to {command.broker.name}: "
                "the Members section shows the answer",
            )
            return redirect(reverse("home") + "#cluster-members")
    return render(request, template, context, status=status)


@login_required
def member_forget(request: HttpRequest) -> HttpResponse:
    """Forget a stopped cluster member for good: ``cluster.forget`` to a linked broker,
    the root first, after a confirmation step saying what forgetting does."""
    return _member_command(
        request,
        "dashboard/member_forget.html",
        lambda address: members.forget(address, request.user),
    )


@login_required
def member_groups(request: HttpRequest) -> HttpResponse:
    """Take a running primary into every quorum group that leaves it out (``action``
    grow) or out of every group naming it (shrink): ``queues.grow|shrink`` to a linked
    broker, the root first, after a confirmation step; the Members section shows each
    queue's answer."""
    source = request.POST if request.method == "POST" else request.GET
    action = source.get("action", "")
    return _member_command(
        request,
        "dashboard/member_groups.html",
        lambda address: groups.change(action, address, request.user),
        {"action": action if action in groups.ACTIONS else ""},
    )


@require_POST
@login_required
def broker_dump(request: HttpRequest, name: str) -> HttpResponse:
    """Ask a broker for its state dump; the text shows on its page once acked."""
    require_operator(request)
    return _issue(request, get_object_or_404(Broker, name=name), Command.STATE_DUMP)


def _queue_answer(
    request: HttpRequest,
    fragment: str,
    context: dict[str, object],
    back: str,
    command: Command | None,
    error: str,
    status: int,
) -> HttpResponse:
    """The outcome of a queue action: for htmx, the section's result fragment (which the
    live page then follows to the command's outcome); a message and a redirect otherwise."""
    if is_htmx(request):
        html = render_to_string(fragment, {**context, "error": error})
        return HttpResponse(html, status=status)
    if command is not None:
        messages.success(request, f"{command.name} sent to {command.broker.name}")
    else:
        messages.error(request, error)
    return redirect(back)


@require_POST
@login_required
def queue_move(request: HttpRequest, pk: int) -> HttpResponse:
    """Hand a shared queue to another primary (``to``: its spid or name); audited."""
    require_operator(request)
    row = get_object_or_404(QueueSnapshot.objects.select_related("broker"), pk=pk)
    queue = objects.representative(row)
    form = MoveForm(request.POST)
    command, error, status = None, "", 200
    if not form.is_valid():
        error, status = "to: choose the primary to move the queue to", 400
    else:
        try:
            command = owners.move(queue, form.cleaned_data["to"], request.user)
        except InvalidRequest as exc:
            error, status = exc.message, 409 if isinstance(exc, Conflict) else 400
    return _queue_answer(
        request,
        "dashboard/fragments/queue_move_result.html",
        {"banner": queue_moves(queue)["banner"]} if queue.shared else {},
        reverse("dashboard:queue", args=[row.pk]),
        command,
        error,
        status,
    )


@require_POST
@login_required
def queues_rebalance(request: HttpRequest) -> HttpResponse:
    """Spread the shared queues' owners of a vhost over the primaries; audited."""
    require_operator(request)
    form = RebalanceForm(request.POST)
    command, error, status = None, "", 200
    if not form.is_valid():
        error, status = "vhost: give the virtual host whose queues to spread", 400
    else:
        try:
            command = owners.rebalance(form.cleaned_data["vhost"], request.user)
        except InvalidRequest as exc:
            error, status = exc.message, 409 if isinstance(exc, Conflict) else 400
    return _queue_answer(
        request,
        "dashboard/fragments/queue_rebalance_result.html",
        {"banner": rebalance_view()["banner"]},
        reverse("dashboard:queues"),
        command,
        error,
        status,
    )


@require_POST
@login_required
def alarm_acknowledge(request: HttpRequest, pk: int) -> HttpResponse:
    """Acknowledge an active alarm (operators; audited): htmx gets the active-alarms
    list back, a plain form post a redirect to where it came from."""
    require_operator(request)
    alarm = get_object_or_404(Alarm, pk=pk)
    error = ""
    try:
        alarms.acknowledge(alarm, request.user, request.POST.get("comment", "")[:500])
    except InvalidRequest as exc:
        error = exc.message
    notify_dashboard("alarm", alarm.broker.name if alarm.broker_id else None)
    if is_htmx(request):
        active = Alarm.objects.filter(active=True).select_related("broker")
        html = render_to_string(
            "dashboard/fragments/active_alarms.html",
            {
                "alarms": with_stamps(active, "raised_at", "acknowledged_at"),
                "can_operate": True,
                "error": error,
            },
            request=request,
        )
        return HttpResponse(html, status=409 if error else 200)
    if error:
        messages.error(request, error)
    else:
        messages.success(request, f"Alarm {alarm.kind} acknowledged")
    back = request.POST.get("next", "")
    safe = url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure())
    return redirect(back if back and safe else "dashboard:alarms")
