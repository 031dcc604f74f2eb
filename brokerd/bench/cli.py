"""``python -m brokerd.bench``: command line, result tables and JSON output."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from typing import Any

from brokerd.bench.client import ServerClosed
from brokerd.bench.frames import AMQPURL, FrameError
from brokerd.bench.scenarios import SCENARIOS, BenchError, Options, options_dict, run_scenario

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"

DESCRIPTION = """\
Throughput benchmark for any AMQP 0-9-1 server (brokerd or RabbitMQ).

The client is built not to be the bottleneck: the publisher process writes a
pre-encoded (pamqp) buffer of --batch basic.publish+header+body frame
sequences with one sendall, and the consumer process reads with 2 MiB recv
buffers and only counts basic.deliver frames (class 60, method 60): it walks
the 7-byte frame headers of the first delivery, then checks and counts whole
runs of identically laid-out deliveries at once with strided slices (exact;
anything else is walked frame by frame). Publisher and consumers are separate
processes (spawned); the main process keeps a control connection for
declares, depth polling and cleanup. It never imports the broker, so it
measures any AMQP 0-9-1 server the same way.
"""

SCENARIO_HELP = "\n".join(
    f"  {s.name:<17} {s.description} [{s.metric}]" for s in SCENARIOS.values()
)

EPILOG = f"""\
scenarios (default: all, in this order):
{SCENARIO_HELP}

pacing (identical for every broker):
  By default the publisher uses publisher confirms and keeps at most
  --confirm-window unconfirmed messages in flight (it always sends whole
  batches, so the window is rounded down to a multiple of --batch); the
  publish rate is the confirmed rate. On top of that, in the consumer
  scenarios it stops while published - delivered(slowest queue) >
  --max-backlog, so queues cannot grow without bound when consumers are the
  bottleneck. Writes are blocking, so TCP backpressure applies as well.
  --pacing tcp turns confirms off (publish rate = what was written to the
  socket; only TCP backpressure and the backlog cap hold the publisher back).

measurement:
  Each run: declare, start consumers, start the publisher, --warmup seconds,
  then --duration seconds sampled once a second; then everything is stopped
  and the queues/exchange are deleted. queue-* and fanout-consumers report
  deliveries counted by the consumers (ttl-dlx: of the dead-letter queue, fed
  only by messages expiring in the TTL queue). fanout-isr reports what the broker
  routed: the coordinator polls every queue's depth (passive queue.declare
  message_count) at the start and end of the window (and once a second in
  between, purging the queues when one holds more than --max-depth messages,
  the purge-ok counts being added back; the time a purge takes is left out
  of the window); the confirm-based figure (confirmed/s x Q) is reported
  alongside as a cross-check. Queues and the fanout exchange are non-durable
  and named rookery-bench-<pid>-...; messages are transient and carry no
  properties; consumers are basic.consume no_ack=true; heartbeats are off.

