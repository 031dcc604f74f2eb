"""``brokerd ctl``'s answers as text: the status, queue, connection, member and
bridge tables an operator reads (``--json`` prints the answer as it came)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from brokerd.server.resources import format_bytes


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


def link_rows(status: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The per-peer link rows, one per server: a peer that restarted keeps one row,
    under its new spid (its old spids, ``replaces`` of its peer row, have none)."""
    retired = {
        str(spid) for peer in status.get("peers") or [] for spid in peer.get("replaces") or []
    }
    lanes = status.get("lanes") or {}
    return [(spid, lane) for spid, lane in sorted(lanes.items()) if spid not in retired]


def print_status(status: dict[str, Any]) -> None:
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
    for spid, lane in link_rows(status):
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


def print_queues(result: dict[str, Any]) -> None:
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


def print_connections(rows: list[dict[str, Any]], links: bool, host: bool = False) -> None:
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


def print_result(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """A command's answer, as text unless ``--json`` (JSON where there is no table)."""
    if args.command == "status" and not args.json:
        print_status(result)
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
        print_queues(result)
    elif args.command == "connections" and not args.json:
        print_connections(result.get("connections", []), args.links)
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
