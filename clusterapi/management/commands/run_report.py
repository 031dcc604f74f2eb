"""``manage.py run_report``: a report run in the foreground (no Celery needed)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from clusterapi import reports
from clusterapi.errors import InvalidRequest
from clusterapi.models import ReportRun


def utc_time(value: str) -> dt.datetime:
    """ISO 8601; a time without an offset is UTC."""
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise CommandError(f"{value!r} is not an ISO time (e.g. 2026-01-05T00:00:00Z)") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


class Command(BaseCommand):
    help = (
        "Archive what is old enough, then run the traffic report job and record it as a "
        "report run (shown on the reports page and in the API)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="start", help="period start, ISO (UTC)")
        parser.add_argument("--to", dest="end", help="period end, exclusive, ISO (UTC)")
        parser.add_argument(
            "--yesterday", action="store_true", help="the previous UTC day (as the nightly run)"
        )
        parser.add_argument(
            "--no-archive",
            action="store_true",
            help="no archive pass first (the samples not archived yet are read all the same)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        start = utc_time(options["start"]) if options["start"] else None
        end = utc_time(options["end"]) if options["end"] else None
        if options["yesterday"]:
            start, end = reports.previous_day()
        try:
            run = reports.request_run(None, start, end, enqueue=False)
        except InvalidRequest as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"report {run.pk}: running (output under {reports.reports_dir()})")
        if options["no_archive"]:
            state = reports.execute(run.pk)
        else:
            state = reports.archive_then_execute(run.pk)
        run.refresh_from_db()
        if state != ReportRun.STATE_SUCCEEDED:
            raise CommandError(f"report {run.pk} {state}: {run.error}")
        self.stdout.write(f"report {run.pk} succeeded: {run.output_path}")
