"""Quorum groups that follow the members (issue 43): ``brokerd ctl queues shrink
HOST``, as ``rabbitmq-queues shrink`` does, and a forgotten server leaving the
groups that name it.

A shrink takes one address out of one queue's group: asked of the root by any
server as a ``queue.group`` request, checked there (``check_shrink``) and
ordered as the queue's new group, which every server applies
(``SharedQueue.regroup``). The members that stay hold the queue already, so
the owner's confirms count over the smaller group at once, and never over
fewer than a majority of the old one: a group shrinks only from three members
up, and never off its owner (move the queue first, as RabbitMQ transfers
leadership first).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from brokerd.cluster.wiring import entries as rep
from brokerd.cluster.wiring import statelog as sl
from brokerd.model.errors import NOT_FOUND, PRECONDITION_FAILED, AMQPError, ChannelError

if TYPE_CHECKING:
    from brokerd.cluster.controller import ClusterController
    from brokerd.cluster.queues.shared import SharedQueue
    from brokerd.cluster.wiring.statelog import Entry

log = logging.getLogger("brokerd.cluster.ownership.groups")

SHRINK = "shrink"


def check_shrink(
    queue: SharedQueue | None, name: str, address: str, owner_address: str
) -> tuple[str, ...]:
    """The group queue ``name`` has without ``address``; raises ``AMQPError`` with the
    reason a shrink is refused."""
    if queue is None:
        raise ChannelError(NOT_FOUND, f"no shared queue '{name}'")
    group = queue.group
    if group is None:
        raise ChannelError(
            PRECONDITION_FAILED,
            f"queue '{name}' has no group of its own (classic, or kept by every primary)",
        )
    if address not in group:
        raise ChannelError(PRECONDITION_FAILED, f"{address} is not in queue '{name}''s group")
    if len(group) < 3:
        raise ChannelError(
            PRECONDITION_FAILED,
            f"queue '{name}' is kept by {len(group)} members: fewer would not be a "
            "majority of its group",
        )
    if owner_address == address:
        raise ChannelError(
            PRECONDITION_FAILED,
            f"queue '{name}' is owned at {address}: move it first (brokerd ctl queue move)",
        )
    if queue.moving is not None:
        raise ChannelError(PRECONDITION_FAILED, f"queue '{name}' is moving: try again")
    return tuple(a for a in group if a != address)


class GroupChanges:
    """The root's check of shrink requests, and any server's asking for them."""

    def __init__(self, host: ClusterController) -> None:
        self.host = host

    def _queue(self, name: str) -> SharedQueue | None:
        return next((q for q in self.host.queues.shared_queues() if q.name == name), None)

    def request(self, entry: Entry) -> Entry | AMQPError:
        """Root only: the ``queue.group`` entry a shrink request leads to, or why not."""
        props = dict(entry.props)
        address = str(props.get("address", ""))
        queue = self._queue(entry.name)
        owner = queue.owner if queue is not None else None
        owner_address = self.host.address_of(owner) if owner else ""
        try:
            group = check_shrink(queue, entry.name, address, owner_address)
        except AMQPError as exc:
            return exc
        log.warning("group of %s shrinks: %s leaves, %s stay", entry.name, address, group)
        return rep.group_entry(entry.vhost, entry.name, group)

    def naming(self, address: str) -> list[str]:
        """The shared queues whose group names ``address``, as this server knows them."""
        return sorted(
            q.name
            for q in self.host.queues.shared_queues()
            if q.group is not None and address in q.group
        )

    async def shrink(self, address: str, wait: float) -> dict[str, Any]:
        """``brokerd ctl queues shrink``: ask the root to take ``address`` out of every
        group that names it; each queue's answer (its new group, or the refusal)."""
        loop = asyncio.get_running_loop()
        answers: dict[str, asyncio.Future[Any]] = {}
        for name in self.naming(address):
            answer: asyncio.Future[Any] = loop.create_future()
            answers[name] = answer

            def done(error: Any, _result: Any, answer: asyncio.Future[Any] = answer) -> None:
                if not answer.done():
                    answer.set_result(error)

            entry = rep.shrink_request(self.host.config.vhost, name, address, self.host.spid)
            self.host.wiring.request(entry, done)
        rows = []
        for name, answer in answers.items():
            try:
                error = await asyncio.wait_for(answer, wait)
            except TimeoutError:
                error = "the root did not answer in time"
            queue = self._queue(name)
            rows.append(
                {
                    "queue": name,
                    "shrunk": error is None,
                    "group": list(queue.group or ()) if queue is not None else [],
                    "reason": getattr(error, "text", str(error)) if error is not None else "",
                }
            )
        return {"address": address, "queues": rows}

    def forgotten(self, address: str) -> None:
        """Root only: a forgotten server leaves every group that names it (those a
        shrink cannot leave, a group of two, keep it: they go on with the other)."""
        for name in self.naming(address):
            entry = rep.shrink_request(self.host.config.vhost, name, address, self.host.spid)
            placed = self.request(entry)
            if isinstance(placed, AMQPError):
                log.warning("group of %s keeps forgotten %s: %s", name, address, placed.text)
                continue
            self.host.wiring.order(placed)


def is_shrink(entry: Entry) -> bool:
    return entry.op == sl.QUEUE_GROUP and dict(entry.props).get("request") == SHRINK
