"""One flood run against one running target, and the figures it yields.

The coordinator's side: declares the queues, starts the worker processes,
watches them, counts what is left and scans the logs into a JSON-able dict.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from typing import Any

from brokerd.bench.client import Client, ServerClosed
from brokerd.bench.flood.logs import scan_log
from brokerd.bench.flood.plan import FloodOptions, Plan, placement
from brokerd.bench.flood.status import StatusSampler
from brokerd.bench.flood.targets import Target
from brokerd.bench.flood.workers import (
    ConsumerJob,
    FloodShared,
    PublisherJob,
    drop,
    run_flood_consumer,
    run_flood_publisher,
)
from brokerd.bench.frames import AMQPURL, FrameError
from brokerd.bench.workers import DONE, FAILED, READY


def _declare(
    urls: list[str], plan: Plan, names: list[str], deadline: float, durable: bool = False
) -> None:
    """Each queue through its home server (retrying while a cluster settles); durable
    ones are replicated in a cluster, transient ones classic (on their home server)."""
    for q, name in enumerate(names):
        for _attempt in range(1000):
            client = Client(AMQPURL(urls[plan.home[q]]), timeout=10.0, name="flood-declare")
            try:
                client.connect()
                client.queue_declare(client.open_channel(), name, durable=durable)
                client.close()
                break
            except (OSError, ServerClosed, FrameError):
                drop(client)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)


def _depths(urls: list[str], names: list[str]) -> list[list[int | None]]:
    """message_count of every queue as every server answers it (None: no answer)."""
    out: list[list[int | None]] = []
    for url in urls:
        client = Client(AMQPURL(url), timeout=10.0, name="flood-depths")
        try:
            client.connect()
            ch = client.open_channel()
            out.append([*client.queue_depths(ch, names)])
            client.close()
        except (OSError, ServerClosed, FrameError):
            drop(client)
            out.append([None] * len(names))
    return out


def _wait_ready(shared: FloodShared, slots: range, procs: list[Any], deadline: float) -> None:
    while not all(shared.status[s] == READY for s in slots):
        for s in slots:
            if shared.status[s] == FAILED or not procs[s].is_alive():
                text = shared.last_error[s].value.decode(errors="replace")
                raise RuntimeError(f"{procs[s].name} failed while connecting: {text}")
        if time.monotonic() > deadline:
            raise RuntimeError("the flood's workers did not connect in time")
        time.sleep(0.05)


def _stop_workers(shared: FloodShared, procs: list[Any]) -> None:
    shared.stop.value = 1
    for proc in procs:
        proc.join(15.0)
        if proc.is_alive():
            proc.terminate()
            proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)


def run_flood(target: Target, opts: FloodOptions) -> dict[str, Any]:
    """The flood against one running target; the result as a JSON-able dict."""
    ctx = mp.get_context("spawn")
    plan = placement(opts.queues, opts.publishers, len(target.urls))
    tag = f"flood-{os.getpid()}-{int(time.time() * 1000) % 100000}"
    names = [f"{tag}-q{q}" for q in range(opts.queues)]
    setup_deadline = time.monotonic() + opts.setup_timeout
    _declare(target.urls, plan, names, setup_deadline, opts.durable_queues)
    shared = FloodShared(ctx, opts.queues, opts.publishers)
    # the workers' own bound; the coordinator stops them earlier through ``stop``
    worker_deadline = time.monotonic() + opts.setup_timeout + opts.timeout + 30.0
    procs: list[Any] = []
    sampler = StatusSampler(target.nodes, target.servers, opts.status_poll)
    result: dict[str, Any] = {"target": target.kind, "label": target.label}
    try:
        for q in range(opts.queues):
            job = ConsumerJob(
                target.urls[plan.consumer[q]], names[q], q, worker_deadline, os.getpid()
            )
            procs.append(
                ctx.Process(
                    target=run_flood_consumer, args=(job, shared, q), name=f"flood-consumer-{q}"
                )
            )
            procs[-1].start()
        _wait_ready(shared, range(opts.queues), procs, setup_deadline)
        for j, (q, server) in enumerate(plan.publishers):
            pjob = PublisherJob(
                target.urls[server],
                names[q],
                j,
                opts.messages,
                opts.body_size,
                opts.batch,
                opts.confirm_window,
                worker_deadline,
                os.getpid(),
            )
            slot = opts.queues + j
            procs.append(
                ctx.Process(
                    target=run_flood_publisher,
                    args=(pjob, shared, slot),
                    name=f"flood-publisher-{j}",
                )
            )
            procs[-1].start()
        _wait_ready(shared, range(len(procs)), procs, setup_deadline)
        sampler.start()
        go_mono, go_wall = time.monotonic(), time.time()
        shared.go.value = 1
        timed_out = _watch(shared, procs, opts, go_mono)
        end_mono = time.monotonic()
        _stop_workers(shared, procs)
        end_wall = go_wall + (end_mono - go_mono)
        depths = _depths(target.urls, names)
        if target.kind == "cluster" and opts.after > 0:
            time.sleep(opts.after)
        sampler.stop()
        result.update(
            _figures(shared, plan, opts, target, names, depths, go_mono, end_mono, timed_out)
        )
        result["status"] = sampler.summary() if target.nodes else []
        result["logs"] = _scan_logs(target, end_wall, go_wall, opts.context)
        return result
    finally:
        sampler.stop()
        if not shared.stop.value:
            _stop_workers(shared, procs)


def _watch(shared: FloodShared, procs: list[Any], opts: FloodOptions, go: float) -> bool:
    """Until the publishers are done and deliveries went quiet; True on the timeout."""
    q, p = opts.queues, opts.publishers
    deadline = go + opts.timeout
    finished_at: float | None = None
    next_report = go + 5.0
    while True:
        now = time.monotonic()
        if now > deadline:
            return True
        pubs_done = all(
            shared.status[q + j] in (DONE, FAILED) or not procs[q + j].is_alive() for j in range(p)
        )
        published = _per_queue_published(shared, opts)
        delivered = list(shared.delivered)
        if pubs_done:
            finished_at = finished_at or now
            last = max([finished_at, *shared.last_delivery])
            complete = all(d >= n for d, n in zip(delivered, published, strict=True))
            if now - last >= (min(opts.quiet, 1.0) if complete else opts.quiet):
                return False
        if now >= next_report:
            next_report = now + 5.0
            print(
                f"flood:   {now - go:5.1f} s: published {sum(shared.published):,}, "
                f"delivered {sum(delivered):,}",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(0.1)


def _per_queue_published(shared: FloodShared, opts: FloodOptions) -> list[int]:
    out = [0] * opts.queues
    for j in range(opts.publishers):
        out[j % opts.queues] += shared.published[j]
    return out


def _figures(
    shared: FloodShared,
    plan: Plan,
    opts: FloodOptions,
    target: Target,
    names: list[str],
    depths: list[list[int | None]],
    go: float,
    end: float,
    timed_out: bool,
) -> dict[str, Any]:
    q, p = opts.queues, opts.publishers
    published = _per_queue_published(shared, opts)
    acked = [0] * q
    for j in range(p):
        acked[j % q] += shared.acked[j]
    queues = []
    for i in range(q):
        answers = [d[i] for d in depths if d[i] is not None]
        left = max(answers) if answers else None
        queues.append(
            {
                "queue": names[i],
                "home": target.servers[plan.home[i]],
                "consumer": target.servers[plan.consumer[i]],
                "publishers": [target.servers[s] for qq, s in plan.publishers if qq == i],
                "published": published[i],
                "confirmed": acked[i] if opts.confirm_window else None,
                "delivered": shared.delivered[i],
                "left": left,
                "left_per_server": [d[i] for d in depths],
                "lost": None if left is None else published[i] - shared.delivered[i] - left,
            }
        )
    firsts = [t for t in shared.first_delivery if t]
    lasts = [t for t in shared.last_delivery if t]
    delivered = sum(shared.delivered)
    total_published = sum(published)
    window = (max(lasts) - min(firsts)) if firsts else 0.0
    taken = [t for t in shared.pub_taken if t]
    written = [t for t in shared.pub_written if t]
    lefts = [x["left"] for x in queues]
    workers = []
    for slot in range(q + p):
        role = f"consumer {slot}" if slot < q else f"publisher {slot - q}"
        workers.append(
            {
                "worker": role,
                "status": {READY: "running", DONE: "done", FAILED: "failed"}.get(
                    shared.status[slot], "starting"
                ),
                "closes": shared.closes[slot],
                "first_error": shared.first_error[slot].value.decode(errors="replace") or None,
                "last_error": shared.last_error[slot].value.decode(errors="replace") or None,
            }
        )
    total_left = None if any(x is None for x in lefts) else sum(lefts)  # type: ignore[misc]
    return {
        "queues": queues,
        "published": total_published,
        "confirmed": sum(acked) if opts.confirm_window else None,
        "nacked": sum(shared.nacked) if opts.confirm_window else None,
        "connection_blocked": sum(shared.blocked),
        "delivered": delivered,
        "left": total_left,
        "lost": None if total_left is None else total_published - delivered - total_left,
        "delivered_fraction": delivered / total_published if total_published else None,
        "delivery_window_s": round(window, 3),
        "deliveries_per_s": round(delivered / window, 1) if window > 0 else None,
        "go_to_last_delivery_s": round(max(lasts) - go, 3) if lasts else None,
        "deliveries_per_s_from_go": round(delivered / (max(lasts) - go), 1) if lasts else None,
        "publish_written_s": round(max(written) - go, 3) if written else None,
        "publish_taken_s": round(max(taken) - go, 3) if len(taken) == p else None,
        "publishers_taken": len(taken),
        "run_s": round(end - go, 3),
        "timed_out": timed_out,
        "consumer_closes": sum(shared.closes[s] for s in range(q)),
        "workers": workers,
    }


def _scan_logs(
    target: Target, end_wall: float, go_wall: float, context: int
) -> list[dict[str, Any]]:
    out = []
    for label, path in zip(target.servers, target.logs, strict=True):
        if path is None:
            continue
        try:
            with open(path, errors="replace") as fh:
                scanned = scan_log(fh, go_wall, end_wall, context)
        except OSError as exc:
            out.append({"server": label, "error": str(exc)})
            continue
        for entry in scanned["signatures"].values():
            first = entry["first"]
            if first is not None and first["t"] is not None:
                first["after_go_s"] = round(first["t"] - go_wall, 3)
        out.append({"server": label, "log": str(path), **scanned})
    return out
