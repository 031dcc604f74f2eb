"""``python -m brokerd.bench.flood``: arguments, the runs against each target, output.

Owns the process-level concerns: signals turned into an exit, the temporary
directory, and stopping every target however a run ends.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from brokerd.bench import flood
from brokerd.bench.client import ServerClosed
from brokerd.bench.flood.plan import FloodOptions
from brokerd.bench.flood.report import render_markdown, summary_line
from brokerd.bench.flood.run import run_flood
from brokerd.bench.flood.targets import (
    Target,
    start_cluster,
    start_rabbitmq,
    start_single,
    start_workers,
)
from brokerd.bench.flood.workers import error_text
from brokerd.bench.frames import FrameError


def _exit_on_signal(signum: int, _frame: Any) -> None:
    """SIGTERM/SIGHUP end the run through its finally blocks (brokers stopped)."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m brokerd.bench.flood",
        # the package docstring without its list of modules (that is for the code's readers)
        description=(flood.__doc__ or "").partition("\nModules (")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--queues", type=int, default=6, help="shared queues (default 6)")
    p.add_argument(
        "--publishers", type=int, default=None, help="publishers (default one per queue)"
    )
    p.add_argument("--messages", type=int, default=60_000, help="per publisher (default 60,000)")
    p.add_argument("--body-size", type=int, default=250, help="bytes per body (default 250)")
    p.add_argument("--batch", type=int, default=200, help="publishes per socket write")
    p.add_argument(
        "--confirm-window",
        type=int,
        default=0,
        help="publisher confirms with at most W unconfirmed (default 0: no confirms)",
    )
    p.add_argument(
        "--quiet", type=float, default=5.0, help="end once nothing arrived this long (5 s)"
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="bound on each run's flood and drain (300 s)"
    )
    p.add_argument(
        "--after",
        type=float,
        default=10.0,
        help="brokerd cluster: keep watching (logs, status) this long after the run (10 s)",
    )
    p.add_argument("--status-poll", type=float, default=1.0, help="status poll period, 0 = off")
    p.add_argument(
        "--durable-queues",
        action="store_true",
        help="durable queues, transient messages: replicated in a brokerd cluster (transient "
        "queues are classic, each on the server it was declared on)",
    )
    p.add_argument("--context", type=int, default=3, help="log lines shown before a signature")
    p.add_argument("--cluster", action="store_true", help="the brokerd cluster (the default)")
    p.add_argument("--single", action="store_true", help="one standalone brokerd (reference)")
    p.add_argument("--rabbitmq", action="store_true", help="a 3-node RabbitMQ cluster")
    p.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help="one brokerd --workers N host, every client on its one port",
    )
    p.add_argument("--repeat", type=int, default=1, help="rounds, targets alternating (1)")
    p.add_argument("--json", metavar="OUT.json", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory and logs")
    args = p.parse_args(argv)
    if min(args.queues, args.messages, args.body_size, args.batch, args.repeat) < 1:
        p.error("--queues, --messages, --body-size, --batch and --repeat must be at least 1")
    if args.publishers is not None and args.publishers < 1:
        p.error("--publishers must be at least 1")
    opts = FloodOptions(
        queues=args.queues,
        publishers=args.publishers or args.queues,
        messages=args.messages,
        body_size=args.body_size,
        batch=args.batch,
        confirm_window=args.confirm_window,
        quiet=args.quiet,
        timeout=args.timeout,
        after=args.after,
        status_poll=args.status_poll,
        context=args.context,
        durable_queues=args.durable_queues,
    )
    kinds = [
        k
        for k, wanted in (
            ("cluster", args.cluster or not (args.single or args.rabbitmq or args.workers)),
            ("single", args.single),
            ("workers", args.workers > 0),
            ("rabbitmq", args.rabbitmq),
        )
        if wanted
    ]
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    base = Path(tempfile.mkdtemp(prefix="rookery-bench-flood-"))
    runs: list[dict[str, Any]] = []
    try:
        for round_no in range(1, args.repeat + 1):
            for kind in kinds:
                run = _one_run(kind, base / f"r{round_no}-{kind}", opts, args.workers)
                if run is None:
                    continue
                runs.append(run)
                print(summary_line(run), file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("flood: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"flood: logs kept in {base}", file=sys.stderr)
        else:
            shutil.rmtree(base, ignore_errors=True)
    print(render_markdown(runs, opts))
    if args.json:
        doc = {
            "tool": "python -m brokerd.bench.flood",
            "host": {
                "node": platform.node(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load": os.getloadavg(),
            },
            "options": asdict(opts),
            "runs": runs,
        }
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 0 if runs and all("error" not in r for r in runs) else 1


def _one_run(kind: str, base: Path, opts: FloodOptions, workers: int = 0) -> dict[str, Any] | None:
    """Start a fresh target, flood it, stop it; None when the target is unavailable."""
    starters: dict[str, Callable[[Path], Target | None]] = {
        "cluster": start_cluster,
        "single": start_single,
        "workers": lambda path: start_workers(path, workers),
        "rabbitmq": start_rabbitmq,
    }
    print(f"flood: starting {kind} in {base}", file=sys.stderr, flush=True)
    target = starters[kind](base)
    if target is None:
        return None
    try:
        print(f"flood: {target.label}: flooding ...", file=sys.stderr, flush=True)
        return run_flood(target, opts)
    except (OSError, ServerClosed, FrameError, RuntimeError) as exc:
        return {"target": kind, "label": target.label, "error": error_text(exc)}
    finally:
        target.stop()
