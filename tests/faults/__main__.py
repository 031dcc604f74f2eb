"""The soak by hand: ``python -m tests.faults --faults 100 --seed 7 --json soak.json``.

Flood mode adds unconfirmed publishers (``--flood 2 --flood-rate 2000``); the
report then says how many of their messages were lost and at which faults.

Prints one line per fault and the checker's report; exits 1 if a
must-be-zero count is not 0, the drain did not finish, a server exited by
itself or something was not cleaned up (2 on a harness error).
``--check FILE`` re-checks a saved history without running anything.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.faults.checker import check
from tests.faults.history import History
from tests.faults.nemesis import (
    DURABLE_KINDS,
    KILL_ALL,
    KILL_ALL_WIPE,
    KINDS,
    MEMBERSHIP_KINDS,
)
from tests.faults.network import NETWORK_KINDS
from tests.faults.run import RunConfig, run


def main(argv: list[str] | None = None) -> int:
    defaults = RunConfig()
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--faults", type=int, default=defaults.faults)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--kinds",
        help=f"comma-separated fault kinds (default all: {','.join(KINDS)}; with "
        f"--durable, {KILL_ALL} and {KILL_ALL_WIPE} too; without --netbed, "
        f"{','.join(MEMBERSHIP_KINDS)} too)",
    )
    parser.add_argument("--publishers", type=int, default=defaults.publishers)
    parser.add_argument("--consumers", type=int, default=defaults.consumers)
    parser.add_argument("--queues", type=int, default=defaults.queues)
    parser.add_argument(
        "--rate", type=float, default=defaults.rate, help="messages/s per publisher"
    )
    parser.add_argument(
        "--consume-rate",
        type=float,
        help=f"messages/s per consumer before the drain (0: unlimited; default "
        f"{defaults.consume_rate:g}, unlimited with --flood)",
    )
    parser.add_argument(
        "--flood",
        type=int,
        default=defaults.flood_publishers,
        metavar="N",
        help="unconfirmed publishers alongside the confirmed ones (default 0: off)",
    )
    parser.add_argument(
        "--flood-rate",
        type=float,
        default=defaults.flood_rate,
        help=f"messages/s per flood publisher, at most (default {defaults.flood_rate:g})",
    )
    parser.add_argument(
        "--flood-size",
        type=int,
        default=defaults.flood_size,
        help=f"flood message body bytes (default {defaults.flood_size})",
    )
    parser.add_argument("--prefetch", type=int, default=defaults.prefetch)
    parser.add_argument(
        "--durable",
        action="store_true",
        help="persistent messages (the queues are durable, hence replicated, either way)",
    )
    parser.add_argument(
        "--queue-type",
        choices=["classic", "quorum"],
        default="",
        help="classic queues, each owned by a primary (implies --durable: a dead owner's "
        "queue waits for its return and must then hold every confirmed message); or "
        "quorum queues (implies --durable)",
    )
    parser.add_argument(
        "--group-size",
        type=int,
        default=0,
        help="quorum queues' x-quorum-initial-group-size (default: none sent, 3)",
    )
    parser.add_argument(
        "--netbed",
        action="store_true",
        help="each server in its own network namespace (root only): the network faults "
        f"({','.join(NETWORK_KINDS)}) are drawn too",
    )
    parser.add_argument(
        "--stall-dumps",
        type=int,
        default=0,
        metavar="N",
        help="write every server's state dump to stall-K.txt in the run's directory when "
        "a confirm waits past --stall-after seconds, at most N times (default 0: off)",
    )
    parser.add_argument("--stall-after", type=float, default=RunConfig.stall_after)
    parser.add_argument("--dir", type=Path, help="where the servers keep data and logs (kept)")
    parser.add_argument("--json", type=Path, help="write the history and the report here")
    parser.add_argument("--check", type=Path, help="only check a history saved with --json")
    args = parser.parse_args(argv)

    if args.check:
        saved = json.loads(args.check.read_text())
        report = check(History.from_dict(saved["history"]))
        print(report.format())
        return 0 if report.ok() else 1

    consume_rate = args.consume_rate
    if consume_rate is None:  # a flood outgrows limited consumers: its backlog never drains
        consume_rate = 0.0 if args.flood else defaults.consume_rate
    if args.group_size and args.queue_type != "quorum":
        parser.error("--group-size needs --queue-type quorum")
    durable = args.durable or bool(args.queue_type)
    kinds = tuple(k for k in (args.kinds or "").split(",") if k) or (
        (DURABLE_KINDS if durable else KINDS) + (NETWORK_KINDS if args.netbed else MEMBERSHIP_KINDS)
    )
    if set(kinds) & set(NETWORK_KINDS) and not args.netbed:
        parser.error("network faults need --netbed")
    if set(kinds) & set(MEMBERSHIP_KINDS) and args.netbed:
        parser.error(f"{','.join(MEMBERSHIP_KINDS)} runs on loopback only (no --netbed)")
    for needs_disk in (KILL_ALL, KILL_ALL_WIPE):
        if needs_disk in kinds and not durable:
            parser.error(f"{needs_disk} needs --durable: transient messages do not survive it")
    config = RunConfig(
        seed=args.seed,
        faults=args.faults,
        kinds=kinds,
        publishers=args.publishers,
        consumers=args.consumers,
        queues=args.queues,
        rate=args.rate,
        prefetch=args.prefetch,
        consume_rate=consume_rate or None,
        durable=durable,
        queue_type=args.queue_type,
        group_size=args.group_size,
        flood_publishers=args.flood,
        flood_rate=args.flood_rate,
        flood_size=args.flood_size,
        netbed=args.netbed,
        stall_dumps=args.stall_dumps,
        stall_after=args.stall_after,
    )
    # a plain ``kill`` ends the run as Ctrl-C does: the run's own teardown stops the
    # servers and removes the test bed (left alone, SIGTERM kills only this process)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    base = args.dir or Path(tempfile.mkdtemp(prefix="rookery-faults-"))
    started = time.monotonic()
    flood = (
        f", flood {config.flood_publishers} x {config.flood_rate:g}/s"
        if config.flood_publishers
        else ""
    )
    print(f"seed {config.seed}, {config.faults} faults{flood}, servers in {base}", flush=True)
    try:
        outcome = run(config, base, log=lambda line: print(line, flush=True))
    except Exception as exc:
        print(f"harness error: {exc!r}", file=sys.stderr)
        return 2
    print(outcome.report.format())
    print(f"took {time.monotonic() - started:.0f}s; logs in {base}")
    if dumps := outcome.history.meta.get("stall_dumps"):
        print(f"stall dumps: {', '.join(dumps)}")
    if outcome.crashes:
        print(f"SERVERS EXITED BY THEMSELVES: {outcome.crashes}")
    if outcome.leftover or outcome.stuck_clients:
        print(f"NOT CLEANED UP: brokerd pids {outcome.leftover}, clients {outcome.stuck_clients}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"report": outcome.report.to_dict(), "history": outcome.history.to_dict()},
                indent=None,
            )
        )
        print(f"history and report in {args.json}")
    if outcome.misnumbered:
        print(f"CLIENTS NAMING SERVERS BY ANOTHER INDEX: {outcome.misnumbered}")
    ok = outcome.report.ok() and not (
        outcome.crashes or outcome.leftover or outcome.stuck_clients or outcome.misnumbered
    )
    if not ok:
        print(outcome.describe)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
