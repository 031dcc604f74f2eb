"""Synthetic heartbeat history: what a cluster's console would have archived.

The model, per broker ``b`` and queue ``q``, one sample every ``interval`` seconds:

- messages in per interval are Poisson around ``base[b, q] * diurnal(t) * noise``
  (diurnal: lowest at 03:00 UTC, highest at 15:00 UTC);
- a queue's ready count hovers around a small Poisson level, draining at most
  ``3 * base * interval`` per interval, and out = previous + in - now, so the
  monotonic counters (enqueued, delivered) and the rates agree exactly;
- a broker's routed/delivered counters are the sums over its queues, published =
  routed / fan-out; a restart gives a new spid and resets every counter.

Injected incidents (recorded in ``<lake>/_incidents.json``) are placed at fixed
fractions of the period, so they never overlap: a root failover (the root dies,
no root for ~3.3 s worth of samples, another primary becomes root, the dead one
returns with a new spid: a ``no_root`` stretch, a ``broker_outage`` and a
``crash_restart``), a console gap (nothing recorded for a minute while every broker
runs on; their links come back up to two intervals apart, within the report's
reconnect allowance), a quick crash restart, a broker outage (a crash), a growing
backlog on one queue, a flapping link seen by one broker, and a planned stop (the
console marks a sample ``stopping``, one more status follows, the broker is away,
then back under a new spid).  Everything derives from the seed; the history is
produced in chunks of about a million rows, so any size fits in memory.
"""

from __future__ import annotations

import json
import math
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import lake
from pipeline.generate_rows import LakeRows, Plan
from pipeline.options import RECONNECT_ALLOWANCE

ROWS_PER_CHUNK = 1_000_000
MIN_TICKS = 200
FAILOVER_SECONDS = 3.3  # measured brokerd failover at the default heartbeat (benchmarks.md)
PREFETCH = 50
FLAP_CYCLES = 4  # down 2 samples, up 3 samples, FLAP_CYCLES times
#: one message in this many of what a broker takes in leaves over a bridge
BRIDGED_SHARE = 10


class GenerateError(ValueError):
    """Arguments that cannot produce a history with every incident."""


