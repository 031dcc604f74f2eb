"""Command line: ``python -m pipeline generate ...`` and ``python -m pipeline report ...``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from pipeline.generate import GenerateError, generate, parse_time
from pipeline.options import RECONNECT_ALLOWANCE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="write a synthetic heartbeat history into a lake")
    gen.add_argument("--lake", required=True, help="lake root directory")
    gen.add_argument("--brokers", type=int, required=True, help="brokers B (at least 3)")
    gen.add_argument("--queues", type=int, required=True, help="queues Q per broker")
    gen.add_argument("--hours", type=float, required=True, help="length of the history")
    gen.add_argument("--seed", type=int, required=True, help="random seed (same seed, same lake)")
    gen.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    gen.add_argument("--start", default=None, help="ISO start time, UTC (default 2026-01-05)")
    gen.add_argument("--overwrite", action="store_true", help="replace an existing lake")

    rep = sub.add_parser("report", help="the traffic report (Spark job)")
    add_report_arguments(rep)
    return parser


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """Shared by ``python -m pipeline report`` and ``spark-submit pipeline/report.py``."""
    parser.add_argument("--lake", required=True, help="lake root (any path Spark can read)")
    parser.add_argument("--out", required=True, help="output directory (Parquet + summary.json)")
    parser.add_argument("--from", dest="start", default=None, help="ISO start time (UTC)")
    parser.add_argument("--to", dest="end", default=None, help="ISO end time, exclusive (UTC)")
    parser.add_argument(
        "--master", default=None, help="Spark master (default $SPARK_MASTER or local[*])"
    )
    parser.add_argument(
        "--interval", type=float, default=None, help="heartbeat interval (default: inferred)"
    )
    parser.add_argument(
        "--gap-intervals", type=int, default=3, help="missed samples that make a heartbeat gap"
    )
    parser.add_argument(
        "--reconnect-allowance",
        type=float,
        default=RECONNECT_ALLOWANCE,
        metavar="SECONDS",
        help="after a console gap (no broker recorded at all), a broker back within this "
        "many seconds of the others was waiting to reconnect, not down (default: %(default)s)",
    )
    parser.add_argument(
        "--message-bytes", type=int, default=1000, help="message size for the XSR estimate"
    )
    parser.add_argument(
        "--link-gbps", type=float, default=1.0, help="client bandwidth per broker (XSR estimate)"
    )
    parser.add_argument("--driver-memory", default=None, help="spark.driver.memory, e.g. 2g")


def report_options(args: argparse.Namespace):  # -> ReportOptions (Spark imported lazily)
    from pipeline.report import ReportOptions

    return ReportOptions(
        lake=args.lake,
        out=args.out,
        start=parse_time(args.start) if args.start else None,
        end=parse_time(args.end) if args.end else None,
        master=args.master,
        interval=args.interval,
        gap_intervals=args.gap_intervals,
        reconnect_allowance=args.reconnect_allowance,
        message_bytes=args.message_bytes,
        link_gbps=args.link_gbps,
        driver_memory=args.driver_memory,
    )


def run_report_command(args: argparse.Namespace, prog: str) -> int:
    """Run the report for parsed arguments: its key figures on stdout, or an error (status 2)."""
    from pipeline.report import ReportError, run_report

    try:
        summary = run_report(report_options(args))
    except (ReportError, GenerateError) as exc:  # GenerateError: a bad --from/--to
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("period", "samples", "incidents")}, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            began = time.monotonic()
            doc = generate(
                args.lake,
                brokers=args.brokers,
                queues=args.queues,
                hours=args.hours,
                seed=args.seed,
                interval=args.interval,
                start=parse_time(args.start) if args.start else None,
                overwrite=args.overwrite,
            )
            doc["seconds"] = round(time.monotonic() - began, 2)
            print(json.dumps(doc, indent=2))
            return 0
        return run_report_command(args, "pipeline report")
    except GenerateError as exc:
        print(f"pipeline {args.command}: {exc}", file=sys.stderr)
        return 2