output:
  A Markdown table on stdout (with --compare: both brokers and the ratio
  brokerd/RabbitMQ), progress and per-second rates on stderr. --json writes
  every run: value (the scenario's metric), publish_rate, deliver_rate or
  routed_rate (+ routed_rate_from_confirms), per_queue_rate, per_second,
  window_s, nacked, connection_blocked, backlog_throttle_waits, backlog_end,
  purges, purge_pause_s, depth_poll_max_s, the server's product/version and
  the options.
  Exit status 1 if any run failed (the others still run).

examples:
  python -m brokerd.bench --url amqp://guest:guest@127.0.0.1:5681/ --scenario queue-250
  python -m brokerd.bench --compare --brokerd-url amqp://guest:guest@127.0.0.1:5681/ \\
      --rabbitmq-url amqp://guest:guest@127.0.0.1:5672/ --duration 8 --json bench.json
"""


def _positive_float(value: str) -> float:
    f = float(value)
    if f <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not > 0")
    return f


def _nonneg_float(value: str) -> float:
    f = float(value)
    if f < 0:
        raise argparse.ArgumentTypeError(f"{value} is not >= 0")
    return f


def _positive_int(value: str) -> int:
    i = int(value)
    if i <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not > 0")
    return i


def _url(value: str) -> str:
    try:
        AMQPURL(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m brokerd.bench",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = p.add_argument_group("target")
    target.add_argument(
        "--url",
        type=_url,
        default=None,
        help=f"broker to measure (default {DEFAULT_URL}); ignored with --compare",
    )
    target.add_argument(
        "--compare",
        action="store_true",
        help="run every selected scenario against --brokerd-url and --rabbitmq-url "
        "(alternating, same settings) and print a Markdown table with the ratio",
    )
    target.add_argument(
        "--brokerd-url",
        type=_url,
        default="amqp://guest:guest@127.0.0.1:5680/",
        help="brokerd for --compare (default amqp://guest:guest@127.0.0.1:5680/)",
    )
    target.add_argument(
        "--rabbitmq-url",
        type=_url,
        default=DEFAULT_URL,
        help=f"RabbitMQ for --compare (default {DEFAULT_URL})",
    )
    what = p.add_argument_group("what to run")
    what.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        default=None,
        help="scenario to run; repeat for several (default: all)",
    )
    what.add_argument(
        "--duration",
        type=_positive_float,
        default=8.0,
        help="measurement window per run in seconds (default 8)",
    )
    what.add_argument(
        "--warmup",
        type=_nonneg_float,
        default=2.0,
        help="seconds of traffic before the window opens (default 2)",
    )
    what.add_argument(
        "--queues",
        type=_positive_int,
        default=16,
        help="Q, the number of queues bound to the fanout exchange (default 16)",
    )
    what.add_argument(
        "--repeat",
        type=_positive_int,
        default=1,
        help="runs per scenario and broker; the median is reported (default 1)",
    )
    what.add_argument(
        "--persistent",
        action="store_true",
        help="durable queues and persistent messages (delivery mode 2): the disk path, "
        "confirms waiting for the journal (RabbitMQ: durable classic queues)",
    )
    what.add_argument(
        "--body-size",
        type=_positive_int,
        default=None,
        help="override every scenario's body size in bytes (default: 250 or 1000 per scenario)",
    )
    pacing = p.add_argument_group("publisher pacing")
    pacing.add_argument(
        "--pacing",
        choices=["confirm", "tcp"],
        default="confirm",
        help="confirm: publisher confirms with a bounded window (default); "
        "tcp: no confirms, TCP backpressure only",
    )
    pacing.add_argument(
        "--batch",
        type=_positive_int,
        default=200,
        help="messages per pre-encoded buffer written with one sendall (default 200)",
    )
    pacing.add_argument(
        "--confirm-window",
        type=_positive_int,
        default=8000,
        help="most unconfirmed messages in flight with --pacing confirm (default 8000)",
    )
    pacing.add_argument(
        "--max-backlog",
        type=int,
        default=100_000,
        help="consumer scenarios: most published-but-undelivered messages per queue; "
        "0 = no cap (default 100000)",
    )
    pacing.add_argument(
        "--max-depth",
        type=_positive_int,
        default=250_000,
        help="fanout-isr: purge the queues once one is deeper than this (default 250000)",
    )
    layout = p.add_argument_group("consumer layout")
    layout.add_argument(
        "--fanout-layout",
        choices=["connections", "channels"],
        default="connections",
        help="fanout-consumers: one connection per consumer (default) or one connection "
        "with a channel per consumer",
    )
    layout.add_argument(
        "--consumer-procs",
        type=_positive_int,
        default=1,
        help="processes the consumer connections are spread over (default 1)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="OUT.json", default=None, help="write all results here")
    out.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def options_from(args: argparse.Namespace) -> Options:
    return Options(
        duration=args.duration,
        warmup=args.warmup,
        queues=args.queues,
        batch=args.batch,
        confirm_window=max(args.confirm_window, args.batch) if args.pacing == "confirm" else 0,
        max_backlog=max(args.max_backlog, 0),
        max_depth=args.max_depth,
        fanout_layout=args.fanout_layout,
        consumer_procs=args.consumer_procs,
        body_size=args.body_size,
        persistent=args.persistent,
    )


# -- formatting --------------------------------------------------------------------------------


def fmt_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def fmt_ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return "-"
    return f"{a / b:.2f}"


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(label: str, scenario: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    return {
        "broker": label,
        "scenario": scenario,
        "value": _median(ok, "value"),
        "publish_rate": _median(ok, "publish_rate"),
        "per_queue_rate": _median(
            [{"v": r["per_queue_rate"]["mean"]} for r in ok if "per_queue_rate" in r], "v"
        ),
        "server": next((r["server"] for r in ok if "server" in r), None),
        "runs": runs,
    }


def _row_metric(scenario: str, queues: int) -> str:
    s = SCENARIOS[scenario]
    if s.persistent and not s.consumers:
        return "messages stored/s (persistent, confirmed)"
    if s.fanout and s.consumers:
        return f"deliveries/s (total, Q={queues})"
    if s.fanout:
        return f"routed into queues/s (Q={queues})"
    if s.dead_letter_ttl is not None:
        return "dead-lettered deliveries/s"
    return "deliveries/s"


def compare_table(
    summaries: list[dict[str, Any]], labels: list[str], queues: int, confirm: bool = True
) -> str:
    by = {(s["broker"], s["scenario"]): s for s in summaries}
    scenarios = list(dict.fromkeys(s["scenario"] for s in summaries))
    lines = [
        f"| scenario | metric | {labels[0]} msg/s | {labels[1]} msg/s | {labels[0]}/{labels[1]} |",
        "|---|---|---:|---:|---:|",
    ]
    for name in scenarios:
        a, b = by.get((labels[0], name), {}), by.get((labels[1], name), {})
        rows = [(_row_metric(name, queues), "value")]
        if SCENARIOS[name].fanout and SCENARIOS[name].consumers:
            rows.append(("deliveries/s per queue (mean)", "per_queue_rate"))
        rows.append(("publish/s (confirmed)" if confirm else "publish/s (written)", "publish_rate"))
        for metric, key in rows:
            va, vb = a.get(key), b.get(key)
            lines.append(
                f"| {name} | {metric} | {fmt_rate(va)} | {fmt_rate(vb)} | {fmt_ratio(va, vb)} |"
            )
    return "\n".join(lines)


def single_table(summaries: list[dict[str, Any]], queues: int) -> str:
    lines = ["| scenario | metric | msg/s | publish/s |", "|---|---|---:|---:|"]
    for s in summaries:
        lines.append(
            f"| {s['scenario']} | {_row_metric(s['scenario'], queues)} | "
            f"{fmt_rate(s['value'])} | {fmt_rate(s['publish_rate'])} |"
        )
        if s.get("per_queue_rate") is not None:
            lines.append(
                f"| {s['scenario']} | deliveries/s per queue (mean) | "
                f"{fmt_rate(s['per_queue_rate'])} | |"
            )
    return "\n".join(lines)


def footnote(summaries: list[dict[str, Any]], targets: list[tuple[str, str]], args: Any) -> str:
    servers = {}
    for s in summaries:
        if s.get("server") and s["broker"] not in servers:
            servers[s["broker"]] = s["server"]
    who = "; ".join(
        f"{label}: {servers.get(label, {}).get('product') or '?'} "
        f"{servers.get(label, {}).get('version') or ''} at {AMQPURL(url).redacted}"
        for label, url in targets
    )
    pacing = (
        f"confirms, window {args.confirm_window}"
        if args.pacing == "confirm"
        else "TCP backpressure only"
    )
    return (
        f"\n{who}. Window {args.duration:g} s after {args.warmup:g} s warm-up, "
        f"median of {args.repeat} run(s); publisher: batches of {args.batch}, {pacing}, "
        f"backlog cap {args.max_backlog}; Q={args.queues}, fanout consumers on "
        f"{args.fanout_layout}."
    )


def _progress(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _one(label: str, url: str, scenario: str, opts: Options, quiet: bool) -> dict[str, Any]:
    _progress(quiet, f"bench: {scenario} against {label} ({AMQPURL(url).redacted}) ...")
    try:
        result = run_scenario(url, scenario, opts)
    except (BenchError, ServerClosed, FrameError, OSError) as exc:
        _progress(quiet, f"bench:   {scenario} against {label} failed: {exc}")
        return {"scenario": scenario, "url": AMQPURL(url).redacted, "error": str(exc)}
    extra = ""
    if result.get("routed_rate_from_confirms") is not None:
        extra = f" (confirms x Q: {fmt_rate(result['routed_rate_from_confirms'])})"
    _progress(
        quiet,
        f"bench:   {fmt_rate(result['value'])} {result['metric']}{extra}, "
        f"publish {fmt_rate(result['publish_rate'])}/s, "
        f"per second {[round(v) for v in result['per_second']]}",
    )
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    opts = options_from(args)
    scenarios = args.scenario or list(SCENARIOS)
    scenarios = list(dict.fromkeys(scenarios))
    if args.compare:
        targets = [("brokerd", args.brokerd_url), ("RabbitMQ", args.rabbitmq_url)]
    else:
        targets = [("broker", args.url or DEFAULT_URL)]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    started = time.time()
    try:
        for scenario in scenarios:
            for _ in range(args.repeat):
                # alternate brokers run by run, so that machine noise hits both alike
                for label, url in targets:
                    runs.setdefault((label, scenario), []).append(
                        _one(label, url, scenario, opts, args.quiet)
                    )
    except KeyboardInterrupt:
        print("bench: interrupted (queues were cleaned up)", file=sys.stderr)
        return 130
    summaries = [
        summarise(label, scenario, runs[(label, scenario)])
        for scenario in scenarios
        for label, _url in targets
    ]
    if args.compare:
        labels = [t[0] for t in targets]
        print(compare_table(summaries, labels, opts.queues, opts.confirm_window > 0))
    else:
        print(single_table(summaries, opts.queues))
    print(footnote(summaries, targets, args))
    if args.json:
        doc = {
            "tool": "python -m brokerd.bench",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "host": {"node": platform.node(), "python": platform.python_version()},
            "mode": "compare" if args.compare else "single",
            "targets": {label: AMQPURL(url).redacted for label, url in targets},
            "scenarios": scenarios,
            "repeat": args.repeat,
            "pacing": args.pacing,
            "options": options_dict(opts),
            "results": summaries,
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
    failed = any("error" in r for rs in runs.values() for r in rs)
    return 1 if failed else 0
