"""The cluster's members as replicated state: versioned known hosts (seed 000
"expandable", issue 43).

The cluster file gives the first set (version 0). After that the set changes
only by the root ordering a ``cluster.members`` entry in the state log, one
server at a time (``admitted``, ``forgotten``): each entry carries the whole
new set, its version (one above the last) and the term of the root that
ordered it. Every server applies it, keeps it on disk (``save``/``load``)
and links by it, so a restart or a whole-cluster restart resumes from it,
not from the file.

Which set wins: the one with the highest ``(version, term)`` a server has
seen, as Raft's servers use the latest configuration in their logs. Two
roots never both change the set: the root orders a change only once a
majority of the current set holds the current set (``committed``), so any
two sets one change apart share a majority member, and a root of a later
term that never saw an uncommitted change orders its own under the same
version with a higher term, which then wins.

A forgotten server stays refused: its node (a random id its data directory
keeps from its first start, ``node_id``) is remembered, with its address, so
it cannot return unnoticed; a new disk at the same address is a new server,
and joins like any other.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

#: where a server keeps the set it last applied, and its node id
MEMBERS_FILE = "cluster-members.json"
#: a forgotten server whose node nobody knew: refused by address when it claims membership
ANY_NODE = ""


class MembershipError(ValueError):
    """A change the current set does not allow (the text says why)."""


@dataclass(frozen=True)
class KnownHosts:
    """One version of the cluster's primaries (``host:port`` each), with the
    servers forgotten so far as ``(address, node)``."""

    version: int = 0
    term: int = 0
    hosts: tuple[str, ...] = ()
    forgotten: tuple[tuple[str, str], ...] = ()
    #: the node each admitted host joined with (the file's first hosts: unknown)
    nodes: tuple[tuple[str, str], ...] = ()

    @classmethod
    def initial(cls, hosts: Iterable[str]) -> KnownHosts:
        return cls(0, 0, tuple(sorted(set(hosts))))

    @property
    def key(self) -> tuple[int, int]:
        """What orders two sets: the later change, then the later root's."""
        return (self.version, self.term)

    def newer_than(self, other: KnownHosts) -> bool:
        return self.key > other.key

    def node_of(self, host: str) -> str:
        return dict(self.nodes).get(host, ANY_NODE)

    def is_forgotten(self, address: str, node: str, *, claims_membership: bool) -> bool:
        """Whether a server at ``address`` with ``node`` is one this cluster forgot:
        its node is listed, or its address is with no node known and it still
        believes itself a member (a new disk at that address does not)."""
        for host, gone in self.forgotten:
            if node and gone == node:
                return True
            if gone == ANY_NODE and host == address and claims_membership:
                return True
        return False

    def admitted(self, host: str, node: str, term: int) -> KnownHosts:
        """The set with ``host`` added (a join the root admits)."""
        if not host:
            raise MembershipError("a joining server must name its address")
        if node and any(gone == node for _h, gone in self.forgotten):
            raise MembershipError(
                f"server {host} (node {node}) was forgotten by this cluster: remove its "
                "data directory to join again as a new server"
            )
        if host in self.hosts:
            raise MembershipError(f"{host} is a member already")
        nodes = {h: n for h, n in self.nodes if h != host}
        if node:
            nodes[host] = node
        return KnownHosts(
            self.version + 1,
            term,
            tuple(sorted({*self.hosts, host})),
            tuple(sorted({(h, n) for h, n in self.forgotten if h != host or n})),
            tuple(sorted(nodes.items())),
        )

    def without(self, host: str, node: str, term: int) -> KnownHosts:
        """The set with ``host`` forgotten (its node remembered, to refuse its return)."""
        if host not in self.hosts:
            raise MembershipError(f"{host} is not a member (members: {', '.join(self.hosts)})")
        if len(self.hosts) <= 1:
            raise MembershipError("the last member cannot be forgotten")
        node = node or self.node_of(host)
        return KnownHosts(
            self.version + 1,
            term,
            tuple(h for h in self.hosts if h != host),
            tuple(sorted({*self.forgotten, (host, node)})),
            tuple((h, n) for h, n in self.nodes if h != host),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "term": self.term,
            "hosts": list(self.hosts),
            "forgotten": [list(f) for f in self.forgotten],
            "nodes": [list(n) for n in self.nodes],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KnownHosts:
        """Read back what ``to_dict`` wrote (a state-log entry or the file); raises
        ``MembershipError`` on anything malformed."""
        try:
            version, term = data["version"], data.get("term", 0)
            hosts = data["hosts"]
            forgotten = data.get("forgotten") or ()
            nodes = data.get("nodes") or ()
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (version, term)):
                raise TypeError("version and term must be integers")
            if version < 0 or term < 0:
                raise ValueError("version and term cannot be negative")
            if not all(isinstance(v, list | tuple) for v in (hosts, forgotten, nodes)):
                raise TypeError("hosts, forgotten and nodes must be lists")
            host_list = [_text(h) for h in hosts]
            if not host_list and version:
                raise ValueError("a set without members")
            pairs = [tuple(_text(x) for x in pair) for pair in forgotten]
            node_pairs = [tuple(_text(x) for x in pair) for pair in nodes]
            if any(len(p) != 2 for p in [*pairs, *node_pairs]):
                raise ValueError("forgotten servers and nodes are [address, node] pairs")
        except (KeyError, TypeError, ValueError) as exc:
            raise MembershipError(f"malformed cluster members: {exc}") from None
        return cls(
            version,
            term,
            tuple(sorted(set(host_list))),
            tuple(sorted(set(pairs))),  # type: ignore[arg-type]
            tuple(sorted(set(node_pairs))),  # type: ignore[arg-type]
        )


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def committed(current: Collection[str], holding: Collection[str]) -> bool:
    """Whether a majority of the ``current`` set's hosts hold it (``holding``: the
    hosts known to have applied it, the root's own included): only then may the
    root order the next change, so that every two sets one change apart share a
    majority member."""
    return 2 * len(set(current) & set(holding)) > len(set(current))


# -- this server's copy on disk -------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """What ``DATA_DIR/cluster-members.json`` keeps: this data directory's node id,
    and the last set applied here (None: never changed from the file's)."""

    node: str
    known: KnownHosts | None = None


def load(data_dir: Path) -> Stored:
    """This data directory's node and set; a new node id for a new directory. A
    file that cannot be read is an error: guessing could rejoin a forgotten server."""
    path = data_dir / MEMBERS_FILE
    try:
        raw = path.read_text()
    except FileNotFoundError:
        stored = Stored(secrets.token_hex(8))
        save(data_dir, stored)
        return stored
    try:
        data = json.loads(raw)
        node = _text(data["node"])
        known = KnownHosts.from_dict(data["known"]) if data.get("known") else None
    except (ValueError, KeyError, TypeError, MembershipError) as exc:
        raise MembershipError(f"{path} is damaged: {exc}") from None
    return Stored(node, known)


def save(data_dir: Path, stored: Stored) -> None:
    """Written whole and renamed into place: a crash leaves the old or the new."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / MEMBERS_FILE
    tmp = path.with_suffix(".tmp")
    body = {"node": stored.node, "known": stored.known.to_dict() if stored.known else None}
    with open(tmp, "w") as fh:
        json.dump(body, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def with_known(stored: Stored, known: KnownHosts) -> Stored:
    return replace(stored, known=known)


__all__ = [
    "ANY_NODE",
    "KnownHosts",
    "MembershipError",
    "Stored",
    "committed",
    "load",
    "save",
]
