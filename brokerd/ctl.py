"""``brokerd ctl``: talk to a running broker over its control socket."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
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
        choices=["rebalance", "grow", "shrink"],
        help="rebalance: move replicated queues' owners until no primary owns more "
        "than its share (like rabbitmq-queues rebalance); grow HOST:PORT: add that "
        "primary to every quorum group without it (it counts once it holds the queue); "
        "shrink HOST:PORT: take it out of every group that names it (rabbitmq-queues "
        "grow|shrink)",
    )
    queues.add_argument("address", nargs="?", metavar="HOST:PORT", help="with grow|shrink")
    connections = sub.add_parser(
        "connections",
        help="the client connections: peer, user, vhost, channels, messages, flow (and the "
        "worker each is on, for a host of workers)",
    )
    connections.add_argument("--json", action="store_true", help="print JSON")
    connections.add_argument(
        "--links", action="store_true", help="list the cluster's own links as well"
    )
    queue = sub.add_parser("queue", help="act on one shared queue")
    queue_sub = queue.add_subparsers(dest="action", required=True)
    move = queue_sub.add_parser(
        "move",
        help="hand a replicated or quorum queue to another primary (waits for the hand-over)",
    )
    move.add_argument("name", help="the queue's name (in the cluster vhost)")
    move.add_argument(
        "to",
        help="the new owner: a primary's spid or its host:port (on a host of workers, "
        "worker-K names a worker)",
    )
    bridges = sub.add_parser(
        "bridges",
        help="shovels to and from other brokers, defined as RabbitMQ's dynamic shovels",
    )
    bridges_sub = bridges.add_subparsers(dest="action", required=True)
    bridges_sub.add_parser("list", help="the definitions (passwords redacted)")
    bridge_status = bridges_sub.add_parser(
        "status", help="each bridge's state, reason, counts and server"
    )
    bridge_status.add_argument("--json", action="store_true", help="print JSON")
    bridge_set = bridges_sub.add_parser(
        "set",
        help="create or replace a bridge: the JSON that `rabbitmqctl set_parameter shovel "
        "NAME JSON` takes (standalone servers; a cluster's come from its configuration)",
    )
    bridge_set.add_argument("name")
    bridge_set.add_argument("definition", help="the definition as JSON")
    for verb, text in (("delete", "stop and forget a bridge"), ("restart", "reconnect a bridge")):
        one = bridges_sub.add_parser(verb, help=text)
        one.add_argument("name")
    for one in (bridge_set, *(bridges_sub.choices[v] for v in ("delete", "restart"))):
        one.add_argument("--vhost", default="/", help="the bridge's vhost (default /)")
    federation = sub.add_parser(
        "federation",
        help="federation upstreams, upstream sets and policies, as RabbitMQ defines them",
    )
    federation_sub = federation.add_subparsers(dest="action", required=True)
    federation_sub.add_parser("list", help="the definitions (passwords redacted)")
    federation_status = federation_sub.add_parser(
        "status", help="each link's state, reason and counts"
    )
    federation_status.add_argument("--json", action="store_true", help="print JSON")
    federation_sub.add_parser("restart", help="reconnect every link")
    kinds = ("federation-upstream", "federation-upstream-set", "policy")
    federation_set = federation_sub.add_parser(
        "set",
        help="create or replace a definition: the JSON `rabbitmqctl set_parameter "
        "federation-upstream NAME JSON` takes, an upstream set's list, or a policy's "
        '{"pattern", "definition", "apply-to", "priority"}',
    )
    federation_delete = federation_sub.add_parser("delete", help="forget a definition")
    for one in (federation_set, federation_delete):
        one.add_argument("kind", choices=kinds)
        one.add_argument("name")
    federation_set.add_argument("definition", help="the definition as JSON")
    for one in (federation_set, federation_delete):
        one.add_argument("--vhost", default="/", help="the definition's vhost (default /)")
    cluster = sub.add_parser("cluster", help="the cluster's membership")
    cluster_sub = cluster.add_subparsers(dest="action", required=True)
    members = cluster_sub.add_parser(
        "members", help="each member: its address, run (spid), type and state, and the root"
    )
    members.add_argument("--json", action="store_true", help="print JSON")
    forget = cluster_sub.add_parser(
        "forget",
        help="remove a stopped primary from the members for good (its return is refused; "
        "a new disk at that address joins as a new server)",
    )
    forget.add_argument("address", metavar="HOST:PORT")
    forget.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser(
        "ready",
        help="exit 0 if the server serves clients and has caught up (a root known, its "
        "state and copies whole, a member), else 1 with the reason: a readiness probe",
    )
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


def _addresses(status: dict[str, Any]) -> dict[str, str]:
    """``host:port`` by spid: this server's and its peers' (as the status names them)."""
    known = {
        str(p["spid"]): str(p["address"])
        for p in status.get("peers") or []
        if p.get("spid") and p.get("address")
    }
    if status.get("spid") and status.get("address"):
        known[str(status["spid"])] = str(status["address"])
    return known


def _named(spid: Any, addresses: dict[str, str]) -> str:
    """A server as operators name it: its spid and, when known, where it listens."""
    return _with_address(spid, addresses.get(str(spid))) or "-"


def _candidacy(status: dict[str, Any]) -> str:
    """``root_enabled`` in words: whether this server may be elected root."""
    if status.get("type") == "standalone":
        return "- (not clustered)"
    if status.get("type") == "secondary":
        return "never root (a secondary)"
    if status.get("root_enabled"):
        return "root candidacy enabled"
    return "root candidacy disabled: never elected root ('brokerd ctl root enable' allows it)"


def _link_rows(status: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The per-peer link rows, one per server: a peer that restarted keeps one row,
    under its new spid (its old spids, ``replaces`` of its peer row, have none)."""
    retired = {
        str(spid) for peer in status.get("peers") or [] for spid in peer.get("replaces") or []
    }
    lanes = status.get("lanes") or {}
    return [(spid, lane) for spid, lane in sorted(lanes.items()) if spid not in retired]


