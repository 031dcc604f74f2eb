"""The shared wiring a server holds, as the AMQP methods that would declare it.

A root that never followed another (the whole cluster restarted) seeds its
state log with what it recovered from disk (``WiringReplication.became_root``):
exchanges, shared queues, and the bindings between them, in an order a replay
can apply (declares before binds). Private queues and their meta-bindings stay
out: they are their servers' own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.model.exchange import Exchange

if TYPE_CHECKING:
    from brokerd.model.vhost import VirtualHost


def shared_wiring(vhost: VirtualHost) -> list[Method]:
    """Declares of the vhost's exchanges and shared queues, then their bindings."""
    methods: list[Method] = []
    for x in vhost.exchanges.values():
        if x.name and not x.name.startswith("amq."):
            methods.append(
                commands.Exchange.Declare(
                    exchange=x.name,
                    exchange_type=x.type_name,
                    durable=x.durable,
                    auto_delete=x.auto_delete,
                    internal=x.internal,
                    arguments=x.arguments or None,
                )
            )
    for q in vhost.queues.values():
        if not q.exclusive:
            methods.append(
                commands.Queue.Declare(
                    queue=q.name,
                    durable=q.durable,
                    auto_delete=q.auto_delete,
                    arguments=q.arguments or None,
                )
            )
    for x in vhost.exchanges.values():
        if not x.name:
            continue  # the default exchange's bindings are implicit
        for b in x.bindings.values():
            dest = b.destination
            if isinstance(dest, Exchange):
                methods.append(
                    commands.Exchange.Bind(
                        destination=dest.name,
                        source=x.name,
                        routing_key=b.routing_key,
                        arguments=b.arguments or None,
                    )
                )
            elif not getattr(dest, "exclusive", True):  # a shared queue (not a meta one)
                methods.append(
                    commands.Queue.Bind(
                        queue=dest.name,
                        exchange=x.name,
                        routing_key=b.routing_key,
                        arguments=b.arguments or None,
                    )
                )
    return methods
