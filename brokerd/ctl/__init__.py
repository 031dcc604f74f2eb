"""``brokerd ctl``: talk to a running broker over its control socket."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from brokerd.ctl.host import host_state, run_host
from brokerd.ctl.text import print_result
from brokerd.server.control import request, socket_path


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
        return run_host(args, extra, timeout)
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
    print_result(args, result)
    return 0
