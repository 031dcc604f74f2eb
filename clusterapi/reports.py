"""Traffic report runs: request, run the Spark job as a subprocess, keep its summary.

A :class:`ReportRun` is requested by an operator (API, dashboard) or by beat's
nightly task; the Celery task archives what is old enough, puts together the
run's own lake (the archive's files for the period, linked, plus the samples
not archived yet: ``archive.report_lake``), and, unless the period has no
sample at all (the run then fails at once, saying so, without starting Spark),
runs ``python -m pipeline report --lake REPORTS_DIR/<id>/lake --out
REPORTS_DIR/<id> [--from] [--to] --master SPARK_MASTER`` in its own process
group. A subprocess keeps
Spark's JVM and its memory out of the Celery worker, and the timeout
(``REPORT_TIMEOUT_SECONDS``) can stop the whole tree. The job writes Parquet
tables and ``summary.json`` under the run's directory; the summary is loaded
into the run, the tables are served from disk (``table``, ``chart_series``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clusterapi import archive, audit
from clusterapi.errors import InvalidRequest
from clusterapi.models import ReportRun
from clusterapi.scheduling import queue_task

log = logging.getLogger(__name__)

#: names of the job's output tables (directories under the run's output)
TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
#: lines of the job's log kept in a failed run's error
ERROR_LINES = 20
#: a run still "running" this long after its timeout lost its worker
ABANDON_GRACE = dt.timedelta(minutes=5)
#: no sample can be older than this (brokerd did not exist): earlier bounds are typos
EARLIEST = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
#: the longest period one run may cover unless ``REPORT_MAX_PERIOD_DAYS`` says otherwise
MAX_PERIOD_DAYS = 366


def reports_dir() -> Path:
    return Path(settings.REPORTS_DIR)


def job_command() -> list[str]:
    """The job's command line before its arguments (a setting so tests can stand in)."""
    return list(getattr(settings, "REPORT_COMMAND", None) or [sys.executable, "-m", "pipeline"])


