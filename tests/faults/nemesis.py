"""The nemesis: faults on a seeded schedule, one at a time.

The schedule (kinds, durations, gaps and the random draws that pick targets)
comes from the seed alone, so a run can be repeated; which server a draw
lands on depends on who is root, or where a client is connected, when the
fault comes. Kinds are drawn as shuffled rounds of every kind, so a short
run still covers them all. Faults never overlap: each is undone (restart,
SIGCONT, heal) and the cluster given time to settle before the next, since
the guarantee under test is about losing any *one* server.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from brokerd.server.control import request
from tests.cluster_harness import Cluster
from tests.faults import network
from tests.faults.history import Fault, Recorder
from tests.faults.network import (
    CUT_ONE_WAY,
    CUT_PAIR,
    HALVES,
    ISOLATE,
    NETWORK_KINDS,
    SLOW_LINK,
)
from tests.faults.workload import Client

KILL_ROOT = "kill-root"
KILL_PRIMARY = "kill-primary"  # a primary that is not root
KILL_CONSUMER_SERVER = "kill-consumer-server"
KILL_PUBLISHER_SERVER = "kill-publisher-server"
PAUSE_SHORT = "pause-short"  # SIGSTOP shorter than the heartbeat timeout
PAUSE_LONG = "pause-long"  # SIGSTOP longer than the heartbeat timeout
CUT_LINK = "cut-link"  # both directions between two linked servers
MOVE_QUEUE = "move-queue"  # an operator moves a queue's owner (``brokerd ctl queue move``)
REBALANCE = "rebalance"  # an operator rebalances the owners (``ctl queues rebalance``)
STOP_PRIMARY = "stop-primary"  # a planned stop (SIGTERM) of a primary: its queues move first
KILL_ALL = "kill-all"  # every server at once (a power cut), all started again in any order
#: every server at once, and one primary's disk replaced: it comes back empty, first
#: (the most senior) or last
KILL_ALL_WIPE = "kill-all-wipe"
KINDS = (
    KILL_ROOT,
    KILL_PRIMARY,
    KILL_CONSUMER_SERVER,
    KILL_PUBLISHER_SERVER,
    PAUSE_SHORT,
    PAUSE_LONG,
    CUT_LINK,
    MOVE_QUEUE,
    REBALANCE,
    STOP_PRIMARY,
)
#: a new primary joins (``--join``), quorum groups grow onto it (``queues grow``), it
#: serves a while, the groups shrink off it, it is stopped as planned and forgotten
#: (``brokerd ctl cluster forget``): the members change twice under load (loopback only:
#: a network test bed has no namespace for a server more)
JOIN_FORGET = "join-forget"
MEMBERSHIP_KINDS = (JOIN_FORGET,)
#: with persistent messages (``--durable``) only: a restart of every server keeps what
#: was written, and transient messages are not (as in RabbitMQ)
DURABLE_KINDS = (*KINDS, KILL_ALL, KILL_ALL_WIPE)


@dataclass(frozen=True)
class Planned:
    kind: str
    hold: float  # seconds the fault stays in force
    gap: float  # seconds of calm after the cluster settled again
    pick: float  # draws in [0, 1) that choose the target and the peer
    pick_peer: float


def schedule(
    seed: int, count: int, kinds: Sequence[str] = KINDS, timeout: float = 1.0
) -> list[Planned]:
    """``count`` faults from ``seed``; holds scale with the heartbeat ``timeout``."""
    unknown = set(kinds) - set(DURABLE_KINDS) - set(NETWORK_KINDS) - set(MEMBERSHIP_KINDS)
    if unknown or not kinds:
        raise ValueError(
            f"unknown fault kinds {sorted(unknown)}; known: "
            f"{', '.join((*DURABLE_KINDS, *NETWORK_KINDS, *MEMBERSHIP_KINDS))}"
        )
    rng = random.Random(seed)
    order: list[str] = []
    while len(order) < count:
        batch = list(kinds)
        rng.shuffle(batch)
        order += batch
    plan = []
    for kind in order[:count]:
        if kind == PAUSE_SHORT:
            hold = rng.uniform(0.3, 0.7) * timeout
        elif kind == PAUSE_LONG:
            hold = rng.uniform(1.5, 3.0) * timeout
        elif kind == CUT_LINK or kind in NETWORK_KINDS:
            hold = rng.uniform(0.5, 3.0) * timeout  # some shorter than the timeout, most longer
        elif kind in (MOVE_QUEUE, REBALANCE):
            hold = 0.0  # an operation, not a fault: it takes what it takes
        else:  # kills and stops: down for a while, then restarted
            hold = rng.uniform(0.5, 3.0)
        plan.append(Planned(kind, hold, rng.uniform(0.5, 2.0), rng.random(), rng.random()))
    return plan


def _choose(candidates: Sequence[int], draw: float) -> int:
    return sorted(candidates)[int(draw * len(candidates)) % len(candidates)]


class Nemesis:
    """Applies planned faults to ``cluster`` and records them in ``recorder``."""

    def __init__(
        self,
        cluster: Cluster,
        recorder: Recorder,
        publishers: Sequence[Client],
        consumers: Sequence[Client],
        *,
        queues: Sequence[str] = (),
        settle_timeout: float = 20.0,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.cluster = cluster
        self.recorder = recorder
        self.publishers = publishers
        self.consumers = consumers
        self.settle_timeout = settle_timeout
        self.log = log
        #: the shared queues the workload uses (moves pick among them)
        self.queues = list(queues)
        #: servers found dead that the nemesis had not killed (must stay empty)
        self.crashes: list[dict[str, float | int | None]] = []

    # -- who is where ------------------------------------------------------------

    def root(self) -> int | None:
        views = self.cluster.sample()
        roots = [i for i, v in views.items() if v.get("is_root") and v.get("quorum")]
        return roots[0] if len(roots) == 1 else None

    def role(self, index: int, root: int | None) -> str:
        if index == root:
            return "root"
        if index >= len(self.cluster.nodes):
            return "joiner"  # a primary join-forget adds
        return self.cluster.nodes[index].kind

    def primaries(self) -> list[int]:
        return [n.index for n in self.cluster.nodes if n.kind == "primary" and not n.retired]

    def everyone(self) -> list[int]:
        """Every server a fault may touch (not those forgotten for good)."""
        return [n.index for n in self.cluster.nodes if not n.retired]

    def target(self, planned: Planned, root: int | None) -> tuple[int, int | None, str]:
        """(target, peer, note) for a planned fault, from the cluster as it is now."""
        everyone = self.everyone()
        note = ""
        if planned.kind == JOIN_FORGET:  # the primary it adds
            return len(self.cluster.nodes), None, "joins through the root"
        if planned.kind == KILL_ROOT:
            if root is not None:
                return root, None, note
            return _choose(self.primaries(), planned.pick), None, "no root seen: a primary"
        if planned.kind == KILL_ALL:  # the target: the server that starts last
            return _choose(everyone, planned.pick), None, note
        if planned.kind == KILL_ALL_WIPE:  # the target: the primary whose disk is replaced
            first = "it starts first" if planned.pick_peer < 0.5 else "it starts last"
            return _choose(self.primaries(), planned.pick), None, first
        if planned.kind == STOP_PRIMARY:  # the root half of the time, as for pauses
            if root is not None and planned.pick < 0.5:
                return root, None, note
            return _choose([i for i in self.primaries() if i != root], planned.pick), None, note
        if planned.kind == KILL_PRIMARY:
            return _choose([i for i in self.primaries() if i != root], planned.pick), None, note
        if planned.kind in (KILL_CONSUMER_SERVER, KILL_PUBLISHER_SERVER):
            clients = self.consumers if planned.kind == KILL_CONSUMER_SERVER else self.publishers
            servers = {c.server for c in clients if c.server is not None}
            if not servers:
                return _choose(everyone, planned.pick), None, "no client connected: any server"
            return _choose(list(servers), planned.pick), None, note  # type: ignore[arg-type]
        if planned.kind in (MOVE_QUEUE, REBALANCE, HALVES):  # any server
            return _choose(everyone, planned.pick), None, note
        if planned.kind == ISOLATE:
            return self._isolated(planned, root)
        if planned.kind == SLOW_LINK:  # a primary: the root half of the time
            if root is not None and planned.pick < 0.5:
                return root, None, note
            return _choose([i for i in self.primaries() if i != root], planned.pick), None, note
        # pauses and cuts: the root half of the time, else any other server
        if root is not None and planned.pick < 0.5:
            target = root
        else:
            target = _choose([i for i in everyone if i != root], planned.pick)
        if planned.kind not in (CUT_LINK, CUT_PAIR, CUT_ONE_WAY):
            return target, None, note
        # secondaries link to primaries only
        linked = self.primaries() if self.cluster.nodes[target].kind == "secondary" else everyone
        peers = [i for i in linked if i != target]
        if root is not None and root in peers and planned.pick_peer < 0.5:
            return target, root, note
        return target, _choose(peers, planned.pick_peer), note

    # -- faults ------------------------------------------------------------------

    def apply(self, planned: Planned) -> Fault:
        """Apply, hold, undo, then wait for a settled root and the gap."""
        self.restart_crashed()
        root = self.root()
        target, peer, note = self.target(planned, root)
        cluster = self.cluster
        fault = Fault(planned.kind, target, self.role(target, root), time.time(), peer=peer)
        if peer is not None:
            fault.peer_role = self.role(peer, root)
        fault.note = note
        self.recorder.fault(fault)
        if planned.kind in (MOVE_QUEUE, REBALANCE):
            fault.note = (fault.note + "; " if fault.note else "") + self.operate(planned)
        elif planned.kind == JOIN_FORGET:
            fault.note = self.join_forget(planned, root)
        elif planned.kind in (KILL_ALL, KILL_ALL_WIPE):
            for index in self.everyone():
                cluster.kill(index)
            time.sleep(planned.hold)
            others = [i for i in self.everyone() if i != target]
            order = [*others, target]
            if planned.kind == KILL_ALL_WIPE:
                # a new disk: nothing of its store (its log is kept, for the report)
                shutil.rmtree(cluster.nodes[target].home / "store")
                if planned.pick_peer < 0.5:
                    order = [target, *others]  # and the most senior
            for index in order:
                self.restart(index)
        elif planned.kind.startswith("kill-"):
            cluster.kill(target)
            time.sleep(planned.hold)
            self.restart(target)
        elif planned.kind == STOP_PRIMARY:
            code = cluster.stop(target)
            if code != 0:
                fault.note = (fault.note + "; " if fault.note else "") + f"exit status {code}"
            time.sleep(planned.hold)
            self.restart(target)
        elif planned.kind == SLOW_LINK:
            link = cluster.nodes[target].slow
            assert link is not None, "slow-link needs a cluster with slow links"
            try:
                shape = network.slow(link, planned.pick_peer)
                fault.note = "; ".join(p for p in (fault.note, shape) if p)
                time.sleep(planned.hold)
            finally:
                link.clear()
        elif planned.kind in NETWORK_KINDS:
            bed = cluster.netbed
            assert bed is not None, "network faults need a test bed (RunConfig.netbed)"
            try:
                cut = network.apply(
                    bed,
                    planned.kind,
                    target,
                    peer,
                    [n.bed_slot for n in cluster.nodes],  # type: ignore[misc]
                    self.primaries(),
                    planned.pick_peer,
                )
                fault.cut = time.time()
                fault.note = "; ".join(p for p in (fault.note, cut) if p)
                time.sleep(planned.hold)
            finally:
                fault.healing = time.time()
                bed.heal()
        elif planned.kind.startswith("pause-"):
            cluster.pause(target)
            try:
                time.sleep(planned.hold)
            finally:
                cluster.resume(target)
        else:
            assert peer is not None
            try:
                cluster.ctl(target, "fault", "cut-link", cluster.spid(peer))
                cluster.ctl(peer, "fault", "cut-link", cluster.spid(target))
                time.sleep(planned.hold)
            except (AssertionError, OSError, ValueError) as exc:  # recorded; the heal still runs
                fault.note = (fault.note + "; " if fault.note else "") + f"cut failed: {exc}"
            finally:
                fault.healing = time.time()
                self.heal([target, peer])
        fault.end = time.time()
        try:
            cluster.wait_until(cluster.settled_root, timeout=self.settle_timeout, what="settled")
            fault.recovered = time.time()
        except AssertionError:
            fault.note = (fault.note + "; " if fault.note else "") + "no settled root in time"
        self.log(
            f"{planned.kind} [{target}] ({fault.role})"
            + (f" <-> [{peer}] ({fault.peer_role})" if peer is not None else "")
            + (f": {fault.note}" if planned.kind in (MOVE_QUEUE, REBALANCE, JOIN_FORGET) else "")
            + f" held {fault.end - fault.start:.1f}s, settled "
            + (f"after {fault.recovered - fault.start:.1f}s" if fault.recovered else "NOT")
        )
        time.sleep(planned.gap)
        return fault

    def join_forget(self, planned: Planned, root: int | None) -> str:
        """A new primary joins through the root, holds for ``planned.hold`` under the
        workload (it takes copies, maybe queues), is stopped as planned and forgotten
        through another primary; what happened, for the record."""
        cluster = self.cluster
        through = root if root is not None else self.primaries()[0]
        index = cluster.add_primary()
        address = cluster.address(index)
        started = time.monotonic()
        cluster.start(index, extra=["--join", cluster.address(through)])

        def admitted() -> bool:
            held = request(cluster.nodes[through].data_dir, "cluster", ["members"], timeout=5)
            rows = (held.get("result") or {}).get("members", [])
            return any(r["address"] == address and r["state"] == "up" for r in rows) and bool(
                held["result"].get("committed")
            )

        try:
            cluster.wait_until(admitted, timeout=self.settle_timeout, what=f"{address} admitted")
            note = f"admitted in {time.monotonic() - started:.1f}s"
        except AssertionError:
            note = "NOT admitted in time"
        # quorum groups (``--queue-type quorum --group-size``) take it in, under traffic,
        # and let it go before it stops (its forget would too, for groups of three up)
        note += "; " + self.regroup(through, "grow", address)
        time.sleep(planned.hold)
        note += "; " + self.regroup(through, "shrink", address)
        cluster.stop(index)
        asked = time.monotonic()
        deadline = asked + self.settle_timeout
        answer = ""
        while time.monotonic() < deadline:
            at = next(i for i in self.primaries() if i != index and cluster.nodes[i].alive())
            try:
                reply = request(
                    cluster.nodes[at].data_dir, "cluster", ["forget", address], timeout=40
                )
            except (OSError, ValueError) as exc:
                reply = {"ok": False, "error": str(exc)}
            if reply.get("ok") and reply["result"].get("committed"):
                answer = f"forgotten in {time.monotonic() - asked:.1f}s"
                break
            answer = f"forget refused: {reply.get('error') or reply.get('result')}"
            time.sleep(0.3)  # still heard (its stop under way), or the last change pending
        cluster.nodes[index].retired = True
        return f"{note}; {answer}"

    def regroup(self, at: int, action: str, address: str) -> str:
        """``brokerd ctl queues grow|shrink`` asked of server ``at``: how many groups
        changed, for the record."""
        try:
            reply = request(
                self.cluster.nodes[at].data_dir, "queues", [action, address], timeout=40
            )
        except (OSError, ValueError) as exc:
            return f"{action} failed: {exc}"
        if not reply.get("ok"):
            return f"{action} refused: {reply.get('error')}"
        rows = reply["result"].get("queues", [])
        return f"{action} {sum(r['changed'] for r in rows)} of {len(rows)} groups"

    def _isolated(self, planned: Planned, root: int | None) -> tuple[int, None, str]:
        """Who ``isolate`` cuts off: the root, a queue's owner, a replica (a primary
        that is neither) or the secondary, in turn by the draw."""
        aim = network.ISOLATE_TARGETS[int(planned.pick_peer * 4) % 4]
        primaries = self.primaries()
        owners = [
            i for i in primaries if i != root and (self.cluster.status(i) or {}).get("owned_queues")
        ]
        secondaries = [n.index for n in self.cluster.nodes if n.kind == "secondary"]
        if aim == "root" and root is not None:
            return root, None, "the root"
        if aim == "owner" and owners:
            return _choose(owners, planned.pick), None, "a queue's owner"
        if aim == "secondary" and secondaries:
            return _choose(secondaries, planned.pick), None, "the secondary"
        replicas = [i for i in primaries if i != root and i not in owners] or [
            i for i in primaries if i != root
        ]
        return _choose(replicas or primaries, planned.pick), None, "a replica"

    def operate(self, planned: Planned) -> str:
        """A move of one of the workload's queues to another primary, or a rebalance,
        asked of the target server under traffic; what it answered, for the record
        (a refusal is an answer: a failover may be under way)."""
        cluster = self.cluster
        root = self.root()
        target, _peer, _note = self.target(planned, root)
        data_dir = cluster.nodes[target].data_dir
        try:
            if planned.kind == REBALANCE:
                reply = request(data_dir, "queues", ["rebalance"], timeout=30)
                moves = (reply.get("result") or {}).get("moves", [])
                return f"rebalance: {len(moves)} moves" if reply.get("ok") else reply["error"]
            if not self.queues:
                return "no queue to move"
            queue = self.queues[int(planned.pick_peer * len(self.queues)) % len(self.queues)]
            owners = [
                i
                for i in self.primaries()
                if queue in (cluster.status(i) or {}).get("owned_queues", [])
            ]
            others = [i for i in self.primaries() if i not in owners]
            group = self.group_of(owners, queue)
            if group:  # a quorum queue kept by some primaries moves within them
                others = [i for i in others if cluster.address(i) in group] or others
            to = _choose(others, planned.pick_peer)
            reply = request(data_dir, "queue", ["move", queue, cluster.spid(to)], timeout=30)
            if reply.get("ok"):
                return f"moved {queue} to [{to}] in {reply['result']['ms']} ms"
            return f"move of {queue} to [{to}] refused: {reply.get('error')}"
        except (OSError, ValueError, KeyError) as exc:
            return f"operation failed: {exc}"

    def group_of(self, owners: list[int], queue: str) -> list[str]:
        """The addresses of ``queue``'s quorum group as its owner lists it ([]: every
        primary keeps a copy, or its owner did not say)."""
        for index in owners:
            reply = request(self.cluster.nodes[index].data_dir, "queues", timeout=5)
            for row in (reply.get("result") or {}).get("queues", []):
                if row.get("name") == queue:
                    return list(row.get("group") or [])
        return []

    def restart(self, index: int, attempts: int = 3) -> None:
        """Start a dead server again (its data directory, hence its store, kept)."""
        for attempt in range(attempts):
            try:
                self.cluster.start(index)
                return
            except (AssertionError, RuntimeError, TimeoutError):
                if attempt == attempts - 1:
                    raise
                self.cluster.stop(index)
                time.sleep(0.5)

    def restart_crashed(self) -> None:
        """Servers we did not kill that are gone (a crash: recorded), started again.

        Faults are undone before the next one, so between faults every server
        the nemesis touched is running."""
        for node in self.cluster.nodes:
            if node.process is not None and not node.alive() and not node.retired:
                code = node.process.proc.returncode if node.process.proc else None
                self.crashes.append({"index": node.index, "returncode": code, "at": time.time()})
                self.log(f"[{node.index}] exited by itself with {code}: restarting it")
                self.restart(node.index)

    def heal(self, indexes: Sequence[int]) -> None:
        for index in indexes:
            try:
                self.cluster.ctl(index, "fault", "heal")
            except (AssertionError, OSError, ValueError) as exc:
                self.log(f"[{index}] heal failed: {exc}")

    def undo_everything(self) -> None:
        """Before the drain: every server running, none paused, no link cut."""
        if self.cluster.netbed is not None:
            self.cluster.netbed.heal()
        for node in self.cluster.nodes:
            if node.slow is not None:
                node.slow.clear()
        for node in self.cluster.nodes:
            if node.paused and node.alive():
                self.cluster.resume(node.index)
        self.restart_crashed()
        self.heal(self.everyone())