def _print_status(status: dict[str, Any]) -> None:
    addresses = _addresses(status)
    print(f"spid       {_named(status.get('spid'), addresses)}")
    print(f"type       {status.get('type')}")
    if status.get("is_root"):
        mine = " (this server)"
    elif status.get("suspended"):
        mine = " (this server, suspended: waiting for its followers' echoes)"
    else:
        mine = ""
    print(f"root       {_named(status.get('root'), addresses)}{mine}")
    print(f"ready      {status.get('ready')}")
    if status.get("detached"):
        print(
            f"detached   cannot reach root {_named(status['detached'], addresses)}: "
            "clients sent elsewhere"
        )
    print(f"candidacy  {_candidacy(status)}")
    version = status.get("members_version", 0)
    print(f"checksum   {status.get('checksum') or '-'} (members version {version})")
    for peer in status.get("peers", []):
        state = "active" if peer.get("active") else "inactive"
        replaces = peer.get("replaces") or []
        restarted = f" (restarted; was {', '.join(replaces)})" if replaces else ""
        print(
            f"peer       {_named(peer.get('spid'), addresses)} {peer.get('type')} "
            f"{state}{restarted}"
        )
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
    for spid, lane in _link_rows(status):
        lag_text = "" if lane.get("replica_lag") is None else f", replica lag {lane['replica_lag']}"
        print(
            f"link       {_named(spid, addresses)} {lane.get('state')}: "
            f"{lane.get('backlog', 0)} bytes queued, "
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
        f"{'vhost':<10} {'queue':<32} {'type':<10} {'role':<6} {'owner':<42} ready consumers "
        "replicas"
    )
    for q in result.get("queues", []):
        # a worker of a cluster of hosts by its name (worker-K@HOST:PORT), else the address
        where = q.get("owner_worker") or q.get("owner_address")
        owner = _with_address(q.get("owner"), where) or "- (away)"
        if q.get("owner") and q.get("owner") == me:
            owner += " (here)"
        if q.get("moving"):
            owner += f" -> {_with_address(q['moving'], q.get('moving_address'))}"
        ready = "-" if q.get("messages") is None else str(q["messages"])
        print(
            f"{q['vhost']:<10} {q['name']:<32} {q['type']:<10} {q['role']:<6} {owner:<42} "
            f"{ready:>5} {q['consumers']:>9} {_replica_text(q.get('replicas'))}"
            + (f" group {', '.join(q['group'])}" if q.get("group") else "")
        )


