"""The flood's figures as Markdown tables and as a one-line summary per run (pure).

Apart from the run so the rendering can be tested on a hand-made result.
"""

from __future__ import annotations

from typing import Any

from brokerd.bench.flood.logs import SIGNATURES
from brokerd.bench.flood.plan import FloodOptions


def _n(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return f"{value:,}"


def render_markdown(runs: list[dict[str, Any]], opts: FloodOptions) -> str:
    """The figures as Markdown: totals, per queue, signatures, control plane, first lines."""
    mode = f"confirms, window {opts.confirm_window:,}" if opts.confirm_window else "no confirms"
    lines = [
        f"Flood: {opts.publishers} publishers ({mode}) x {opts.messages:,} messages of "
        f"{opts.body_size} B into {opts.queues} queues, one no-ack consumer each; "
        f"quiet {opts.quiet:g} s, timeout {opts.timeout:g} s.",
        "",
        "| target | published | confirmed | delivered | left | lost | delivered % | "
        "deliveries/s | delivery window s | go to last delivery s | delivered/s from go | "
        "publishers done s | consumer closes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        if "error" in run:
            lines.append(f"| {run['label']} | error: {run['error']} ||||||||||")
            continue
        fraction = run["delivered_fraction"]
        shown = "-" if fraction is None else f"{fraction * 100:.1f} %"
        flag = " (timed out)" if run["timed_out"] else ""
        lines.append(
            f"| {run['label']}{flag} | {_n(run['published'])} | {_n(run['confirmed'])} | "
            f"{_n(run['delivered'])} | {_n(run['left'])} | {_n(run['lost'])} | {shown} | "
            f"{_n(run['deliveries_per_s'])} | {run['delivery_window_s']:.2f} | "
            f"{_n(run['go_to_last_delivery_s'])} | {_n(run['deliveries_per_s_from_go'])} | "
            f"{_n(run['publish_taken_s'])} | {run['consumer_closes']} |"
        )
    for number, run in enumerate(runs, 1):
        if "error" in run:
            continue
        lines += ["", f"### Run {number}: {run['label']}", ""]
        lines += [
            "| queue | declared on | publishers on | consumer on | published | delivered | "
            "left | lost |",
            "|---|---|---|---|---:|---:|---:|---:|",
        ]
        for x in run["queues"]:
            lines.append(
                f"| {x['queue'].rsplit('-', 1)[-1]} | {x['home']} | {', '.join(x['publishers'])} "
                f"| {x['consumer']} | {_n(x['published'])} | {_n(x['delivered'])} | "
                f"{_n(x['left'])} | {_n(x['lost'])} |"
            )
        troubled = [w for w in run["workers"] if w["closes"] or w["status"] == "failed"]
        if troubled:
            lines += ["", "Workers closed or failed:", ""]
            for w in troubled:
                lines.append(
                    f"- {w['worker']}: {w['status']}, {w['closes']} closes; first: "
                    f"{w['first_error']}; last: {w['last_error']}"
                )
        logs = [entry for entry in run.get("logs", []) if "signatures" in entry]
        if logs:
            lines += [
                "",
                "Failure signatures (log lines from the start of the flood; `+n`: after the "
                "deliveries ended):",
                "",
                "| server | " + " | ".join(t for t, _ in SIGNATURES.values()) + " |",
                "|---|" + "---:|" * len(SIGNATURES),
            ]
            for entry in logs:
                cells = []
                for key in SIGNATURES:
                    c = entry["signatures"][key]
                    cell = f"{c['during']}" + (f" +{c['after']}" if c["after"] else "")
                    if key == "forwards_failed" and entry["forwards_unsettled"]:
                        cell += f" ({entry['forwards_unsettled']:,} unsettled)"
                    cells.append(cell)
                lines.append(f"| {entry['server']} | " + " | ".join(cells) + " |")
        if run.get("status"):
            lines += [
                "",
                "Control plane (status polls each --status-poll s):",
                "",
                "| server | polls | unanswered | poll ms p50/max | not ready | suspended | "
                "role changes | peer echo RTT ms p50/p99/max | peer status age max s |",
                "|---|---:|---:|---|---:|---:|---:|---|---:|",
            ]
            for s in run["status"]:
                rtt = "/".join(
                    _n(s[k]) for k in ("peer_rtt_ms_p50", "peer_rtt_ms_p99", "peer_rtt_ms_max")
                )
                poll = f"{_n(s['poll_ms_p50'])}/{_n(s['poll_ms_max'])}"
                lines.append(
                    f"| {s['server']} | {s['polls']} | {s['unanswered']} | {poll} | "
                    f"{s['not_ready']} | "
                    f"{s['suspended']} | {s['role_changes']} | {rtt} | "
                    f"{s['peer_status_age_max_s']} |"
                )
            lines += [
                "",
                "Measured by each server (its last status: windows of recent samples):",
                "",
                "| server | status-echo RTT ms p50/p99/max (samples) | event-loop lag ms "
                "p50/p99/max | flow control episodes |",
                "|---|---|---|---|",
            ]
            for s in run["status"]:
                echo = "/".join(_n(v) for v in s.get("echo_rtt_ms") or [])
                lag = "/".join(_n(v) for v in s.get("loop_lag_ms") or [])
                flow = ", ".join(
                    f"{k} {v}" for k, v in sorted((s.get("flow_episodes") or {}).items())
                )
                count = _n(s.get("echo_count"))
                lines.append(f"| {s['server']} | {echo} ({count}) | {lag} | {flow or '-'} |")
        firsts = _first_occurrences(logs)
        if firsts:
            lines += ["", "First occurrence of each signature (any server, with context):", ""]
            for key, server, first in firsts:
                at = first.get("after_go_s")
                when = "" if at is None else f", {at:+.1f} s after the flood started"
                lines += [f"{SIGNATURES[key][0]} ({server}{when}):", "", "```"]
                lines += first["lines"]
                lines += ["```", ""]
    return "\n".join(lines).rstrip() + "\n"


def _first_occurrences(logs: list[dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for key in SIGNATURES:
        found = [
            (entry["signatures"][key]["first"], entry["server"])
            for entry in logs
            if entry["signatures"][key]["first"] is not None
        ]
        if found:
            first, server = min(found, key=lambda f: f[0]["t"] or 0.0)
            out.append((key, server, first))
    return out


def summary_line(run: dict[str, Any]) -> str:
    if "error" in run:
        return f"flood: {run['label']}: error {run['error']}"
    fraction = run["delivered_fraction"] or 0.0
    return (
        f"flood: {run['label']}: delivered {run['delivered']:,} of {run['published']:,} "
        f"({fraction * 100:.1f} %), {_n(run['deliveries_per_s'])} deliveries/s, "
        f"left {_n(run['left'])}, lost {_n(run['lost'])}"
    )
