"""Operator commands on cluster membership: root enable/disable, live reconfiguration,
fault injection, and the status that ``brokerd ctl status`` and the console show.

``OperatorCommands`` is an object the controller has (``operations``), over the
membership it is given: it changes membership's configuration, known hosts,
candidacy and cuts, and reads the election's state through membership's
properties (``decision``, ``ready``...) and ``members.standing``. The
controller's methods of the same names delegate to it (the server calls
those), so the election module stays about the election.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from brokerd.cluster.config import ClusterConfig
from brokerd.cluster.election import PRIMARY
from brokerd.cluster.peers import server_key

if TYPE_CHECKING:
    from brokerd.cluster.membership import Membership
    from brokerd.cluster.peers import Peer

log = logging.getLogger("brokerd.cluster")


class OperatorCommands:
    """What operators ask of a server's membership (ctl, console commands, dumps)."""

    def __init__(self, members: Membership) -> None:
        self.members = members

    def set_root_enabled(self, enabled: bool) -> dict[str, Any]:
        members = self.members
        if members.type != PRIMARY:
            raise ValueError("a secondary server is never root")
        if members.root_enabled != enabled:
            members.root_enabled = enabled
            log.warning("root %s spid=%s", "enabled" if enabled else "disabled", members.spid)
            # a disabled root releases here and says so with its status at once; the
            # others vote for its successor at once too (statuses go out on change),
            # so the hand-over takes a few link round trips
            members.evaluate()
        return {"root_enabled": members.root_enabled, "is_root": members.decision.is_root}

    def reconfigure(self, config: ClusterConfig) -> dict[str, Any]:
        """Apply a new cluster configuration live (the console's config.apply):
        heartbeat timing at the next beat, known hosts by linking to the new ones
        and dropping links to the removed. Name, vhost, user and secret are read at
        start only; a change to them needs a restart."""
        members = self.members
        applied = []
        old = members.config
        members.config = config
        if (old.heartbeat_interval, old.heartbeat_timeout, old.open_timeout) != (
            config.heartbeat_interval,
            config.heartbeat_timeout,
            config.open_timeout,
        ):
            applied.append("heartbeat")
        known = {str(h) for h in config.known_hosts}
        if known != members.known and members.members_version > 0:
            # the root orders the members since they first changed (``knownhosts``)
            log.warning(
                "console known_hosts ignored: the cluster's members are at version %d "
                "(brokerd ctl cluster members)",
                members.members_version,
            )
        elif known != members.known:
            removed, added = members.set_known(known, config.checksum)
            applied.append("known_hosts")
            log.warning(
                "cluster known hosts changed checksum=%s added=%s removed=%s",
                members.checksum,
                ",".join(sorted(added)) or "-",
                ",".join(sorted(removed)) or "-",
            )
        if applied:
            members.evaluate()  # a new checksum goes out with a status at once
        return {"applied": applied, "checksum": members.checksum}

    def cut_link(self, spid: str) -> dict[str, Any]:
        members = self.members
        if not members.fault_injection:
            raise ValueError("fault injection is off (start brokerd with --enable-fault-injection)")
        # like a network cut: nothing more goes out or comes in on this link, and
        # the peer turns inactive when its last status ages past the timeout
        members.cut.add(spid)
        log.warning("fault cut-link spid=%s", spid)
        # a link that drops what it carries ends the session on this side, as a link
        # that goes down does (the peer hears of it by a Void once the link is back)
        members.peer_lost(spid, "link cut (fault injection)")
        members.evaluate()
        return {"cut": sorted(members.cut)}

    def heal(self) -> dict[str, Any]:
        members = self.members
        if not members.fault_injection:
            raise ValueError("fault injection is off (start brokerd with --enable-fault-injection)")
        healed = sorted(members.cut)
        members.cut.clear()
        log.warning("fault heal spids=%s", ",".join(healed) or "-")
        for spid in healed:
            if members.link_to(spid) is not None:
                members.link_ready(spid)  # as if the link had come back up
        return {"healed": healed}

    def member_table(self) -> dict[str, Any]:
        """The cluster's members as ``brokerd ctl cluster members`` lists them: each
        known host (the primaries the cluster file, or the console, lists), then
        each secondary heard from, with the run that answers there, its type and
        its state: ``self``, ``up`` (heard within the timeout), ``down`` (heard
        before, silent now), ``gone`` (its connections closed and its port
        refused), or ``never heard``; and the root. ``version``: the members'
        version (0: the cluster file's set; ``knownhosts``), with whether a
        majority holds it, the servers forgotten, and ``checksum``, what every
        server compares."""
        members = self.members
        now = members.clock()
        root = members.root()
        current, _replaced = servers(members)
        at: dict[str, Peer] = {}
        for peer in current:
            for name in {peer.address, *peer.aliases} - {""}:
                at[name] = peer

        def row(address: str, peer: Peer | None) -> dict[str, Any]:
            mine = address in members.own_addresses or address == members.address
            if mine or (peer is not None and peer.spid == members.spid):
                spid, kind, state = members.spid, members.type, "self"
            elif peer is None:
                spid, kind, state = None, PRIMARY, "never heard"
            else:
                spid, kind = peer.spid, peer.type
                if members.standing.active(peer, now):
                    state = "up"
                else:
                    state = "gone" if peer.gone else "down"
            return {
                "address": address,
                "spid": spid,
                "type": kind,
                "state": state,
                "root": spid is not None and spid == root,
            }

        rows = [row(address, at.get(address)) for address in sorted(members.known)]
        listed = {r["spid"] for r in rows if r["spid"]}
        for peer in current:
            if peer.type != PRIMARY and peer.spid not in listed:
                rows.append(row(server_key(peer), peer))
        if members.type != PRIMARY:
            rows.append(row(members.address, None))
        changes = getattr(members, "member_changes", None)
        held = changes.describe() if changes is not None else {"version": 0}
        return {**held, "checksum": members.checksum, "root": root, "members": rows}

    def status(self) -> dict[str, Any]:
        members = self.members
        decision = members.evaluate()
        now = members.clock()
        current, replaced = servers(members)
        return {
            "spid": members.spid,
            "type": members.type,
            "is_root": decision.is_root,
            "root": members.root(),
            # root announced but not acting: its lease ran out (a pause), being renewed
            "suspended": members.standing.suspended_since is not None,
            # the root this server cannot reach while others do (clients sent elsewhere)
            "detached": members.detached,
            # cut off in a minority a majority may serve without (clients sent elsewhere)
            "partitioned": members.standing.partition.reason,
            "ready": members.ready,
            "root_enabled": members.root_enabled,
            "checksum": members.checksum,
            # the members' version (0: the cluster file's; ``ctl cluster members``)
            "members_version": members.members_version,
            "vote": decision.vote,
            "reason": decision.reason,
            "quorum": decision.quorum,
            "known_primaries": members.known_primaries(now),
            "listed": members.listed,
            # recovered the cluster's wiring from its disk at start (the election after
            # a whole-cluster restart prefers such a server)
            "holds_state": members.holds_state,
            "known_hosts": sorted(members.known),
            "peers": [
                {
                    "spid": p.spid,
                    # the spids this server ran under before it restarted (retired)
                    "replaces": replaced.get(p.spid, []),
                    "type": p.type,
                    "active": members.standing.active(p, now),
                    "address": p.address,
                    "aliases": sorted(p.aliases),
                    "root_enabled": p.status.root_enabled if p.status else None,
                    "is_root": bool(p.status and p.status.is_root),
                    "vote": p.status.vote if p.status else None,
                    "holds_state": bool(p.status and p.status.holds_state),
                    # its state log's and copy's places as its latest status gave
                    # them: what the election ranks it by here (a status sent before
                    # it caught up ranks it lower than it is)
                    "state": None
                    if p.status is None or p.status.state_source is None
                    else [p.status.state_source, p.status.state_term, p.status.state_seq],
                    "copy": None
                    if p.status is None or p.status.copy_source is None
                    else [p.status.copy_source, p.status.copy_seq],
                    "syncing": None if p.status is None else p.status.syncing,
                    "link": p.link.state if p.link else None,
                    "last_seen_age": None if p.status is None else round(now - p.last_seen, 3),
                    "rtt_ms": p.rtt_ms,
                    "cut": p.spid in members.cut,
                }
                for p in current
            ],
            "links": {addr: link.state for addr, link in members.links.items()},
            "echo_rtt": members.echo_rtt.describe(),
            "alarms": [
                {"kind": a.kind, "message": a.message, "since": a.since}
                for a in members.alarms.values()
            ],
        }

    def summary(self) -> dict[str, Any]:
        members = self.members
        now = members.clock()
        current, _replaced = servers(members)
        return {
            "role": ("root" if members.decision.is_root else members.type),
            "root": members.root(),
            "peers_active": sum(members.standing.active(p, now) for p in current),
            "peers_known": len(current),
            "checksum": members.checksum,
            "ready": members.ready,
        }


