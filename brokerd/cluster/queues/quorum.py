"""A quorum shared queue (RabbitMQ's ``rabbit_quorum_queue``): durable, its copies
kept by its group, ``x-quorum-initial-group-size`` primaries (default 3, at most
every primary) chosen by the root at declare (``ownership.rules.group_of``). Its
confirms and deliveries wait for a majority of the group (``replication.quorum``);
the other primaries get only the numbers of its events, so every stream stays
gapless. Otherwise it is a replicated queue."""

from __future__ import annotations

from brokerd.cluster.queues.replicated import ReplicatedQueue


class QuorumQueue(ReplicatedQueue):
    kind = "quorum"
