"""The synthetic history's plan and how its arrays become lake rows (``pipeline.generate``).

Split from the simulation itself: ``Plan`` says who does what when, ``LakeRows`` turns a
chunk's (tick, broker[, queue or peer]) arrays into the lake's tables, writing only the
samples the console recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline import lake


@dataclass
class Plan:
    """Who does what when; ticks are sample indexes."""

    names: list[str]
    types: list[str]
    phase_us: np.ndarray
    start_us: int
    interval_us: int
    ticks: int
    failover_tick: int
    election_ticks: int
    failover_down: int
    restart_broker: int
    restart_tick: int
    outage_broker: int
    outage_tick: int
    outage_down: int
    backlog_broker: int
    backlog_queue: int
    backlog_tick: int
    backlog_ticks: int
    flap_observer: int
    flap_peer: int
    flap_tick: int
    console_tick: int
    console_down: int
    console_stagger: int
    stop_broker: int
    stop_tick: int
    stop_down: int
    incidents: list[dict[str, Any]] = field(default_factory=list)

    def ts_us(self, tick: int, broker: int | None = None) -> int:
        """The sample time of ``broker`` at ``tick`` (the bare tick time without a broker)."""
        phase = 0 if broker is None else int(self.phase_us[broker])
        return self.start_us + tick * self.interval_us + phase

    def heard_again(self, broker: int) -> int:
        """The first tick the console records ``broker`` after its gap: odd brokers' links
        come back ``console_stagger`` ticks after the others'."""
        return self.console_tick + self.console_down + (broker % 2) * self.console_stagger


class LakeRows:
    """The writers of ``Simulation``: ``heard`` masks say which samples are written."""

    plan: Plan
    spids: list[str]
    queues: list[str]
    consumers: np.ndarray
    publishers: np.ndarray

    def _strings(self, index: np.ndarray, values: list[str]) -> pa.Array:
        """Decode integer indexes into a string column (-1 = null)."""
        idx = pa.array(index.astype(np.int32), mask=index < 0)
        return pa.DictionaryArray.from_arrays(idx, pa.array(values)).dictionary_decode()

    def _write_brokers(
        self, root: Path, batch_id: str, ts: np.ndarray, heard: np.ndarray, *cols: np.ndarray
    ) -> None:
        p = self.plan
        (spid, root_of, is_root, ready, peers_active, stopping, unacked, messages, pub_tot,
         routed_tot, deliv_tot, published_n, routed_n, delivered_n, bridged_tot) = cols  # fmt: skip
        nt, nb = heard.shape
        interval = p.interval_us / 1e6
        broker_idx = np.broadcast_to(np.arange(nb)[None], (nt, nb))
        consumers = np.broadcast_to(self.consumers.sum(axis=1)[None], (nt, nb))
        m = heard
        data = pa.table(
            {
                "ts": pa.array(ts[m], type=lake.TS),
                "broker": self._strings(broker_idx[m], p.names),
                "spid": self._strings(spid[m], self.spids),
                "broker_type": self._strings(broker_idx[m], p.types),
                "is_root": pa.array(is_root[m]),
                "root": self._strings(root_of[m], self.spids),
                "ready": pa.array(ready[m]),
                "peers_active": pa.array(peers_active[m].astype(np.int32)),
                "peers_known": pa.array(np.full(m.sum(), nb - 1, dtype=np.int32)),
                "connections": pa.array((consumers + self.publishers[None])[m].astype(np.int32)),
                "consumers": pa.array(consumers[m].astype(np.int32)),
                "queues": pa.array(np.full(m.sum(), len(self.queues), dtype=np.int32)),
                "messages_ready": pa.array(messages.sum(axis=2)[m]),
                "messages_unacked": pa.array(unacked.sum(axis=2)[m]),
                "published_total": pa.array(pub_tot[m]),
                "routed_total": pa.array(routed_tot[m]),
                "delivered_total": pa.array(deliv_tot[m]),
                "rate_published": pa.array(published_n[m] / interval),
                "rate_routed": pa.array(routed_n[m] / interval),
                "rate_delivered": pa.array(delivered_n[m] / interval),
                "stopping": pa.array(stopping[m]),
                "bridged_total": pa.array(bridged_tot[m]),
            },
            schema=lake.BROKER_SAMPLES,
        )
        lake.write_table(root, "broker_samples", data, batch_id)

    def _write_queues(
        self, root: Path, batch_id: str, ts: np.ndarray, heard: np.ndarray, *cols: np.ndarray
    ) -> None:
        messages, unacked, enq, deq, n_in, n_out = cols
        nt, nb = heard.shape
        nq = len(self.queues)
        interval = self.plan.interval_us / 1e6
        m = np.broadcast_to(heard[:, :, None], (nt, nb, nq))
        broker_idx = np.broadcast_to(np.arange(nb)[None, :, None], (nt, nb, nq))
        queue_idx = np.broadcast_to(np.arange(nq)[None, None, :], (nt, nb, nq))
        ts3 = np.broadcast_to(ts[:, :, None], (nt, nb, nq))
        consumers = np.broadcast_to(self.consumers[None], (nt, nb, nq))
        rows = int(m.sum())
        data = pa.table(
            {
                "ts": pa.array(ts3[m], type=lake.TS),
                "broker": self._strings(broker_idx[m], self.plan.names),
                "vhost": self._strings(np.zeros(rows, dtype=np.int32), ["/"]),
                "queue": self._strings(queue_idx[m], self.queues),
                "messages": pa.array(messages[m]),
                "unacked": pa.array(unacked[m]),
                "consumers": pa.array(consumers[m].astype(np.int32)),
                "enqueued_total": pa.array(enq[m]),
                "delivered_total": pa.array(deq[m]),
                "rate_in": pa.array(n_in[m] / interval),
                "rate_out": pa.array(n_out[m] / interval),
            },
            schema=lake.QUEUE_SAMPLES,
        )
        lake.write_table(root, "queue_samples", data, batch_id)

    def _write_peers(
        self,
        root: Path,
        batch_id: str,
        ts: np.ndarray,
        heard: np.ndarray,
        spid: np.ndarray,
        active: np.ndarray,
        rtt: np.ndarray,
    ) -> None:
        nt, nb = heard.shape
        observer = np.broadcast_to(np.arange(nb)[None, :, None], (nt, nb, nb))
        peer = np.broadcast_to(np.arange(nb)[None, None, :], (nt, nb, nb))
        m = np.broadcast_to(heard[:, :, None], (nt, nb, nb)) & (observer != peer)
        ts3 = np.broadcast_to(ts[:, :, None], (nt, nb, nb))
        peer_spid = np.broadcast_to(spid[:, None, :], (nt, nb, nb))
        act = active[m]
        data = pa.table(
            {
                "ts": pa.array(ts3[m], type=lake.TS),
                "broker": self._strings(observer[m], self.plan.names),
                "peer": self._strings(peer_spid[m], self.spids),
                "peer_address": self._strings(peer[m], self.plan.names),
                "active": pa.array(act),
                "rtt_ms": pa.array(np.round(rtt[m], 3), mask=~act),
            },
            schema=lake.PEER_SAMPLES,
        )
        lake.write_table(root, "peer_samples", data, batch_id)
