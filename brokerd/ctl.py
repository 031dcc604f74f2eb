"""``brokerd ctl``: talk to a running broker over its control socket."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from brokerd.server.control import request, socket_path
from brokerd.server.resources import format_bytes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="brokerd ctl",
        description="Control a running brokerd through the socket in its data directory.",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path("var/brokerd"),
        help="the broker's --data-dir (default var/brokerd)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="the server's cluster view and counts")
    status.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("dump", help="the full state dump (as SIGUSR1 logs it)")
    queues = sub.add_parser(
        "queues", help="every queue: its type, its owner, and this server's role"
    )
    queues.add_argument("--json", action="store_true", help="print JSON")
    queues.add_argument(
        "action",
        nargs="?",
        choices=["rebalance"],
        help="rebalance: move replicated queues' owners until no primary owns more "
        "than its share (like rabbitmq-queues rebalance)",
    )
    queue = sub.add_parser("queue", help="act on one shared queue")
    queue_sub = queue.add_subparsers(dest="action", required=True)
    move = queue_sub.add_parser(
        "move",
        help="hand a replicated or quorum queue to another primary (waits for the hand-over)",
    )
    move.add_argument("name", help="the queue's name (in the cluster vhost)")
    move.add_argument("to", help="the new owner: a primary's spid or its host:port")
    root = sub.add_parser("root", help="enable or disable root candidacy on this server")
    root.add_argument("action", choices=["enable", "disable"])
    fault = sub.add_parser(
        "fault", help="fault injection for tests (needs --enable-fault-injection)"
    )
    fault_sub = fault.add_subparsers(dest="fault", required=True)
    cut = fault_sub.add_parser("cut-link", help="drop the links to and from a peer")
    cut.add_argument("spid")
    fault_sub.add_parser("heal", help="restore every cut link")
    return parser


def _print_status(status: dict[str, Any]) -> None:
    print(f"spid       {status.get('spid')}")
    print(f"type       {status.get('type')}")
    if status.get("is_root"):
        mine = " (this server)"
    elif status.get("suspended"):
        mine = " (this server, suspended: waiting for its followers' echoes)"
    else:
        mine = ""
    print(f"root       {status.get('root') or '-'}{mine}")
    print(f"ready      {status.get('ready')}")
    if status.get("detached"):
        print(f"detached   cannot reach root {status['detached']}: clients sent elsewhere")
    print(f"root ok    {status.get('root_enabled')}")
    print(f"checksum   {status.get('checksum') or '-'}")
    for peer in status.get("peers", []):
        state = "active" if peer.get("active") else "inactive"
        replaces = peer.get("replaces") or []
        restarted = f" (restarted; was {', '.join(replaces)})" if replaces else ""
        print(f"peer       {peer.get('spid')} {peer.get('type')} {state}{restarted}")
    resources = status.get("resources")
    if resources:
        memory, disk = resources["memory"], resources["disk"]
        share = memory["used"] / memory["limit"] if memory["limit"] else 1.0
        print(
            f"memory     {format_bytes(memory['used'])} of the "
            f"{format_bytes(memory['limit'])} watermark ({share:.0%})"
            f"{'  ALARM' if memory['alarm'] else ''}"
        )
        free = "?" if disk["free"] is None else format_bytes(disk["free"])
        print(
            f"disk free  {free} (limit {format_bytes(disk['limit'])}) on {disk['path']}"
            f"{'  ALARM' if disk['alarm'] else ''}"
        )
    store = status.get("store")
    if store:
        print(
            f"store      {store.get('segments')} segments, {store.get('commits')} commits, "
            f"{store.get('write_failures')} write failures, {store.get('corrupt', 0)} corrupt; "
            f"compaction freed {store.get('segments_freed', 0)} segments, "
            f"copied {store.get('records_copied', 0)} records"
        )
    blocked = status.get("blocked") or {}
    print(f"blocked    {'; '.join(blocked.values()) if blocked else '-'}")
    lag = (status.get("loop") or {}).get("lag") or {}
    if lag:
        print(
            f"loop lag   p50 {lag.get('p50_ms')} ms, p99 {lag.get('p99_ms')} ms, "
            f"max {lag.get('max_ever_ms')} ms"
        )
    echo = status.get("echo_rtt") or {}
    if echo.get("count"):
        print(
            f"echo rtt   p50 {echo.get('p50_ms')} ms, p99 {echo.get('p99_ms')} ms, "
            f"max {echo.get('max_ms')} ms"
        )
    flow = (status.get("flow") or {}).get("causes") or {}
    for cause, held in flow.items():
        print(f"flow       {cause}: {held.get('paused')} connections paused ({held.get('reason')})")
    for spid, lane in sorted((status.get("lanes") or {}).items()):
        lag_text = "" if lane.get("replica_lag") is None else f", replica lag {lane['replica_lag']}"
        print(
            f"link       {spid} {lane.get('state')}: {lane.get('backlog', 0)} bytes queued, "
            f"{lane.get('unsettled', 0)} unsettled{lag_text}"
        )
    for alarm in status.get("alarms", []):
        print(f"alarm      {alarm.get('kind')}: {alarm.get('message')}")
    settings = status.get("settings") or {}
    document, sources = settings.get("document") or {}, settings.get("sources") or {}
    for key, value in (document.get("limits") or {}).items():
        print(f"limit      {key} = {value} ({sources.get(f'limits.{key}', '?')})")
    for key, value in (document.get("heartbeat") or {}).items():
        print(f"heartbeat  {key} = {value} ({sources.get('heartbeat', '?')})")
    for part in ("vhosts", "users", "permissions", "vhost_limits", "known_hosts"):
        if part in document:
            print(f"in force   {part}: {len(document[part])} ({sources.get(part, '?')})")


def _print_queues(result: dict[str, Any]) -> None:
    """A table: a shared queue's messages are counted on its owner (``master``); a
    proxy's are shown as ``-``, its consumers are the ones connected here. The replicas
    of a queue mastered here: how many are in sync, and the spids still syncing; a
    quorum queue kept by some primaries only names them (``group``, addresses)."""
    me = result.get("spid")
    print(
        f"{'vhost':<10} {'queue':<32} {'type':<10} {'role':<6} {'owner':<28} ready consumers "
        "replicas"
    )
    for q in result.get("queues", []):
        owner = q.get("owner") or "- (away)"
        if owner == me:
            owner += " (here)"
        if q.get("moving"):
            owner += f" -> {q['moving']}"
        ready = "-" if q.get("messages") is None else str(q["messages"])
        print(
            f"{q['vhost']:<10} {q['name']:<32} {q['type']:<10} {q['role']:<6} {owner:<28} "
            f"{ready:>5} {q['consumers']:>9} {_replica_text(q.get('replicas'))}"
            + (f" group {', '.join(q['group'])}" if q.get("group") else "")
        )


def _replica_text(replicas: list[dict[str, Any]] | None) -> str:
    """``2/3 in sync (syncing: spid)``; ``-`` where this server does not know (a proxy, a
    local queue) and for a queue with no copy elsewhere."""
    if not replicas:
        return "-"
    syncing = [r["spid"] for r in replicas if not r.get("in_sync")]
    text = f"{len(replicas) - len(syncing)}/{len(replicas)} in sync"
    return text + (f" (syncing: {', '.join(syncing)})" if syncing else "")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    extra: list[str] = []
    timeout = 10.0
    if args.command == "root" or (args.command == "queues" and args.action):
        extra = [args.action]
    elif args.command == "queue":
        extra = [args.action, args.name, args.to]
        timeout = 60.0
    elif args.command == "fault":
        extra = [args.fault] + ([args.spid] if args.fault == "cut-link" else [])
    if not socket_path(args.data_dir).exists():
        print(f"brokerd ctl: no broker control socket in {args.data_dir}", file=sys.stderr)
        return 2
    try:
        reply = request(args.data_dir, args.command, extra, timeout=timeout)
    except OSError as exc:
        print(f"brokerd ctl: cannot reach the broker: {exc}", file=sys.stderr)
        return 2
    if not reply.get("ok"):
        print(f"brokerd ctl: {reply.get('error')}", file=sys.stderr)
        return 1
    result = reply.get("result", {})
    if args.command == "status" and not args.json:
        _print_status(result)
    elif args.command == "queues" and args.action == "rebalance" and not args.json:
        moves = result.get("moves", [])
        for m in moves:
            print(f"moving {m['queue']}: {m['from']} -> {m['to']}")
        print(f"{len(moves)} moves asked for" if moves else "balanced already: nothing to move")
    elif args.command == "queues" and not args.json:
        _print_queues(result)
    elif args.command == "queue":
        print(f"{result['queue']} moved: {result['from']} -> {result['to']} in {result['ms']} ms")
    elif args.command == "dump":
        print(result.get("dump", ""))
    else:
        print(json.dumps(result, indent=2))
    return 0
