"""Operators' queue moves and rebalances on one server: what ``brokerd ctl queue move``,
``brokerd ctl queues rebalance`` and the console's ``queue.move`` and
``queues.rebalance`` run (the cluster side is ``brokerd.cluster.ownership.moves``).

The console's commands are answered once the move is asked for (its
snapshots show the new owner); ``ctl`` waits for the move to end and says
how long the hand-over took, or why it was refused or called off.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from brokerd.cluster.ownership.moves import MOVE_TIMEOUT, MoveRefused

if TYPE_CHECKING:
    from brokerd.cluster.controller import ClusterController
    from brokerd.model.errors import AMQPError

#: how often ctl looks whether a move it asked for has ended, in seconds
POLL = 0.01


class QueueOpError(Exception):
    """A move or rebalance refused; the message says why."""


def _cluster(cluster: ClusterController | None, vhost: str | None) -> ClusterController:
    if cluster is None:
        raise QueueOpError("queue moves need a clustered broker (started with --cluster)")
    shared = cluster.config.vhost
    if vhost is not None and vhost != shared:
        raise QueueOpError(
            f"vhost '{vhost}' is this server's own: only the cluster vhost '{shared}' "
            "has shared queues, with owners to move"
        )
    return cluster


def request_move(
    cluster: ClusterController | None, vhost: str | None, name: str, to: str
) -> dict[str, str]:
    """Ask for the move (the console's command): refused at once on what this server
    knows, else asked of the root."""
    moves = _cluster(cluster, vhost).moves
    try:
        return moves.move(name, to)
    except MoveRefused as exc:
        raise QueueOpError(exc.text) from None


def rebalance(cluster: ClusterController | None, vhost: str | None) -> dict[str, Any]:
    """Ask for the moves that spread the owners evenly over the live primaries."""
    return {"moves": _cluster(cluster, vhost).moves.rebalance()}


async def move_and_wait(
    cluster: ClusterController | None, vhost: str | None, name: str, to: str
) -> dict[str, Any]:
    """Ask for the move and wait for it to end (``brokerd ctl queue move``): the queue's
    owner after it, and the milliseconds from the request to the placement here."""
    cluster = _cluster(cluster, vhost)
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[AMQPError | None] = loop.create_future()

    def done(error: AMQPError | None, _result: object) -> None:
        if not answered.done():
            answered.set_result(error)

    started = time.monotonic()
    try:
        asked = cluster.moves.move(name, to, done)
    except MoveRefused as exc:
        raise QueueOpError(exc.text) from None
    error = await asyncio.wait_for(answered, 3 * cluster.config.open_timeout)
    if error is not None:
        raise QueueOpError(error.text)
    queue = cluster.queues.shared_queue(name)
    deadline = started + MOVE_TIMEOUT + 2 * cluster.config.heartbeat_interval
    while queue is not None and queue.moving is not None and time.monotonic() < deadline:
        await asyncio.sleep(POLL)
        queue = cluster.queues.shared_queue(name)
    owner = queue.owner if queue is not None else None
    if owner != asked["to"]:
        raise QueueOpError(
            f"queue '{name}' did not move to {asked['to']}: "
            + ("it was deleted" if queue is None else f"its owner is {owner or 'none'}")
            + " (the server logs say why)"
        )
    return {**asked, "state": "moved", "ms": round((time.monotonic() - started) * 1000, 1)}
