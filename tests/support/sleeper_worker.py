"""A stand-in worker for the supervisor's tests (tests/integration/test_host_supervisor.py):
a process that does nothing but say what happens to it, so the tests watch the
supervising parent alone, without a broker's start-up time.

``--pid-file``: its pid, written once its signal handlers are in place (a test that
has read it may signal at once). ``--signal-log``: one line "SIGHUP PID" per signal
received. SIGTERM ends it with status 0; ``--ignore-sigterm`` logs it and goes on
(a worker that will not stop); ``--crash`` exits with status 3 at once (a crash
loop).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from types import FrameType

CRASH_STATUS = 3
LOGGED = (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pid-file", type=Path, required=True)
    parser.add_argument("--signal-log", type=Path, required=True)
    parser.add_argument("--crash", action="store_true", help="exit with status 3 at once")
    parser.add_argument("--ignore-sigterm", action="store_true", help="log SIGTERM, keep running")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.crash:
        return CRASH_STATUS
    pid = os.getpid()

    def note(signo: int, frame: FrameType | None) -> None:
        """One line per signal: a single small append, so lines never interleave."""
        with args.signal_log.open("a") as out:
            out.write(f"{signal.Signals(signo).name} {pid}\n")

    def stop(signo: int, frame: FrameType | None) -> None:
        note(signo, frame)
        if not args.ignore_sigterm:
            raise SystemExit(0)

    for signo in LOGGED:
        signal.signal(signo, note)
    signal.signal(signal.SIGTERM, stop)
    # whole or absent: the test never reads half a pid
    partial = args.pid_file.with_name(f".{args.pid_file.name}.{pid}")
    partial.write_text(f"{pid}\n")
    os.replace(partial, args.pid_file)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
