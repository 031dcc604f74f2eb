"""Three primaries and a secondary by role, for the cluster tests that share one such
cluster per module: the root, the two other primaries ``a`` and ``b``, the secondary
``s``, and what those tests ask of them (a connection, a status, a queue's owner and
depth). ``settled`` makes the cluster and hands out its roles."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingConnection
from pika.exceptions import ChannelClosedByBroker

from tests.cluster_harness import Cluster


@dataclass
class Roles:
    cluster: Cluster
    root: int
    a: int
    b: int
    s: int

    @classmethod
    def of(cls, cluster: Cluster, root: int) -> Any:
        """The roles in ``cluster`` (its secondary, if any, at index 3)."""
        a, b = cluster.followers(root)
        return cls(cluster, root, a, b, 3)

    def port(self, index: int) -> int:
        return self.cluster.ports[index]

    @property
    def primaries(self) -> list[int]:
        return [self.root, self.a, self.b]

    @property
    def everyone(self) -> list[int]:
        return [self.root, self.a, self.b, self.s]

    def connect(self, index: int, **kwargs: object) -> BlockingConnection:
        params = pika.ConnectionParameters("127.0.0.1", self.cluster.ports[index], **kwargs)
        return BlockingConnection(params)

    def status(self, index: int) -> dict[str, Any]:
        return self.cluster.ctl(index, "status")

    def owner(self, queue: str) -> int | None:
        """The primary whose status lists ``queue`` as owned (None: none does)."""
        owners = [i for i in self.primaries if queue in self.status(i).get("owned_queues", [])]
        assert len(owners) <= 1, f"{queue} owned by {owners}"
        return owners[0] if owners else None

    def depth(self, index: int, queue: str) -> tuple[int, int]:
        """(messages, consumers) of a queue as a passive declare on ``index`` reports."""
        with self.connect(index) as conn:
            ok = conn.channel().queue_declare(queue, passive=True)
            return ok.method.message_count, ok.method.consumer_count

    def exists(self, index: int, queue: str) -> bool:
        """Does a passive declare on ``index`` find the queue (else a 404)?"""
        with self.connect(index) as conn:
            try:
                conn.channel().queue_declare(queue, passive=True)
            except ChannelClosedByBroker as exc:
                assert exc.reply_code == 404
                return False
            return True


@contextlib.contextmanager
def settled(base: Path, *, tls: bool = False) -> Iterator[Roles]:
    """Three primaries and a secondary (heartbeat 0.5 s, timeout 2.5 s) that agree on
    a root; described on a failure, stopped after."""
    cluster = Cluster(base, primaries=3, secondaries=1, interval=0.5, timeout=2.5, tls=tls)
    try:
        yield Roles.of(cluster, cluster.start_settled())
    except BaseException:
        print(cluster.describe())
        raise
    finally:
        cluster.close()