def iso(value: dt.datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SSZ``; ``isoformat`` pads the year (``strftime("%Y")`` gives
    ``1-01-01`` for year 0001, which the job cannot parse)."""
    return value.astimezone(dt.UTC).replace(microsecond=0, tzinfo=None).isoformat() + "Z"


# -- requests -----------------------------------------------------------------------------


def max_period() -> dt.timedelta:
    return dt.timedelta(days=getattr(settings, "REPORT_MAX_PERIOD_DAYS", MAX_PERIOD_DAYS))


def check_period(
    start: dt.datetime | None, end: dt.datetime | None, now: dt.datetime | None = None
) -> None:
    """Refuse (``InvalidRequest``, the API's 400, a form error on the dashboard) a period
    a run cannot report on, before any run is recorded: an operator learns at once
    what to change instead of polling a run that was bound to fail.

    Out of range: a bound before 2000 (year 0001 is a typo, and such dates break
    conversions further on), a start not before the end, a bound in the future, a
    period longer than ``REPORT_MAX_PERIOD_DAYS`` (default 366); then a period without
    a single broker sample, in the database or in the archived lake.
    """
    now = now or timezone.now()
    for name, bound in (("period_from", start), ("period_to", end)):
        if bound is None:
            continue
        if bound < EARLIEST:
            raise InvalidRequest(
                f"{name} {bound.date().isoformat()} is out of range: no sample is older "
                f"than {EARLIEST.date().isoformat()}"
            )
        if bound > now:
            raise InvalidRequest(
                f"{name} {iso(bound)} is in the future (now is {iso(now)}); "
                + (
                    "leave period_to empty to report up to now"
                    if name == "period_to"
                    else "choose a start in the past"
                )
            )
    if start is not None and end is not None and start >= end:
        raise InvalidRequest(
            f"the period is empty: it starts at {iso(start)}, not before its end "
            f"{iso(end)}; choose a start before the end"
        )
    longest = max_period()
    if start is not None and (end or now) - start > longest:
        raise InvalidRequest(
            f"the period is longer than {longest.days} days, the most one report covers "
            "(REPORT_MAX_PERIOD_DAYS); split it into several reports"
        )
    if not archive.has_samples(start, end):
        raise InvalidRequest(empty_period_message(ReportRun(period_from=start, period_to=end)))


def request_run(
    user: Any,
    start: dt.datetime | None = None,
    end: dt.datetime | None = None,
    trigger: str = ReportRun.TRIGGER_MANUAL,
    enqueue: bool = True,
) -> ReportRun:
    """Record a pending run and queue its Celery task once the transaction commits
    (``enqueue=False``: the caller runs it, as the nightly task does)."""
    fail_abandoned()
    empty = start is not None and end is not None and start >= end
    run = ReportRun.objects.create(
        requested_by=audit.known_user(user),
        trigger=trigger,
        period_from=start,
        period_to=end,
        # an empty period needs no job to know the answer
        state=ReportRun.STATE_FAILED if empty else ReportRun.STATE_PENDING,
        finished_at=timezone.now() if empty else None,
        error=f"the period is empty: it starts at {iso(start)}, not before its end "
        f"{iso(end)}; choose a start before the end"
        if empty
        else "",
    )
    audit.record(
        user,
        "report.request",
        f"report {run.pk}",
        {
            "trigger": trigger,
            "from": iso(start) if start else None,
            "to": iso(end) if end else None,
        },
    )
    if enqueue and not empty:
        pk = run.pk
        transaction.on_commit(lambda: queue_task("run_report", pk))
    return run


def previous_day(now: dt.datetime | None = None) -> tuple[dt.datetime, dt.datetime]:
    """[yesterday 00:00, today 00:00) in UTC."""
    today = (now or timezone.now()).astimezone(dt.UTC).date()
    end = dt.datetime(today.year, today.month, today.day, tzinfo=dt.UTC)
    return end - dt.timedelta(days=1), end


def request_nightly(now: dt.datetime | None = None) -> ReportRun | None:
    """The nightly run of the previous day, unless one exists already (beat fired twice)."""
    start, end = previous_day(now)
    existing = ReportRun.objects.filter(
        trigger=ReportRun.TRIGGER_NIGHTLY, period_from=start, period_to=end
    ).exclude(state=ReportRun.STATE_FAILED)
    if existing.exists():
        log.info("nightly report of %s exists already", start.date())
        return None
    return request_run(None, start, end, ReportRun.TRIGGER_NIGHTLY, enqueue=False)


def fail_abandoned(now: dt.datetime | None = None) -> int:
    """Fail runs whose worker went away: running past timeout + grace, or never started."""
    now = now or timezone.now()
    limit = dt.timedelta(seconds=settings.REPORT_TIMEOUT_SECONDS) + ABANDON_GRACE
    running = ReportRun.objects.filter(
        state=ReportRun.STATE_RUNNING, started_at__lt=now - limit
    ).update(
        state=ReportRun.STATE_FAILED,
        finished_at=now,
        error="abandoned: the worker running the job stopped before it finished",
    )
    pending = ReportRun.objects.filter(
        state=ReportRun.STATE_PENDING, created_at__lt=now - limit
    ).update(
        state=ReportRun.STATE_FAILED,
        finished_at=now,
        error="never started: no Celery worker took the task",
    )
    return running + pending


# -- running the job ------------------------------------------------------------------------


def archive_then_execute(run_id: int) -> str:
    """The Celery task's work: an archive pass (so the report sees recent history), the job.

    A failed archive pass does not stop the report: the lake as it is still gives one.
    """
    try:
        archive.archive_samples()
    except Exception:
        log.exception("report %s: the archive pass failed; reporting on the lake as it is", run_id)
    return execute(run_id)


def execute(run_id: int, timeout: float | None = None) -> str:
    """Run the job for a pending run; returns the run's final state.

    A run that is not pending (already taken by another worker, or finished) is
    left alone.
    """
    now = timezone.now()
    claimed = ReportRun.objects.filter(pk=run_id, state=ReportRun.STATE_PENDING).update(
        state=ReportRun.STATE_RUNNING, started_at=now
    )
    run = ReportRun.objects.get(pk=run_id)
    if not claimed:
        log.info("report %s is %s: not running it again", run_id, run.state)
        return run.state
    out = reports_dir() / str(run.pk)
    if out.exists():
        shutil.rmtree(out)  # a leftover of a deleted database: never mix two runs' files
    out.mkdir(parents=True)
    run.output_path = str(out)
    run.save(update_fields=["output_path"])

    try:
        view = archive.report_lake(out / "lake", run.period_from, run.period_to)
    except Exception as exc:
        log.exception("report %s: could not read the samples", run.pk)
        return _finish(run, now, None, f"could not read the samples for the report: {exc}")
    if not view.broker_samples:
        return _finish(run, now, None, empty_period_message(run))
    log.info(
        "report %s: lake of %d archived files and %s not archived yet",
        run.pk,
        view.linked,
        view.live or "no samples",
    )
    cmd = [*job_command(), "report", "--lake", str(view.root), "--out", str(out)]
    if run.period_from:
        cmd += ["--from", iso(run.period_from)]
    if run.period_to:
        cmd += ["--to", iso(run.period_to)]
    cmd += ["--master", settings.SPARK_MASTER]
    timeout = float(settings.REPORT_TIMEOUT_SECONDS) if timeout is None else timeout
    log.info("report %s: %s", run.pk, " ".join(cmd))
    error = ""
    summary = None
    try:
        code = run_job(cmd, out / "job.log", timeout)
        if code is None:
            error = f"the job did not finish within {timeout:g} s and was stopped"
        elif code != 0:
            error = job_error(out / "job.log", code)
        else:
            summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError) as exc:
        error = f"the job could not run or left no readable summary: {exc}"
    shutil.rmtree(view.root, ignore_errors=True)  # links and copies: the run's tables remain
    return _finish(run, now, summary, error)


def _finish(run: ReportRun, started: dt.datetime, summary: Any, error: str) -> str:
    run.finished_at = timezone.now()
    run.summary = summary
    run.error = error
    run.state = ReportRun.STATE_FAILED if error else ReportRun.STATE_SUCCEEDED
    run.save(update_fields=["finished_at", "summary", "error", "state"])
    took = (run.finished_at - started).total_seconds()
    log.info("report %s %s in %.1f s", run.pk, run.state, took)
    return run.state


def empty_period_message(run: ReportRun) -> str:
    """Why a run has nothing to report on, in words an operator can act on."""
    if run.period_from or run.period_to:
        start = iso(run.period_from) if run.period_from else "the first sample"
        end = iso(run.period_to) if run.period_to else "now"
        where = f"from {start} to {end}"
    else:
        where = "at all"
    return (
        f"no broker samples {where}: brokers report to the console every heartbeat once "
        "connected, so choose a period when brokers were running (or wait for their first "
        "statuses)"
    )


def run_job(cmd: list[str], log_path: Path, timeout: float) -> int | None:
    """Run ``cmd`` in its own process group with output to ``log_path``; its exit code,
    or None when it ran out of time (then the whole group, JVM included, is stopped)."""
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            cmd,
            cwd=settings.BASE_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            return None
        except BaseException:  # the worker is stopping: do not leave Spark behind
            stop_group(proc)
            raise


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # children that outlived the parent
        os.killpg(proc.pid, signal.SIGKILL)


def job_error(log_path: Path, code: int) -> str:
    """The job's own message (``pipeline report: ...``) or the tail of its log."""
    try:
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if line]
    except OSError:
        lines = []
    for line in reversed(lines):
        if line.startswith("pipeline report: "):
            return line.removeprefix("pipeline report: ")
    tail = "\n".join(lines[-ERROR_LINES:])
    return f"the job exited with code {code}" + (f":\n{tail}" if tail else "")


# -- outputs --------------------------------------------------------------------------------


def output_dir(run: ReportRun) -> Path | None:
    """The run's output directory, if the job wrote one (kept under ``REPORTS_DIR``)."""
    if not run.output_path:
        return None
    path = Path(run.output_path)
    return path if path.is_dir() else None


def summary_path(run: ReportRun) -> Path | None:
    out = output_dir(run)
    if out is None or run.state != ReportRun.STATE_SUCCEEDED:
        return None
    path = out / "summary.json"
    return path if path.is_file() else None


def table_names(run: ReportRun) -> list[str]:
    """The Parquet tables a finished run can serve: named in its summary, present on disk."""
    out = output_dir(run)
    if out is None or not isinstance(run.summary, dict):
        return []
    named = run.summary.get("tables") or {}
    return sorted(n for n in named if TABLE_NAME.match(n) and (out / n).is_dir())


def table(run: ReportRun, name: str) -> pa.Table | None:
    """One output table of a run (the job's Spark directory read as one table), or None.

    ``name`` must be one of :func:`table_names`: no path is ever built from input
    that the run's summary does not list.
    """
    if name not in table_names(run):
        return None
    out = output_dir(run)
    assert out is not None
    return pq.read_table(out / name)


def table_parquet(run: ReportRun, name: str) -> bytes | None:
    """One output table as a single Parquet file (zstd), for downloads."""
    data = table(run, name)
    if data is None:
        return None
    buffer = io.BytesIO()
    pq.write_table(data.replace_schema_metadata(None), buffer, compression="zstd")
    return buffer.getvalue()


# -- what the dashboard draws ------------------------------------------------------------------

MAX_CHART_BROKERS = 12


def _number(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def chart_series(run: ReportRun) -> dict[str, Any]:
    """uPlot data: cluster ISR/XSR per minute, and per-broker publish rates per minute.

    ``{"cluster": {"t": [...], "isr": [...], "xsr": [...]},
    "brokers": {"t": [...], "names": [...], "in": [[...] per broker]}}``; empty
    lists when the run has no such table.
    """
    cluster: dict[str, list[Any]] = {"t": [], "isr": [], "xsr": []}
    brokers: dict[str, Any] = {"t": [], "names": [], "in": []}
    minutes = table(run, "isr_xsr_minute")
    if minutes is not None:
        rows = sorted(
            (r for r in minutes.to_pylist() if r["scope"] == "cluster"), key=lambda r: r["minute"]
        )
        cluster["t"] = [r["minute"].timestamp() for r in rows]
        cluster["isr"] = [_number(r["isr"]) for r in rows]
        cluster["xsr"] = [_number(r["xsr"]) for r in rows]
    per_broker = table(run, "broker_minute")
    if per_broker is not None:
        rows = per_broker.select(["broker", "minute", "in_avg"]).to_pylist()
        stamps = sorted({r["minute"].timestamp() for r in rows})
        names = sorted({r["broker"] for r in rows})[:MAX_CHART_BROKERS]
        index = {t: i for i, t in enumerate(stamps)}
        series = {name: [None] * len(stamps) for name in names}
        for r in rows:
            if r["broker"] in series:
                series[r["broker"]][index[r["minute"].timestamp()]] = _number(r["in_avg"])
        brokers = {"t": stamps, "names": names, "in": [series[n] for n in names]}
    return {"cluster": cluster, "brokers": brokers}