def broker_name(index: int) -> str:
    """Stable ``host:port`` names, as brokers announce them on the console link."""
    return f"10.0.{index // 250}.{index % 250 + 1}:5701"


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, tz=UTC).isoformat().replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """ISO-8601 (``Z`` allowed); naive means UTC."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise GenerateError(f"bad ISO time {text!r}") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def make_plan(
    brokers: int,
    queues: int,
    hours: float,
    interval: float,
    start: datetime,
    rng: np.random.Generator,
) -> Plan:
    """Check the arguments and place the incidents."""
    if brokers < 3:
        raise GenerateError("--brokers must be at least 3 (a root, its successor, an outage)")
    if queues < 1:
        raise GenerateError("--queues must be at least 1")
    if not interval > 0:
        raise GenerateError("--interval must be positive")
    if not hours > 0:
        raise GenerateError("--hours must be positive")
    interval_us = round(interval * 1e6)
    ticks = round(hours * 3600 / interval)
    if ticks < MIN_TICKS:
        raise GenerateError(
            f"{hours} h at {interval} s is {ticks} samples per broker; "
            f"at least {MIN_TICKS} are needed to place the incidents"
        )
    period = ticks * interval
    start_us = int(start.timestamp() * 1e6) // interval_us * interval_us
    names = [broker_name(i) for i in range(brokers)]
    types = ["primary" if i < 3 else "secondary" for i in range(brokers)]
    backlog_seconds = min(3600.0, max(600.0, 0.05 * period), 0.15 * period)
    phase_us = rng.integers(0, max(1, interval_us // 2), size=brokers)
    plan = Plan(
        names=names,
        types=types,
        phase_us=phase_us,
        start_us=start_us,
        interval_us=interval_us,
        ticks=ticks,
        failover_tick=int(0.2 * ticks),
        election_ticks=max(1, math.ceil(FAILOVER_SECONDS / interval)),
        failover_down=max(6, round(min(300.0, 0.02 * period) / interval)),
        restart_broker=2 if brokers > 3 else 0,
        restart_tick=int(0.35 * ticks),
        outage_broker=brokers - 1,
        outage_tick=int(0.45 * ticks),
        outage_down=max(8, round(min(900.0, 0.04 * period) / interval)),
        backlog_broker=1,
        backlog_queue=queues // 2,
        backlog_tick=int(0.6 * ticks),
        backlog_ticks=max(10, math.ceil(backlog_seconds / interval)),
        flap_observer=1,
        flap_peer=2,
        flap_tick=int(0.8 * ticks),
        console_tick=int(0.3 * ticks),
        console_down=max(4, round(min(60.0, 0.01 * period) / interval)),
        # the later links back within the reconnect allowance (a sample's phase included)
        console_stagger=max(0, min(2, math.floor((RECONNECT_ALLOWANCE - interval / 2) / interval))),
        stop_broker=0,  # the first root, back as a non-root after the failover
        stop_tick=int(0.92 * ticks),
        stop_down=max(6, round(min(120.0, 0.01 * period) / interval)),
    )
    windows = [
        (plan.failover_tick, plan.failover_tick + plan.failover_down),
        (plan.console_tick - 1, plan.heard_again(1) + 1),
        (plan.restart_tick, plan.restart_tick + 1),
        (plan.outage_tick, plan.outage_tick + plan.outage_down + 1),
        (plan.backlog_tick - 1, plan.backlog_tick + plan.backlog_ticks + 1),
        (plan.flap_tick, plan.flap_tick + 5 * FLAP_CYCLES + 1),
        (plan.stop_tick - 2, plan.stop_tick + plan.stop_down + 1),
    ]
    for (_, end), (next_start, _) in zip(windows, [*windows[1:], (ticks, 0)], strict=True):
        if end >= next_start:
            raise GenerateError(
                f"{hours} h at {interval} s is too short to keep the injected incidents "
                "apart; give more --hours or a shorter --interval"
            )
    return plan


def queue_names(queues: int) -> list[str]:
    """Queue names shared by every broker (cluster-wide queues)."""
    kinds = ["orders", "billing", "audit", "events", "mail", "search", "metrics", "jobs"]
    return [f"{kinds[i % len(kinds)]}.{i:03d}" for i in range(queues)]


def diurnal(ts_us: np.ndarray) -> np.ndarray:
    """Traffic factor in [0.35, 1]: low at 03:00 UTC, high at 15:00 UTC."""
    hour = (ts_us / 3.6e9) % 24.0
    return 0.35 + 0.65 * (0.5 - 0.5 * np.cos(2 * np.pi * (hour - 3.0) / 24.0))


def generate(
    lake_root: str | Path,
    brokers: int,
    queues: int,
    hours: float,
    seed: int,
    interval: float = 5.0,
    start: datetime | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write a synthetic history into ``lake_root``; returns the incidents document."""
    root = Path(lake_root)
    existing = [root / t for t in lake.SCHEMAS if (root / t).exists()]
    if existing and not overwrite:
        raise GenerateError(f"{root} already holds a lake ({existing[0].name}); use --overwrite")
    for path in existing:
        shutil.rmtree(path)
    rng = np.random.default_rng(seed)
    start = start or datetime(2026, 1, 5, tzinfo=UTC)
    plan = make_plan(brokers, queues, hours, interval, start, rng)
    Simulation(plan, queues, rng).run(root)
    document = {
        "generator": {
            "brokers": brokers,
            "queues": queues,
            "hours": hours,
            "seed": seed,
            "interval": interval,
            "start": _iso(plan.start_us),
            "end": _iso(plan.ts_us(plan.ticks)),
        },
        "brokers": plan.names,
        "incidents": plan.incidents,
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "_incidents.json").write_text(json.dumps(document, indent=2) + "\n")
    return document


