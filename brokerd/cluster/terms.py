"""Root terms: one number per root that ever acted, ordering roots alike everywhere.

The election ranks the servers' state logs. A server's own memory of "the last
root" cannot do that: two servers can remember different last roots and each
prefer the other's log, every heartbeat, with no root for as long as nothing
changes (a partition into halves did this; ``tests/unit/test_election_livelock.py``).
Raft's answer is a term: a number every root acts under, that no other root
ever had, and that grows with each root. A log's place is then
(the term of the root it follows, its sequence number), and every server
compares two places the same way.

How a term is taken, with heartbeats instead of Raft's RPCs:

- a server the election makes root *claims* a term: its own if nobody it hears
  is past it, else one above every term it hears (``claim``);
- a server *backs* the candidate it votes for in the term that candidate
  claims, if that term is above its own, or is its own and it backs nobody else
  in it (``adopt``): it backs one server per term, and its term never falls;
- the root acts (its lease) only while a majority of the known primaries,
  itself included, back it in its term; so two servers never act in one term,
  and a root acting in a later term was backed by a majority of which one
  member applied whatever an earlier root had a majority apply, and voted only
  for a log at least as far along as its own (``election.choose``).

A follower recognises a root only if the root's term is not below its own, and
applies state entries only from the root whose term it synced in; a server's
term survives its restarts (``save``/``load``), or it could back two servers in
one term across a restart. ``tests/unit/test_terms.py`` drives claims,
adoptions, leases, entries and stale views in a hypothesis state machine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Term:
    """A server's term and whom it backs in it (None: nobody yet)."""

    number: int = 0
    backs: str | None = None

    def claimed_by(self, spid: str) -> bool:
        return self.backs == spid


def adopt(own: Term, vote: str | None, claimed: int | None) -> Term:
    """Back ``vote`` in the term it claims (``claimed``; None: it claims none): only
    above our term, or in our term while we back nobody else in it."""
    if vote is None or claimed is None:
        return own
    if claimed > own.number or (claimed == own.number and own.backs in (None, vote)):
        return Term(claimed, vote)
    return own


def claim(own: Term, me: str, heard: Iterable[Term], floor: int = 0) -> Term:
    """The term an elected server acts under: the one it claims already, unless a
    server it hears is past it or backs another in it; else one above every term
    it hears, its own, and ``floor`` (the term of the log it holds)."""
    heard = list(heard)
    if (
        own.claimed_by(me)
        and own.number >= floor
        and all(
            t.number < own.number or (t.number == own.number and t.backs in (None, me))
            for t in heard
        )
    ):
        return own
    top = max([own.number, floor, *(t.number for t in heard)])
    return Term(top + 1, me)


def load(path: Path | None) -> Term:
    """The term a server kept through its restart, and whom it backed in it: the
    sitting root, which a restart of this server does not make claim anew; or a
    spid that no longer runs (this server's own before the restart, say), so it
    backs nobody else in that term."""
    if path is None:
        return Term()
    try:
        data = json.loads(path.read_text())
        number, backs = int(data["term"]), data.get("backs")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return Term()
    if number <= 0 or not isinstance(backs, str):
        return Term()
    return Term(number, backs)


def save(path: Path | None, term: Term) -> None:
    """Keep the term on disk before it is announced (written whole, then renamed)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"term": term.number, "backs": term.backs}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