def servers(members: Membership) -> tuple[list[Peer], dict[str, list[str]]]:
    """One peer per server, as operators count them: a server that restarted comes
    back under a new spid at the same address, and its old spid is retired from
    every view (status, dumps, ``peers=``, the console) once the new one is seen.

    Membership itself keeps the old record (its address names where a lost owner's
    durable queues wait, its last status holds its fenced report for a failover),
    so only the views drop it. Returns the current peers by spid and, per current
    spid, the spids it replaced (oldest first)."""
    by_server: dict[str, list[Peer]] = {}
    for peer in members.peers.values():
        by_server.setdefault(server_key(peer), []).append(peer)
    current: list[Peer] = []
    replaced: dict[str, list[str]] = {}
    for runs in by_server.values():
        runs.sort(key=lambda p: p.spid)  # spids sort by start time (known before a status)
        newest = runs[-1]
        current.append(newest)
        if len(runs) > 1:
            replaced[newest.spid] = [p.spid for p in runs[:-1]]
    current.sort(key=lambda p: p.spid)
    return current, replaced


def retired_spids(members: Membership) -> set[str]:
    """The spids :func:`servers` retires (earlier runs of servers seen again under a new
    spid at the same address): views that list something per peer (the link rows of
    ``ctl status`` and of the dump) leave them out, as the peer rows do."""
    _current, replaced = servers(members)
    return {spid for runs in replaced.values() for spid in runs}


def worker_name(members: Membership, spid: str | None) -> str | None:
    """A worker of a cluster of hosts as operators name it, ``worker-K@HOST:PORT``
    (None: not a cluster of hosts, or a server not heard from)."""
    group = members.hostgroup
    if group is None or spid is None:
        return None
    if spid == members.spid:
        return f"worker-{group.index}@{group.host_address}"
    peer = members.peers.get(spid)
    status = peer.status if peer is not None else None
    if status is None or not status.host_address:
        return None
    return f"worker-{status.worker}@{status.host_address}"


def address_of(members: Membership, spid: str) -> str | None:
    """Where the server ``spid`` listens (``host:port``): this server, a peer, or an
    earlier run of one (where it was); None for a spid this server never linked to."""
    if spid == members.spid:
        return members.address or None
    peer = members.peers.get(spid)
    if peer is None:
        return None
    return peer.address or min(peer.aliases, default="") or None