class Simulation(LakeRows):
    """The per-tick state of every broker, queue and link, advanced chunk by chunk."""

    def __init__(self, plan: Plan, queues: int, rng: np.random.Generator) -> None:
        self.plan = plan
        self.rng = rng
        b, q = len(plan.names), queues
        self.queues = queue_names(q)
        self.base = np.clip(rng.lognormal(math.log(20.0), 0.8, size=(b, q)), 2.0, 500.0)
        self.base[plan.backlog_broker, plan.backlog_queue] = max(
            self.base[plan.backlog_broker, plan.backlog_queue], 10.0
        )
        self.level = rng.uniform(0.5, 15.0, size=(b, q))
        self.consumers = rng.integers(1, 5, size=(b, q)).astype(np.int32)
        self.fanout = rng.uniform(1.0, 2.0, size=b)
        self.publishers = rng.integers(1, 6, size=b).astype(np.int32)
        self.rtt = rng.uniform(0.15, 0.8, size=(b, b))
        self.messages = rng.poisson(self.level).astype(np.int64)
        # Counters of brokers that were already running when the history starts.
        self.enqueued = rng.integers(10**5, 10**8, size=(b, q)).astype(np.int64)
        self.delivered = self.enqueued - self.messages
        self.published = rng.integers(10**5, 10**8, size=b).astype(np.int64)
        self.routed = (self.published * self.fanout).astype(np.int64)
        self.b_delivered = self.routed - self.messages.sum(axis=1)
        self.spids: list[str] = []
        uptime_us = rng.integers(3_600_000_000, 30 * 86_400_000_000, size=b)
        self.current = np.array(
            [self._new_spid(plan.start_us - int(uptime_us[i])) for i in range(b)], dtype=np.int32
        )
        self.root = 0  # broker index of the root

    def _new_spid(self, start_us: int) -> int:
        """A brokerd-style spid (start ms in hex, pid, random) and its index."""
        pid = int(self.rng.integers(1000, 60000))
        self.spids.append(f"{start_us // 1000:012x}-{pid}-{int(self.rng.integers(0, 65536)):04x}")
        return len(self.spids) - 1

    def _alive(self, tick: np.ndarray) -> np.ndarray:
        """(T, B) mask of brokers sending samples."""
        p = self.plan
        alive = np.ones((tick.size, len(p.names)), dtype=bool)
        f = (tick >= p.failover_tick) & (tick < p.failover_tick + p.failover_down)
        alive[f, 0] = False
        o = (tick >= p.outage_tick) & (tick < p.outage_tick + p.outage_down)
        alive[o, p.outage_broker] = False
        s = (tick >= p.stop_tick) & (tick < p.stop_tick + p.stop_down)
        alive[s, p.stop_broker] = False
        return alive

    def _heard(self, tick: np.ndarray) -> np.ndarray:
        """(T, B) mask of samples the console records: none while it is away."""
        p = self.plan
        heard = np.ones((tick.size, len(p.names)), dtype=bool)
        for broker in range(len(p.names)):
            away = (tick >= p.console_tick) & (tick < p.heard_again(broker))
            heard[away, broker] = False
        return heard

    def _record(
        self, kind: str, broker: int | None, start_us: int, end_us: int, **details: Any
    ) -> None:
        self.plan.incidents.append(
            {
                "kind": kind,
                "broker": None if broker is None else self.plan.names[broker],
                "start": _iso(start_us),
                "end": _iso(end_us),
                "details": details,
            }
        )

    def run(self, root: Path) -> None:
        p = self.plan
        per_tick = len(p.names) * (1 + len(self.queues) + len(p.names) - 1)
        chunk = max(1, ROWS_PER_CHUNK // per_tick)
        for number, first in enumerate(range(0, p.ticks, chunk)):
            ticks = np.arange(first, min(p.ticks, first + chunk))
            self._chunk(root, ticks, f"gen-{number:05d}")
        p.incidents.sort(key=lambda i: (i["start"], i["kind"]))

    def _chunk(self, root: Path, ticks: np.ndarray, batch_id: str) -> None:
        p, rng = self.plan, self.rng
        nb, nq, nt = len(p.names), len(self.queues), ticks.size
        interval = p.interval_us / 1e6
        tick_us = p.start_us + ticks.astype(np.int64) * p.interval_us
        ts = tick_us[:, None] + p.phase_us[None, :].astype(np.int64)  # (T, B)
        alive = self._alive(ticks)
        load = diurnal(ts)[:, :, None] * rng.lognormal(0.0, 0.15, size=(nt, nb, nq))
        n_in = rng.poisson(self.base[None] * load * interval).astype(np.int64)
        target = rng.poisson(self.level[None], size=(nt, nb, nq)).astype(np.int64)
        drain = np.ceil(3.0 * self.base * interval).astype(np.int64)
        unacked_draw = rng.random((nt, nb, nq))
        rtt_noise = rng.lognormal(0.0, 0.25, size=(nt, nb, nb))

        messages = np.empty((nt, nb, nq), dtype=np.int64)
        n_out = np.empty((nt, nb, nq), dtype=np.int64)
        enq = np.empty((nt, nb, nq), dtype=np.int64)
        deq = np.empty((nt, nb, nq), dtype=np.int64)
        spid = np.empty((nt, nb), dtype=np.int32)
        root_of = np.empty((nt, nb), dtype=np.int32)  # spid index, -1 = no root
        is_root = np.zeros((nt, nb), dtype=bool)
        ready = np.ones((nt, nb), dtype=bool)
        restarted = np.zeros((nt, nb), dtype=bool)
        bb, bq = p.backlog_broker, p.backlog_queue
        for i, tick in enumerate(ticks.tolist()):
            self._events(int(tick), restarted[i])
            live = alive[i][:, None]
            incoming = np.where(live, n_in[i], 0)
            avail = self.messages + incoming
            now = np.maximum(np.minimum(target[i], avail), self.messages - drain)
            now = np.minimum(now, avail)
            if tick == p.backlog_tick - 1:
                now[bb, bq] = min(now[bb, bq], self.messages[bb, bq])
            elif p.backlog_tick <= tick < p.backlog_tick + p.backlog_ticks:
                incoming[bb, bq] = max(incoming[bb, bq], 2)
                now[bb, bq] = (
                    self.messages[bb, bq] + incoming[bb, bq] - incoming[bb, bq] * 35 // 100
                )
            now = np.where(live, now, self.messages)
            out = self.messages + incoming - now
            reset = restarted[i]
            self.enqueued[reset] = 0
            self.delivered[reset] = 0
            self.enqueued += incoming
            self.delivered += out
            self.messages = now
            n_in[i], n_out[i], messages[i] = incoming, out, now
            enq[i], deq[i] = self.enqueued, self.delivered
            spid[i] = self.current
            in_election = p.failover_tick <= tick < p.failover_tick + p.election_ticks
            if in_election:
                root_of[i] = -1
                ready[i] = False
            else:
                root_of[i] = self.current[self.root]
                is_root[i, self.root] = True

        routed_n = n_in.sum(axis=2)
        delivered_n = n_out.sum(axis=2)
        published_n = np.floor(routed_n / self.fanout[None] + 0.5).astype(np.int64)
        # a tenth of what each broker takes in goes on to another site over a bridge
        # (derived, no draw: the other series stay what they were)
        bridged_n = published_n // BRIDGED_SHARE
        routed_tot = np.empty((nt, nb), dtype=np.int64)
        deliv_tot = np.empty((nt, nb), dtype=np.int64)
        pub_tot = np.empty((nt, nb), dtype=np.int64)
        bridged_tot = np.empty((nt, nb), dtype=np.int64)
        bridged = np.zeros(nb, dtype=np.int64)  # a counter since each broker's start
        for i in range(nt):
            reset = restarted[i]
            self.published[reset] = 0
            self.routed[reset] = 0
            self.b_delivered[reset] = 0
            bridged[reset] = 0
            self.published += published_n[i]
            self.routed += routed_n[i]
            self.b_delivered += delivered_n[i]
            bridged += bridged_n[i]
            pub_tot[i], routed_tot[i], deliv_tot[i] = self.published, self.routed, self.b_delivered
            bridged_tot[i] = bridged

        unacked = np.minimum(
            self.consumers[None] * PREFETCH, np.floor(unacked_draw * 0.05 * n_out)
        ).astype(np.int64)
        # Links: the observer sees a peer active when the peer is alive, except the flap.
        active = np.broadcast_to(alive[:, None, :], (nt, nb, nb)).copy()
        offset = ticks - p.flap_tick
        flapping = (offset >= 0) & (offset < 5 * FLAP_CYCLES) & (offset % 5 < 2)
        active[flapping, p.flap_observer, p.flap_peer] = False
        rtt = self.rtt[None] * rtt_noise
        peers_active = active.sum(axis=2) - alive  # a broker is not its own peer
        # the console marks the status it has when "stopping" arrives; one more follows
        stopping = np.zeros((nt, nb), dtype=bool)
        stopping[ticks == p.stop_tick - 2, p.stop_broker] = True
        heard = alive & self._heard(ticks)  # what the console records: the written rows

        self._write_brokers(
            root, batch_id, ts, heard, spid, root_of, is_root, ready, peers_active, stopping,
            unacked, messages, pub_tot, routed_tot, deliv_tot, published_n, routed_n,
            delivered_n, bridged_tot,
        )  # fmt: skip
        self._write_queues(root, batch_id, ts, heard, messages, unacked, enq, deq, n_in, n_out)
        self._write_peers(root, batch_id, ts, heard, spid, active, rtt)

    def _events(self, tick: int, restarted: np.ndarray) -> None:
        """Apply this tick's state changes (root moves, restarts) and record incidents."""
        p = self.plan
        if tick == p.failover_tick:
            old = self.current[0]
            self.root = 1
            self._record(
                "root_failover",
                0,
                p.ts_us(tick),
                p.ts_us(tick + p.election_ticks),
                new_root=p.names[1],
                old_spid=self.spids[old],
                new_spid=self.spids[self.current[1]],
                no_root_seconds=p.election_ticks * p.interval_us / 1e6,
            )
            self._record(
                "no_root",
                0,
                p.ts_us(tick),
                p.ts_us(tick + p.election_ticks),
                root_before=p.names[0],
                root_after=p.names[1],
                seconds=p.election_ticks * p.interval_us / 1e6,
            )
        for broker, down_at, down in (
            (0, p.failover_tick, p.failover_down),
            (p.outage_broker, p.outage_tick, p.outage_down),
        ):
            if tick == down_at + down:
                back = p.ts_us(tick, broker)
                self._record(
                    "broker_outage", broker, p.ts_us(down_at, broker), back, missed_samples=down
                )
                self._restart(broker, tick, restarted)
        if tick == p.console_tick:
            brokers = range(len(p.names))
            last = max(p.ts_us(tick - 1, b) for b in brokers)
            first = min(p.ts_us(p.heard_again(b), b) for b in brokers)
            self._record(
                "console_gap",
                None,
                last,
                first,
                brokers=sorted(p.names),
                missed_intervals=p.console_down,
            )
        if tick == p.stop_tick + p.stop_down:
            b = p.stop_broker
            self._record(
                "planned_stop",
                b,
                p.ts_us(p.stop_tick - 1, b),
                p.ts_us(tick, b),
                spid=self.spids[self.current[b]],
                missed_samples=p.stop_down,
            )
            self._restart(b, tick, restarted, planned=True)
        if tick == p.restart_tick:
            self._restart(p.restart_broker, tick, restarted)
        if tick == p.backlog_tick + p.backlog_ticks - 1:
            self._record(
                "backlog",
                p.backlog_broker,
                p.ts_us(p.backlog_tick, p.backlog_broker),
                p.ts_us(tick, p.backlog_broker),
                vhost="/",
                queue=self.queues[p.backlog_queue],
            )
        if tick == p.flap_tick:
            last_up = p.flap_tick + 5 * (FLAP_CYCLES - 1) + 2
            self._record(
                "link_flap",
                p.flap_observer,
                p.ts_us(tick, p.flap_observer),
                p.ts_us(last_up, p.flap_observer),
                peer_address=p.names[p.flap_peer],
                transitions=2 * FLAP_CYCLES,
            )

    def _restart(
        self, broker: int, tick: int, restarted: np.ndarray, planned: bool = False
    ) -> None:
        at = self.plan.ts_us(tick, broker)
        old = self.spids[self.current[broker]]
        self.current[broker] = self._new_spid(at)
        restarted[broker] = True
        kind = "planned_restart" if planned else "crash_restart"
        self._record(kind, broker, at, at, spid=self.spids[self.current[broker]], old_spid=old)