def _print_connections(rows: list[dict[str, Any]], links: bool, host: bool = False) -> None:
    """A table of connections (clients only unless ``links``); ``host``: with the
    worker each is on."""
    shown = [r for r in rows if links or not r.get("link")]
    head = f"{'worker':<9} " if host else ""
    print(
        f"{head}{'peer':<22} {'user':<12} {'vhost':<10} {'state':<8} {'client':<16} "
        f"{'channels':>8} {'in':>10} {'out':>10} flow"
    )
    for r in shown:
        lead = f"{r.get('worker', '-'):<9} " if host else ""
        kind = " (cluster link)" if r.get("link") else ""
        print(
            f"{lead}{r['peer']:<22} {r.get('user') or '-'!s:<12} "
            f"{r.get('vhost') or '-'!s:<10} {r['state']:<8} "
            f"{str(r.get('client') or '-')[:16]:<16} {r['channels']:>8} "
            f"{r['messages_in']:>10} {r['messages_out']:>10} "
            f"{','.join(r.get('flow') or []) or '-'}{kind}"
        )
    hidden = len(rows) - len(shown)
    print(f"{len(shown)} connections" + (f" ({hidden} cluster links not shown)" if hidden else ""))


def _with_address(spid: Any, address: Any) -> str:
    """``spid (host:port)``, or the spid alone where the broker does not know where it
    listens (a standalone broker's own queues); "" for no server."""
    if not spid:
        return ""
    return f"{spid} ({address})" if address else str(spid)


def _replica_text(replicas: list[dict[str, Any]] | None) -> str:
    """``2/3 in sync (syncing: spid)``; ``-`` where this server does not know (a proxy, a
    local queue) and for a queue with no copy elsewhere."""
    if not replicas:
        return "-"
    syncing = [r["spid"] for r in replicas if not r.get("in_sync")]
    text = f"{len(replicas) - len(syncing)}/{len(replicas)} in sync"
    return text + (f" (syncing: {', '.join(syncing)})" if syncing else "")


def main(argv: list[str]) -> int:
    """Run one ctl command. A reader that goes away early (``brokerd ctl status | head``)
    ends it quietly, as it ends other Unix tools: no traceback, exit status 141 (as a
    shell reports a tool killed by SIGPIPE)."""
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # inside the try: the last block may be what finds the pipe shut
    except BrokenPipeError:
        # Python would flush stdout again at exit and complain: point it at /dev/null
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


#: the exit status of a ``brokerd ctl`` whose output nobody reads any more (128 + SIGPIPE)
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def _run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    extra: list[str] = []
    timeout = 10.0
    if args.command == "queues" and args.action in ("grow", "shrink"):
        if not args.address:
            print(f"brokerd ctl: queues {args.action} needs HOST:PORT", file=sys.stderr)
            return 2
        extra, timeout = [args.action, args.address], 40.0
    elif args.command == "root" or (args.command == "queues" and args.action):
        extra = [args.action]
    elif args.command == "queue":
        extra = [args.action, args.name, args.to]
        timeout = 60.0
    elif args.command == "fault":
        extra = [args.fault] + ([args.spid] if args.fault == "cut-link" else [])
    elif args.command == "bridges":
        extra = [args.action]
        if args.action == "set":
            extra += [args.name, args.definition, args.vhost]
        elif args.action in ("delete", "restart"):
            extra += [args.name, args.vhost]
    elif args.command == "cluster":
        extra = [args.action] + ([args.address] if args.action == "forget" else [])
        timeout = 40.0 if args.action == "forget" else timeout
    elif args.command == "federation":
        extra = [args.action]
        if args.action == "set":
            extra += [args.kind, args.name, args.definition, args.vhost]
        elif args.action == "delete":
            extra += [args.kind, args.name, args.vhost]
    if not socket_path(args.data_dir).exists() and host_state(args.data_dir) is not None:
        return _run_host(args, extra, timeout)
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
    if args.command == "ready":
        ready = bool(result.get("ready"))
        print(result.get("reason", ""), file=sys.stdout if ready else sys.stderr)
        return 0 if ready else 1
    _print_result(args, result)
    return 0


