"""Catching up with the root's state (the other half of ``replication.py``).

A server that follows a root holds that root's log as of its term. One that
joins, finds a gap, or sees the root claim more than it holds asks for the
root's compacted log (``cluster.sync-request``) and replaces its state with
the answer (``cluster.sync``) before it serves clients. A root that never
followed another (the whole cluster restarted) seeds its log from the wiring
it recovered from disk.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from brokerd.cluster.wiring import entries as rep
from brokerd.cluster.wiring import local
from brokerd.cluster.wiring.recovered import shared_wiring
from brokerd.cluster.wiring.statelog import Entry, compact, replay

if TYPE_CHECKING:
    from collections.abc import Callable

    from brokerd.cluster.membership import Membership
    from brokerd.cluster.wiring.applied import Acknowledgements
    from brokerd.model.broker import Broker
    from brokerd.model.errors import AMQPError
    from brokerd.model.vhost import VirtualHost
    from brokerd.protocol.hooks import WiringDone

log = logging.getLogger("brokerd.cluster")

SYNC_REQUEST = "cluster.sync-request"
SYNC = "cluster.sync"


class StateSync:
    """Taking and giving the root's whole state (a mixin of ``WiringReplication``)."""

    members: Membership
    broker: Broker | None
    log: list[Entry]
    last_seq: int
    synced_root: str | None
    synced_term: int
    _sync_asked: tuple[str, int, float] | None
    _compacted_size: int
    _claimed: int
    acks: Acknowledgements
    seed_placer: Callable[[Entry], Entry] | None
    pending: dict[str, Any]

    if TYPE_CHECKING:

        @property
        def spid(self) -> str: ...

        def _vhost(self) -> VirtualHost | None: ...

        def _order(
            self,
            entry: Entry,
            request: str | None,
            *,
            applied: bool = False,
            ack: bool = False,
        ) -> AMQPError | tuple[bool, list[int] | None]: ...

        def _apply(self, entry: Entry) -> None: ...

        def _request(self, entry: Entry, done: WiringDone | None) -> None: ...

    def root_status(self, spid: str, seq: int) -> None:
        """The root's status says how far its state goes. Statuses take the control
        lane and may overtake wiring entries sent just before them on the data
        lane, so only a claim made one status ago counts: still behind what the
        root's previous status said (a quiet stream hides a gap, e.g. after a
        pause), take its state again."""
        if spid != self.members.root() or self.synced_root != spid:
            self._claimed = 0
            return
        claimed, self._claimed = self._claimed, seq
        if claimed > self.last_seq:
            log.warning("state behind the root at=%d root=%d: resync", self.last_seq, claimed)
            self.synced_root = None
            self._sync_asked = None
            self._claimed = 0
            self.members.evaluate()

    def became_root(self) -> None:
        self.acks.release()  # followers of an earlier tenure sync again first
        self.synced_root = self.spid  # a new root's own log is the cluster state
        self.synced_term = self._term()
        if not self.log and self.last_seq == 0:
            self._seed_from_model()

    def _seed_from_model(self) -> None:
        """A root that never followed another (the whole cluster restarted) orders
        the shared wiring it recovered from its disk: its log starts as that state,
        so the servers that sync from it keep their queues instead of dropping
        them as unknown to the root."""
        vhost = self.broker.vhosts.get(self.members.config.vhost) if self.broker else None
        if vhost is None:
            return
        name = vhost.name
        methods = shared_wiring(vhost)
        for method in methods:
            entry = rep.entry_for(method, name, origin=self.spid)
            if self.seed_placer is not None:
                entry = self.seed_placer(entry)
            self._order(entry, None, applied=True)
        if methods:
            log.warning("root seeded its state log with %d recovered wiring entries", len(methods))

    def _term(self) -> int:
        """This server's term (the one it orders under while it is root)."""
        return self.members.standing.term.number

    def in_sync(self, root: str, term: int) -> bool:
        """Holds ``root``'s log as of its ``term`` (a root acting again in a later term
        may have followed another root meanwhile: its log is taken again)."""
        return self.synced_root == root and (root == self.spid or self.synced_term == term)

    def want_sync(self, root: str, term: int) -> None:
        now = self.members.clock()
        if (
            self._sync_asked is not None
            and self._sync_asked[:2] == (root, term)
            and (now - self._sync_asked[2] < self.members.config.heartbeat_timeout)
        ):
            return
        if self.members.post(root, SYNC_REQUEST, rep.encode_bucket({}, [])):
            self._sync_asked = (root, term, now)
            log.info("sync requested root=%s term=%d", root, term)

    def _on_sync_request(self, spid: str) -> None:
        if not self.members.root_now():
            log.info("sync request from=%s not answered: not acting as root now", spid)
            return
        self.log = compact(self.log)
        self._compacted_size = len(self.log)
        header = {
            "seq": self.last_seq,
            "term": self._term(),
            "entries": [rep.entry_header(e) for e in self.log],
        }
        frames = [e.frame for e in self.log]
        if self.members.post(spid, SYNC, rep.encode_bucket(header, frames)):
            self.acks.follow(spid)
            log.info("sync sent to=%s entries=%d seq=%d", spid, len(self.log), self.last_seq)
        else:
            # it asks again each timeout, and stays not ready until one is answered
            log.warning("sync request from=%s not answered: no link up to it", spid)

    def _on_sync(self, spid: str, header: dict[str, Any], frames: list[bytes]) -> None:
        root = self.members.root()
        if spid != root:
            # said, not silent: a server that asks every second and never takes the
            # answer is otherwise indistinguishable from one whose answers are lost
            log.info("sync from=%s ignored: the root recognised here is %s", spid, root)
            return
        headers = header.get("entries") or []
        if len(headers) != len(frames):
            raise rep.BucketError("sync entries and frames differ in number")
        entries = [rep.entry_from_header(h, f) for h, f in zip(headers, frames, strict=True)]
        wiring = replay(entries)
        vhost = self._vhost()
        if vhost is not None:
            local.reconcile(vhost, wiring)
        for entry in entries:
            self._apply(entry)
        self.log = entries
        self._compacted_size = len(entries)
        self.last_seq = int(header.get("seq", 0))
        self.synced_root = spid
        self.synced_term = int(header.get("term", 0))
        self._claimed = 0
        log.warning(
            "sync done root=%s term=%d entries=%d seq=%d",
            spid,
            self.synced_term,
            len(entries),
            self.last_seq,
        )
        if vhost is not None:
            # meta-bindings of private queues the root withdrew while this server was
            # away: told again
            for method in local.missing_meta_bindings(vhost, wiring, self.spid):
                self._request(
                    rep.entry_for(method, vhost.name, origin=self.spid, meta_spid=self.spid), None
                )
        for request in list(self.pending):
            self.pending[request].sent_to = None  # resend to this root
        self.members.evaluate()
        self.members.synced(spid)
