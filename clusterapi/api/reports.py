"""Report runs in the API: ``/api/v1/reports/``.

Everyone signed in reads runs, their summaries and their files; operators
request a run (``POST``, 202: the Celery task archives and runs the job). Files
are served only by name from what the run's summary lists, never from a path
built out of the URL, and a missing one is a JSON 404.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.urls import reverse
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from clusterapi import reports
from clusterapi.api.serializers import UsernameField
from clusterapi.api.strict import StrictSerializer
from clusterapi.api.views import ReadOnlyViewSet
from clusterapi.models import ReportRun

PARQUET = "application/vnd.apache.parquet"


class HeadlineSerializer(serializers.Serializer):
    """A run's few numbers, taken from its summary."""

    period = serializers.JSONField(help_text="from, to, first_sample, last_sample, seconds")
    brokers = serializers.ListField(child=serializers.CharField(), allow_null=True)
    samples = serializers.JSONField(help_text="rows read per lake table")
    totals = serializers.JSONField(help_text="messages published, routed, delivered")
    cluster_isr_peak = serializers.FloatField(allow_null=True, help_text="messages/s")
    cluster_xsr_peak = serializers.FloatField(allow_null=True, help_text="messages/s")
    incidents = serializers.IntegerField()


class DownloadsSerializer(serializers.Serializer):
    summary = serializers.URLField(allow_null=True, help_text="summary.json (null: none)")
    tables = serializers.DictField(
        child=serializers.URLField(), help_text="table name -> one Parquet file"
    )


class ReportRunSerializer(serializers.ModelSerializer):
    requested_by = UsernameField(allow_null=True)
    state_text = serializers.CharField(source="get_state_display", help_text="the state in words")
    headline = serializers.SerializerMethodField(
        help_text="brokers, samples, totals, peaks and incident count (null until succeeded)"
    )
    downloads = serializers.SerializerMethodField(
        help_text="URLs of summary.json and of each output table as one Parquet file"
    )

    class Meta:
        model = ReportRun
        fields = [
            "id",
            "state",
            "state_text",
            "trigger",
            "requested_by",
            "period_from",
            "period_to",
            "created_at",
            "started_at",
            "finished_at",
            "error",
            "headline",
            "downloads",
        ]
        read_only_fields = fields

    @extend_schema_field(HeadlineSerializer(allow_null=True))
    def get_headline(self, run: ReportRun) -> dict[str, Any] | None:
        return headline(run.summary) if run.state == ReportRun.STATE_SUCCEEDED else None

    @extend_schema_field(DownloadsSerializer)
    def get_downloads(self, run: ReportRun) -> dict[str, Any]:
        request = self.context.get("request")

        def url(route: str, **kwargs: Any) -> str:
            path = reverse(route, kwargs={"pk": run.pk, **kwargs})
            return request.build_absolute_uri(path) if request is not None else path

        has_summary = reports.summary_path(run) is not None
        return {
            "summary": url("report-summary-file") if has_summary else None,
            "tables": {
                name: url("report-table-file", name=name) for name in reports.table_names(run)
            },
        }


class ReportRunDetailSerializer(ReportRunSerializer):
    summary = serializers.JSONField(
        read_only=True, allow_null=True, help_text="the job's summary.json (null until succeeded)"
    )

    class Meta(ReportRunSerializer.Meta):
        fields = [*ReportRunSerializer.Meta.fields, "summary", "output_path"]
        read_only_fields = fields


class ReportRequestSerializer(StrictSerializer):
    period_from = serializers.DateTimeField(
        required=False, allow_null=True, help_text="start (UTC if no offset); default: the lake's"
    )
    period_to = serializers.DateTimeField(
        required=False, allow_null=True, help_text="end, exclusive; default: the lake's"
    )


def headline(summary: Any) -> dict[str, Any] | None:
    """The few numbers a list of runs shows, from a summary of ``pipeline report``."""
    if not isinstance(summary, dict):
        return None
    peaks = summary.get("peaks") or {}
    return {
        "period": summary.get("period"),
        "brokers": summary.get("brokers"),
        "samples": summary.get("samples"),
        "totals": {k: v for k, v in (summary.get("totals") or {}).items() if k != "per_broker"},
        "cluster_isr_peak": (peaks.get("cluster_isr") or {}).get("value"),
        "cluster_xsr_peak": (peaks.get("cluster_xsr") or {}).get("value"),
        "incidents": len(summary.get("incidents") or []),
    }