def _print_result(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """A command's answer, as text unless ``--json`` (JSON where there is no table)."""
    if args.command == "status" and not args.json:
        _print_status(result)
    elif args.command == "queues" and args.action == "rebalance" and not args.json:
        moves = result.get("moves", [])
        for m in moves:
            print(f"moving {m['queue']}: {m['from']} -> {m['to']}")
        print(f"{len(moves)} moves asked for" if moves else "balanced already: nothing to move")
    elif args.command == "queues" and args.action in ("grow", "shrink") and not args.json:
        rows = result.get("queues", [])
        for row in rows:
            if row["changed"]:
                print(f"{row['queue']}: group {', '.join(row['group'])}")
            else:
                print(f"{row['queue']}: unchanged: {row['reason']}")
        if not rows:
            print(f"no quorum group to {args.action} with {result.get('address')}")
    elif args.command == "queues" and not args.json:
        _print_queues(result)
    elif args.command == "connections" and not args.json:
        _print_connections(result.get("connections", []), args.links)
    elif args.command == "queue":
        print(f"{result['queue']} moved: {result['from']} -> {result['to']} in {result['ms']} ms")
    elif args.command == "dump":
        print(result.get("dump", ""))
    elif args.command == "bridges" and args.action == "status" and not args.json:
        _print_bridges(result.get("bridges", []))
    elif args.command == "cluster" and args.action == "forget" and not args.json:
        state = "held by a majority" if result.get("committed") else "NOT yet held by a majority"
        print(
            f"forgot {result['forgotten']}: members version {result['version']} ({state}): "
            f"{', '.join(result['members'])}"
        )
    elif args.command == "cluster" and not args.json:
        _print_members(result)
    elif args.command == "federation" and args.action == "status" and not args.json:
        _print_bridges(result.get("links", []), "no federation links")
    else:
        print(json.dumps(result, indent=2))


def _print_members(result: dict[str, Any]) -> None:
    held = "" if result.get("committed", True) else " (a change not yet held by a majority)"
    print(
        f"members version {result.get('version')}{held}, checksum {result.get('checksum')}, "
        f"root {result.get('root') or '-'}"
    )
    if result.get("joining"):
        print("this server is joining: not admitted yet")
    for row in result.get("members", []):
        root = " (root)" if row.get("root") else ""
        print(
            f"{row['address']:<24} {row['type']:<9} {row['state']:<11} {row.get('spid') or '-'}"
            f"{root}"
        )
    for gone in result.get("forgotten", []):
        print(f"{gone['address']:<24} forgotten (node {gone['node'] or 'unknown'})")


def _print_bridges(rows: list[dict[str, Any]], none: str = "no bridges") -> None:
    if not rows:
        print(none)
    for row in rows:
        reason = f" ({row['reason']})" if row.get("reason") else ""
        print(
            f"{row['vhost']} {row['name']}: {row['state']}{reason}; {row['src_uri']} -> "
            f"{row['dest_uri']}; forwarded {row['forwarded']}, acknowledged "
            f"{row['acknowledged']}, in flight {row['in_flight']}; on {row['node']}"
        )


# -- a host of workers (brokerd --workers N) ---------------------------------------------


def host_state(data_dir: Path) -> dict[str, Any] | None:
    """The supervising parent's state file, when ``data_dir`` is a host's."""
    try:
        state = json.loads((data_dir / "host" / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def _ask_worker(data_dir: Path, index: int, command: str, extra: list[str], timeout: float) -> Any:
    """One worker's answer, or the reason there is none (a string)."""
    where = data_dir / f"worker-{index}"
    try:
        reply = request(where, command, extra, timeout=timeout)
    except OSError as exc:
        return f"not answering ({exc.strerror or exc})"
    return reply.get("result", {}) if reply.get("ok") else f"refused: {reply.get('error')}"


def _run_host(args: argparse.Namespace, extra: list[str], timeout: float) -> int:
    """``brokerd ctl`` against a host: ``status`` and ``dump`` answer for every worker;
    other commands are the workers' local cluster's, so any running worker takes them
    (``queues`` lists every queue with the worker that owns it)."""
    state = host_state(args.data_dir) or {}
    workers = [w for w in state.get("workers", []) if isinstance(w, dict)]
    if args.command == "connections":
        return _host_connections(args, workers, timeout)
    if args.command == "queue" and (named := WORKER_NAME.fullmatch(extra[2])):
        status = _ask_worker(args.data_dir, int(named[1]), "status", [], timeout)
        if isinstance(status, str) or not status.get("spid"):
            print(f"brokerd ctl: {extra[2]} is {status}", file=sys.stderr)
            return 1
        extra = [*extra[:2], str(status["spid"])]
    if args.command in ("status", "dump"):
        answers = [
            _ask_worker(args.data_dir, int(w["index"]), args.command, extra, timeout)
            for w in workers
        ]
        if args.command == "status" and args.json:
            print(json.dumps({"host": state, "workers": answers}, indent=2))
            return 0
        print(f"host       pid {state.get('pid')}, {len(workers)} workers, {args.data_dir}")
        for worker, answer in zip(workers, answers, strict=True):
            alarm = " CRASH-LOOPING" if worker.get("crash_looping") else ""
            last = f", last exit: {worker['last_exit']}" if worker.get("last_exit") else ""
            print(
                f"\n== worker-{worker['index']}: pid {worker.get('pid')}, {worker.get('state')}, "
                f"{worker.get('restarts', 0)} restarts{last}{alarm}"
            )
            if isinstance(answer, str):
                print(answer)
            elif args.command == "dump":
                print(answer.get("dump", ""))
            else:
                _print_status(answer)
        return 0
    if args.command in ("bridges", "federation") and extra == ["status"]:
        return _host_bridge_status(args, workers, timeout)
    for worker in workers:
        if worker.get("state") != "running":
            continue
        answer = _ask_worker(args.data_dir, int(worker["index"]), args.command, extra, timeout)
        if isinstance(answer, str) and answer.startswith("not answering"):
            continue
        if isinstance(answer, str):
            print(f"brokerd ctl: {answer.removeprefix('refused: ')}", file=sys.stderr)
            return 1
        if args.command == "queues" and not args.action:
            _name_workers(answer.get("queues", []))
        _print_result(args, answer)
        return 0
    print(f"brokerd ctl: no worker of the host in {args.data_dir} answers", file=sys.stderr)
    return 2


def _host_bridge_status(
    args: argparse.Namespace, workers: list[dict[str, Any]], timeout: float
) -> int:
    """A host's bridges or federation links: each worker runs its own (those placed on
    it, or the root's links), so every running worker is asked and the rows joined."""
    key = "bridges" if args.command == "bridges" else "links"
    rows: list[dict[str, Any]] = []
    silent = []
    for worker in workers:
        if worker.get("state") != "running":
            continue
        answer = _ask_worker(args.data_dir, int(worker["index"]), args.command, ["status"], timeout)
        if isinstance(answer, str):
            silent.append(f"worker-{worker['index']}: {answer}")
            continue
        rows += [{**row, "worker": f"worker-{worker['index']}"} for row in answer.get(key, [])]
    for line in silent:
        print(f"brokerd ctl: {line}", file=sys.stderr)
    _print_result(args, {key: rows})
    return 0


#: how ``brokerd ctl`` names a worker of a host (``queue move Q worker-1``)
WORKER_NAME = re.compile(r"worker-(\d+)")


def _name_workers(queues: list[dict[str, Any]]) -> None:
    """A host's queues name their owner by worker (``worker-1``), not by its link socket."""
    for q in queues:
        for key in ("owner_address", "moving_address"):
            address = q.get(key)
            if isinstance(address, str) and address.startswith("unix:"):
                q[key] = Path(address[len("unix:") :]).stem


def _host_connections(
    args: argparse.Namespace, workers: list[dict[str, Any]], timeout: float
) -> int:
    """Every running worker's connections, each with its worker."""
    rows: list[dict[str, Any]] = []
    silent: list[str] = []
    for worker in workers:
        name = f"worker-{worker['index']}"
        answer = _ask_worker(args.data_dir, int(worker["index"]), "connections", [], timeout)
        if isinstance(answer, str):
            silent.append(f"{name}: {answer}")
            continue
        rows += [{**row, "worker": name} for row in answer.get("connections", [])]
    if args.json:
        print(json.dumps({"connections": rows, "not_answering": silent}, indent=2))
    else:
        _print_connections(rows, args.links, host=True)
        for line in silent:
            print(line)
    return 0
