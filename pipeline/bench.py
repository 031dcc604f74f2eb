"""Benchmark the traffic report: wall time, rows per second, memory, CPU and partitions.

``python -m pipeline.bench --lake L --out O [--master local[2]] [report options...]`` runs
``python -m pipeline report`` as a child and samples the resident memory and CPU time of
the child and all its descendants (the Python driver and the JVM, which in local mode also
hosts the executors) every 0.2 s with psutil.  The machine's CPU time over the run, less
the job's, is what other processes took meanwhile: on a shared machine that says how far
the figures are from an idle one.  The child writes a Spark event log, from which come the
Spark version and the partition counts (tasks per stage, input splits per lake table).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def tree_cpu(root: psutil.Process, seen: dict[int, float]) -> None:
    """Record the CPU seconds (user + system) of each process of the tree by pid."""
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        seen[proc.pid] = times.user + times.system


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent outside idle and iowait since boot."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def spark_stats(event_log: Path, table_rows: dict[str, int]) -> dict[str, Any]:
    """Spark version, settings and partition counts from an event log.

    A stage that read exactly a lake table's row count from Parquet scanned that table:
    its task count is the table's input splits.
    """
    version, props = None, {}
    tasks: dict[int, int] = {}
    names: dict[int, str] = {}
    read: dict[int, int] = {}
    run_ms = 0
    with event_log.open() as lines:
        for line in lines:
            event = json.loads(line)
            kind = event["Event"]
            if kind == "SparkListenerLogStart":
                version = event["Spark Version"]
            elif kind == "SparkListenerEnvironmentUpdate":
                props = event["Spark Properties"]
            elif kind == "SparkListenerStageCompleted":
                info = event["Stage Info"]
                tasks[info["Stage ID"]] = info["Number of Tasks"]
                names[info["Stage ID"]] = info["Stage Name"]
            elif kind == "SparkListenerTaskEnd" and event.get("Task Metrics"):
                metrics = event["Task Metrics"]
                run_ms += metrics["Executor Run Time"]
                stage = event["Stage ID"]
                read[stage] = read.get(stage, 0) + metrics["Input Metrics"]["Records Read"]
    splits: dict[str, list[int]] = {}
    for stage, rows in read.items():
        for table, count in table_rows.items():
            if rows == count:
                splits.setdefault(table, []).append(tasks[stage])
    counts = list(tasks.values())
    return {
        "spark_version": version,
        "master": props.get("spark.master"),
        "shuffle_partitions": props.get("spark.sql.shuffle.partitions", "200 (default)"),
        "adaptive": props.get("spark.sql.adaptive.enabled", "true (default)"),
        "stages": len(counts),
        "tasks": sum(counts),
        "tasks_per_stage": {
            "min": min(counts, default=0),
            "median": statistics.median(counts) if counts else 0,
            "max": max(counts, default=0),
        },
        "input_splits": {table: sorted(set(n)) for table, n in sorted(splits.items())},
        "task_seconds": round(run_ms / 1000, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench", description=__doc__)
    parser.add_argument("--lake", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--event-log", default=None, help="keep the Spark event log here")
    args, rest = parser.parse_known_args(argv)
    cmd = [sys.executable, "-m", "pipeline", "report", "--lake", args.lake, "--out", args.out]
    cmd += ["--master", args.master, *rest]
    log_dir = Path(args.event_log or tempfile.mkdtemp(prefix="rookery-bench-events-")).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    events = f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={log_dir.as_uri()}"
    env["PYSPARK_SUBMIT_ARGS"] = f"{events} {env.get('PYSPARK_SUBMIT_ARGS', 'pyspark-shell')}"
    load_before = os.getloadavg()
    busy_before = machine_busy_seconds()
    began = time.monotonic()
    child = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    watched = psutil.Process(child.pid)
    peak, peak_parts = 0, {}
    cpu: dict[int, float] = {}
    while child.poll() is None:
        try:
            total, parts = tree_rss(watched)
            tree_cpu(watched, cpu)
        except psutil.Error:
            break
        if total > peak:
            peak, peak_parts = total, parts
        time.sleep(0.2)
    stderr = child.communicate()[1]
    seconds = time.monotonic() - began
    machine_busy = machine_busy_seconds() - busy_before
    load_after = os.getloadavg()
    if child.returncode != 0:
        print(stderr[-4000:], file=sys.stderr)
        return child.returncode
    summary = json.loads((Path(args.out) / "summary.json").read_text())
    rows = sum(summary["samples"].values())
    logs = sorted(p for p in log_dir.iterdir() if not p.name.endswith(".inprogress"))
    spark = spark_stats(logs[-1], summary["samples"]) if logs else {}
    if args.event_log is None:
        shutil.rmtree(log_dir, ignore_errors=True)
    job_cpu = sum(cpu.values())
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
        "job_cpu_seconds": round(job_cpu, 1),
        "job_cores_busy": round(job_cpu / seconds, 2),
        "others_cpu_seconds": round(max(0.0, machine_busy - job_cpu), 1),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "spark": spark,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
