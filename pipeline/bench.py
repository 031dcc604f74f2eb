"""Benchmark the traffic report: wall time, rows per second, peak memory of the process tree.

``python -m pipeline.bench --lake L --out O [--master local[2]] [report options...]`` runs
``python -m pipeline report`` as a child and samples the resident memory of the child and
all its descendants (the Python driver and the JVM, which in local mode also hosts the
executors) every 0.2 s with psutil.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil


def tree_rss(root: psutil.Process) -> tuple[int, dict[str, int]]:
    """Sum of RSS over a process and its descendants, and the RSS per process name.

    A child caught between fork and exec shares its parent's pages and is skipped, or the
    JVM would count twice whenever it launches a helper process.
    """
    total, by_name = 0, {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            rss = proc.memory_info().rss
            name = proc.name()
            parent = proc.parent()
            if parent is not None and proc is not root and proc.cmdline() == parent.cmdline():
                continue  # forked, not yet exec'd: its pages are the parent's
        except psutil.Error:
            continue
        total += rss
        by_name[name] = by_name.get(name, 0) + rss
    return total, by_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench", description=__doc__)
    parser.add_argument("--lake", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--master", default="local[2]")
    args, rest = parser.parse_known_args(argv)
    cmd = [sys.executable, "-m", "pipeline", "report", "--lake", args.lake, "--out", args.out]
    cmd += ["--master", args.master, *rest]
    began = time.monotonic()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watched = psutil.Process(child.pid)
    peak, peak_parts = 0, {}
    while child.poll() is None:
        try:
            total, parts = tree_rss(watched)
        except psutil.Error:
            break
        if total > peak:
            peak, peak_parts = total, parts
        time.sleep(0.2)
    stderr = child.communicate()[1]
    seconds = time.monotonic() - began
    if child.returncode != 0:
        print(stderr[-4000:], file=sys.stderr)
        return child.returncode
    summary = json.loads((Path(args.out) / "summary.json").read_text())
    rows = sum(summary["samples"].values())
    result = {
        "command": " ".join(cmd),
        "master": args.master,
        "rows": rows,
        "samples": summary["samples"],
        "seconds": round(seconds, 1),
        "rows_per_second": round(rows / seconds),
        "peak_rss_mib": round(peak / 2**20),
        "peak_rss_by_process_mib": {k: round(v / 2**20) for k, v in peak_parts.items()},
        "cpus": psutil.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