class ReportRunFilter(filters.FilterSet):
    class Meta:
        model = ReportRun
        fields = ["state", "trigger"]


REPORT_ID = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH, description="run id")


@extend_schema_view(
    list=extend_schema(
        summary="List report runs",
        description="Traffic report runs, newest first, with their state and headline "
        "numbers (brokers, samples, totals, peak ISR/XSR, incidents) once succeeded.",
    ),
    retrieve=extend_schema(
        summary="One report run",
        description="A run with the job's whole summary and the URLs of its downloads; a "
        "failed run's `error` says why (an empty period, say).",
        parameters=[REPORT_ID],
    ),
)
class ReportRunViewSet(ReadOnlyViewSet):
    """Runs (list, retrieve, create); the two file downloads are routed in ``urls``
    without a trailing slash, as file names."""

    queryset = ReportRun.objects.select_related("requested_by")
    filterset_class = ReportRunFilter
    lookup_value_regex = r"\d+"

    def get_serializer_class(self) -> type:
        return ReportRunSerializer if self.action == "list" else ReportRunDetailSerializer

    @extend_schema(
        summary="Run the traffic report now",
        description="Starts a run over the period (operators only; both ends optional: "
        "the whole history). It reads the archived lake and the samples not archived yet, "
        "so it works from a fresh install's first minutes. A period the report cannot cover "
        "is a 400 saying why, and no run is recorded: a start not before the end, a bound "
        "before 2000 or in the future, more than `REPORT_MAX_PERIOD_DAYS` (366) days, or no "
        "broker sample in the period. Answers 202 with the run; poll it for the outcome.",
        request=ReportRequestSerializer,
        responses={202: ReportRunDetailSerializer},
    )
    def create(self, request: Request) -> Response:
        body = ReportRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        reports.check_period(
            body.validated_data.get("period_from"), body.validated_data.get("period_to")
        )
        run = reports.request_run(
            request.user,
            body.validated_data.get("period_from"),
            body.validated_data.get("period_to"),
        )
        data = ReportRunDetailSerializer(run, context={"request": request}).data
        return Response(data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        operation_id="reports_summary_file",
        summary="Download a run's summary.json",
        description="The summary as the job wrote it (a succeeded run only; else 404).",
        parameters=[REPORT_ID],
        responses={(200, "application/json"): OpenApiTypes.OBJECT},
        filters=False,
    )
    def summary_file(self, request: Request, pk: str | None = None) -> HttpResponse:
        run = self.get_object()
        path = reports.summary_path(run)
        if path is None:
            raise NotFound(f"report {run.pk} has no summary ({run.get_state_display()})")
        response = HttpResponse(path.read_bytes(), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="report-{run.pk}-summary.json"'
        return response

    @extend_schema(
        operation_id="reports_table_file",
        summary="Download one output table as Parquet",
        description="One of the run's output tables (as listed in `downloads.tables`) as a "
        "single zstd Parquet file; 404 for a name the run does not have.",
        parameters=[
            REPORT_ID,
            OpenApiParameter(
                "name",
                OpenApiTypes.STR,
                OpenApiParameter.PATH,
                description="table name as listed in downloads.tables, e.g. isr_xsr_minute",
            ),
        ],
        responses={(200, PARQUET): OpenApiTypes.BINARY},
        filters=False,
    )
    def table_file(self, request: Request, pk: str | None = None, name: str = "") -> HttpResponse:
        run = self.get_object()
        data = reports.table_parquet(run, name)
        if data is None:
            listed = ", ".join(reports.table_names(run)) or "none"
            raise NotFound(f"report {run.pk} has no table {name!r} (tables: {listed})")
        response = HttpResponse(data, content_type=PARQUET)
        response["Content-Disposition"] = f'attachment; filename="report-{run.pk}-{name}.parquet"'
        return response


def file_routes() -> list[Any]:
    """``reports/<id>/summary.json`` and ``reports/<id>/tables/<name>.parquet``."""
    from django.urls import path, re_path

    plain = {"pagination_class": None, "filter_backends": []}
    return [
        path(
            "reports/<int:pk>/summary.json",
            ReportRunViewSet.as_view({"get": "summary_file"}, **plain),
            name="report-summary-file",
        ),
        re_path(
            r"^reports/(?P<pk>\d+)/tables/(?P<name>[^/]+)\.parquet$",
            ReportRunViewSet.as_view({"get": "table_file"}, **plain),
            name="report-table-file",
        ),
    ]
