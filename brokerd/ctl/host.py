"""``brokerd ctl`` against a host of workers (``brokerd --workers N``): ``status`` and
``dump`` answer for every worker, ``connections`` and the bridges' status join
theirs, and any other command is the workers' local cluster's, so any running
worker takes it."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from brokerd.ctl.text import print_connections, print_result, print_status
from brokerd.server.control import request


def host_state(data_dir: Path) -> dict[str, Any] | None:
    """The supervising parent's state file, when ``data_dir`` is a host's."""
    try:
        state = json.loads((data_dir / "host" / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def ask_worker(data_dir: Path, index: int, command: str, extra: list[str], timeout: float) -> Any:
    """One worker's answer, or the reason there is none (a string)."""
    where = data_dir / f"worker-{index}"
    try:
        reply = request(where, command, extra, timeout=timeout)
    except OSError as exc:
        return f"not answering ({exc.strerror or exc})"
    return reply.get("result", {}) if reply.get("ok") else f"refused: {reply.get('error')}"


def run_host(args: argparse.Namespace, extra: list[str], timeout: float) -> int:
    """``brokerd ctl`` against a host: ``status`` and ``dump`` answer for every worker;
    other commands are the workers' local cluster's, so any running worker takes them
    (``queues`` lists every queue with the worker that owns it)."""
    state = host_state(args.data_dir) or {}
    workers = [w for w in state.get("workers", []) if isinstance(w, dict)]
    if args.command == "connections":
        return host_connections(args, workers, timeout)
    if args.command == "queue" and (named := WORKER_NAME.fullmatch(extra[2])):
        status = ask_worker(args.data_dir, int(named[1]), "status", [], timeout)
        if isinstance(status, str) or not status.get("spid"):
            print(f"brokerd ctl: {extra[2]} is {status}", file=sys.stderr)
            return 1
        extra = [*extra[:2], str(status["spid"])]
    if args.command in ("status", "dump"):
        answers = [
            ask_worker(args.data_dir, int(w["index"]), args.command, extra, timeout)
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
                print_status(answer)
        return 0
    if args.command in ("bridges", "federation") and extra == ["status"]:
        return host_bridge_status(args, workers, timeout)
    for worker in workers:
        if worker.get("state") != "running":
            continue
        answer = ask_worker(args.data_dir, int(worker["index"]), args.command, extra, timeout)
        if isinstance(answer, str) and answer.startswith("not answering"):
            continue
        if isinstance(answer, str):
            print(f"brokerd ctl: {answer.removeprefix('refused: ')}", file=sys.stderr)
            return 1
        if args.command == "queues" and not args.action:
            name_workers(answer.get("queues", []))
        print_result(args, answer)
        return 0
    print(f"brokerd ctl: no worker of the host in {args.data_dir} answers", file=sys.stderr)
    return 2


def host_bridge_status(
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
        answer = ask_worker(args.data_dir, int(worker["index"]), args.command, ["status"], timeout)
        if isinstance(answer, str):
            silent.append(f"worker-{worker['index']}: {answer}")
            continue
        rows += [{**row, "worker": f"worker-{worker['index']}"} for row in answer.get(key, [])]
    for line in silent:
        print(f"brokerd ctl: {line}", file=sys.stderr)
    print_result(args, {key: rows})
    return 0


#: how ``brokerd ctl`` names a worker of a host (``queue move Q worker-1``)
WORKER_NAME = re.compile(r"worker-(\d+)")


def name_workers(queues: list[dict[str, Any]]) -> None:
    """A host's queues name their owner by worker (``worker-1``), not by its link socket."""
    for q in queues:
        for key in ("owner_address", "moving_address"):
            address = q.get(key)
            if isinstance(address, str) and address.startswith("unix:"):
                q[key] = Path(address[len("unix:") :]).stem


def host_connections(
    args: argparse.Namespace, workers: list[dict[str, Any]], timeout: float
) -> int:
    """Every running worker's connections, each with its worker."""
    rows: list[dict[str, Any]] = []
    silent: list[str] = []
    for worker in workers:
        name = f"worker-{worker['index']}"
        answer = ask_worker(args.data_dir, int(worker["index"]), "connections", [], timeout)
        if isinstance(answer, str):
            silent.append(f"{name}: {answer}")
            continue
        rows += [{**row, "worker": name} for row in answer.get("connections", [])]
    if args.json:
        print(json.dumps({"connections": rows, "not_answering": silent}, indent=2))
    else:
        print_connections(rows, args.links, host=True)
        for line in silent:
            print(line)
    return 0
