"""This server's model against the root's state log: what a sync drops, which private
meta-bindings the root must be told again, and whether a wiring method would
change anything here (only those go to the root). Plain functions over the
model's vhost and a replayed ``statelog.Wiring``."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.cluster.wiring import statelog as sl
from brokerd.cluster.wiring.statelog import freeze
from brokerd.model.exchange import Exchange
from brokerd.model.muxers import Binding

if TYPE_CHECKING:
    from brokerd.model.vhost import VirtualHost

log = logging.getLogger("brokerd.cluster")


def reconcile(vhost: VirtualHost, wiring: sl.Wiring) -> None:
    """Drop local shared wiring (and meta-bindings) that the root's state lacks."""
    for queue in list(vhost.queues.values()):
        if not queue.exclusive and (vhost.name, queue.name) not in wiring.queues:
            log.info("sync drops queue=%s", queue.name)
            vhost.remove_queue(queue)
    for name in list(vhost.exchanges):
        if name and not name.startswith("amq.") and (vhost.name, name) not in wiring.exchanges:
            log.info("sync drops exchange=%s", name)
            vhost.delete_exchange(name)
    for exchange in list(vhost.exchanges.values()):
        for binding in list(exchange.bindings.values()):
            if not _known_binding(vhost.name, exchange, binding, wiring):
                vhost._drop_binding(binding)
    for name, dest in list(vhost.elsewhere.items()):
        spid = getattr(dest, "spid", "")
        if (vhost.name, "", name, name, freeze({}), spid) not in wiring.meta_bindings:
            del vhost.elsewhere[name]


def missing_meta_bindings(vhost: VirtualHost, wiring: sl.Wiring, spid: str) -> list[Method]:
    """The bindings of this server's private queues (``spid``'s) that the root's state
    has no meta-binding for (it withdrew them while this server was away)."""
    missing: list[Method] = []
    for queue in vhost.queues.values():
        if not queue.exclusive:
            continue
        implicit = [default_binding(commands.Queue.Bind, queue.name)]
        for method in implicit + [
            commands.Queue.Bind(
                queue=queue.name,
                exchange=binding.source.name,
                routing_key=binding.routing_key,
                arguments=binding.arguments,
            )
            for binding in queue.bindings.values()
        ]:
            key = (
                vhost.name,
                method.exchange,
                queue.name,
                method.routing_key,
                freeze(method.arguments or {}),
                spid,
            )
            if key not in wiring.meta_bindings:
                missing.append(method)
    return missing


def _known_binding(vhost: str, exchange: Exchange, binding: Binding, wiring: sl.Wiring) -> bool:
    """Is a local binding part of the replayed cluster state (or private to this server)?"""
    if not exchange.name:
        return True  # the default exchange's implicit bindings
    dest = binding.destination
    args = freeze(binding.arguments)
    if isinstance(dest, Exchange):
        key = (vhost, exchange.name, dest.name, binding.routing_key, args, "")
        return key in wiring.exchange_bindings
    spid = getattr(dest, "spid", None)
    if spid is not None:  # a stand-in for another server's private queue
        key = (vhost, exchange.name, dest.name, binding.routing_key, args, spid)
        return key in wiring.meta_bindings
    if getattr(dest, "exclusive", False):
        return True  # this server's private queue: its own binding
    key = (vhost, exchange.name, dest.name, binding.routing_key, args, "")
    return key in wiring.queue_bindings


def would_change(vhost: VirtualHost, m: Method) -> bool:
    """Whether a shared wiring method would alter this server's state: only those go
    to the root; the others (declaring what exists, with its equivalence checks;
    deleting what is not there) are answered here."""
    if isinstance(m, commands.Exchange.Declare):
        return m.exchange not in vhost.exchanges
    if isinstance(m, commands.Exchange.Delete):
        return m.exchange in vhost.exchanges
    if isinstance(m, commands.Queue.Declare):
        return not m.exclusive and m.queue not in vhost.queues
    queue = vhost.queues.get(getattr(m, "queue", "")) if hasattr(m, "queue") else None
    if isinstance(m, commands.Queue.Delete):
        return queue is not None and not queue.exclusive
    if isinstance(m, commands.Queue.Bind | commands.Queue.Unbind):
        source = vhost.exchanges.get(m.exchange)
        if queue is None or queue.exclusive or source is None:
            return False  # private (meta-bound after), or the error is answered here
        present = Binding(source, queue, m.routing_key, m.arguments or {}).key in source.bindings
        return present != isinstance(m, commands.Queue.Bind)
    if isinstance(m, commands.Exchange.Bind | commands.Exchange.Unbind):
        source = vhost.exchanges.get(m.source)
        destination = vhost.exchanges.get(m.destination)
        if source is None or destination is None:
            return False
        probe = Binding(source, destination, m.routing_key, m.arguments or {})
        return (probe.key in source.bindings) != isinstance(m, commands.Exchange.Bind)
    return False


def default_binding(kind: type[Any], queue: str) -> Any:
    """A private queue's implicit binding to the default exchange (by its name), as the
    meta-binding other servers turn into a stand-in the default exchange reaches."""
    return kind(queue=queue, exchange="", routing_key=queue, arguments={})
