"""The reports pages: runs of the traffic report, one run's charts and incidents.

Not live over the websocket (a report changes once, when its job ends): a page
showing an unfinished run reloads itself every few seconds until it is done.
"Run report now" goes through :func:`clusterapi.reports.request_run`, checked
for the operator role like every dashboard action.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST, require_safe

from clusterapi import cluster, reports
from clusterapi.api.reports import headline
from clusterapi.errors import InvalidRequest
from clusterapi.models import ReportRun
from clusterapi.roles import is_operator
from console.dashboard.pages import PAGE_SIZE
from console.dashboard.readable import absolute, with_stamps

#: seconds between reloads of a page showing an unfinished run
REFRESH_SECONDS = 5
#: incidents listed on a run's page (all of them are in summary.json)
INCIDENTS_SHOWN = 500
LOCAL_INPUT = "%Y-%m-%dT%H:%M"


def _utc_input(label: str) -> forms.DateTimeField:
    """An optional ``datetime-local`` input (no zone: the form reads it as UTC)."""
    return forms.DateTimeField(
        required=False,
        label=label,
        input_formats=[LOCAL_INPUT, "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format=LOCAL_INPUT),
    )


class ReportRequestForm(forms.Form):
    """The optional period of a run, in UTC (``datetime-local`` inputs carry no zone)."""

    period_from = _utc_input("From (UTC)")
    period_to = _utc_input("To (UTC, exclusive)")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        start, end = data.get("period_from"), data.get("period_to")
        if start and end and start >= end:
            raise forms.ValidationError("the period's start must be before its end")
        return data


def _base(request: HttpRequest) -> dict[str, Any]:
    return {"cluster": cluster.state(), "page": "reports", "can_operate": is_operator(request.user)}


def _duration(run: ReportRun) -> str:
    if run.started_at is None:
        return ""
    seconds = ((run.finished_at or dt.datetime.now(dt.UTC)) - run.started_at).total_seconds()
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


@require_safe
@login_required
def report_list(request: HttpRequest) -> HttpResponse:
    """Every run, newest first, with its state in words and its headline numbers."""
    return _render_list(request, ReportRequestForm())


def _render_list(request: HttpRequest, form: ReportRequestForm, status: int = 200) -> HttpResponse:
    page = Paginator(ReportRun.objects.select_related("requested_by"), PAGE_SIZE).get_page(
        request.GET.get("p")
    )
    runs = with_stamps(page.object_list, "created_at", "finished_at")
    for run in runs:
        run.headline = headline(run.summary) if run.state == ReportRun.STATE_SUCCEEDED else None
        run.duration = _duration(run)
    context = _base(request)
    context.update(
        runs=runs,
        page_obj=page,
        page_query="",
        form=form,
        refresh=REFRESH_SECONDS if any(run.is_open for run in runs) else None,
    )
    return render(request, "dashboard/reports.html", context, status=status)


@require_POST
@login_required
def report_run(request: HttpRequest) -> HttpResponse:
    """Request a run now (operators); the list with the form's errors (400) if invalid."""
    if not is_operator(request.user):
        raise PermissionDenied("running a report needs the operator role")
    form = ReportRequestForm(request.POST)
    if not form.is_valid():
        return _render_list(request, form, status=400)
    start, end = _utc(form.cleaned_data["period_from"]), _utc(form.cleaned_data["period_to"])
    try:
        reports.check_period(start, end)
        run = reports.request_run(request.user, start, end)
    except InvalidRequest as exc:
        form.add_error(None, exc.message)
        return _render_list(request, form, status=400)
    messages.success(request, f"Report {run.pk} requested: it runs in the background.")
    target = reverse("dashboard:report", args=[run.pk])
    if request.headers.get("HX-Request") == "true":
        return HttpResponse(status=204, headers={"HX-Redirect": target})
    return redirect(target)


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    """Form times are UTC (the console's TIME_ZONE); make that explicit."""
    return None if value is None else value.astimezone(dt.UTC)


@require_safe
@login_required
def report_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """One run: state, headline, charts, incidents, root timeline, downloads."""
    run = get_object_or_404(ReportRun.objects.select_related("requested_by"), pk=pk)
    (run,) = with_stamps([run], "created_at", "started_at", "finished_at")
    summary = run.summary if run.state == ReportRun.STATE_SUCCEEDED else None
    summary = summary if isinstance(summary, dict) else None
    incidents = [_with_times(i) for i in (summary or {}).get("incidents") or []]
    root = (summary or {}).get("root")
    if isinstance(root, dict):
        root = {**root, "timeline": [_with_times(s) for s in root.get("timeline") or []]}
    period = (summary or {}).get("period") or {}
    context = _base(request)
    context.update(
        run=run,
        duration=_duration(run),
        summary=summary,
        headline=headline(summary),
        capacity=(summary or {}).get("capacity"),
        root=root,
        first_sample=absolute(period.get("first_sample")),
        last_sample=absolute(period.get("last_sample")),
        growing=(summary or {}).get("queues_growing") or [],
        incidents=incidents[:INCIDENTS_SHOWN],
        incidents_total=len(incidents),
        charts=reports.chart_series(run) if summary else None,
        has_summary=reports.summary_path(run) is not None,
        tables=reports.table_names(run),
        refresh=REFRESH_SECONDS if run.is_open else None,
    )
    return render(request, "dashboard/reports_detail.html", context)


def _with_times(row: Any) -> Any:
    """An incident or root segment of a summary with ``start``/``end`` as times a person
    reads (ISO 8601 on hover); a row that is not an object is left as it is."""
    if not isinstance(row, dict):
        return row
    return {**row, "start_at": absolute(row.get("start")), "end_at": absolute(row.get("end"))}
