"""The asyncio shells of federation links: a shovel runner each, with what it
declares upstream and the watcher that keeps it in step with this broker
(``bridges.federation`` says what a link is).

- ``ExchangeLink`` mirrors the federated exchange's binding keys onto the
  upstream (checked every ``WATCH_INTERVAL``): a binding made here is made
  there, so only what some binding here wants crosses the link.
- ``QueueLink`` consumes the upstream's queue only while the queue here has
  consumers and nothing ready for them, and stops once a window's worth is
  ready or the consumers are gone: messages move to where they are consumed,
  never round in circles between two idle sites.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from brokerd.bridges.definitions import NO_ACK
from brokerd.bridges.federation import (
    EXCHANGE,
    UPSTREAM_TYPE,
    BindingKey,
    FederationTransfer,
    LinkSpec,
    binding_arguments,
    binding_changes,
)
from brokerd.bridges.runner import CONSUMER_TAG, LocalBroker, ShovelRunner, Side

#: seconds between looks at the bindings (exchange) or the queue's demand (queue)
WATCH_INTERVAL = 0.2


class FederationLink(ShovelRunner):
    """What both kinds share: the spec, the transfer, and the status row."""

    def __init__(self, spec: LinkSpec, *, node: str, local: LocalBroker | None) -> None:
        super().__init__(spec.shovel(), node=node, local=local)
        self.spec = spec
        self.transfer: FederationTransfer = FederationTransfer(spec, node)

    def status(self) -> dict[str, Any]:
        row = super().status()
        spec = self.spec
        row.update(
            {
                "type": "federation",
                "kind": spec.kind,
                "object": spec.name,
                "upstream": spec.upstream.name,
                "upstream_" + spec.kind: spec.source,
            }
        )
        return row

    def _connected(self, side: Side) -> None:
        """The upstream's name and URI for the ``x-received-from`` entries."""
        self.transfer.upstream_name = str(side.server_properties.get("cluster_name", ""))
        self.transfer.upstream_uri = side.uri


class ExchangeLink(FederationLink):
    """An exchange federated from one upstream."""

    def __init__(
        self,
        spec: LinkSpec,
        *,
        node: str,
        local: LocalBroker | None,
        keys: Callable[[], set[BindingKey]],
    ) -> None:
        super().__init__(spec, node=node, local=local)
        #: the binding keys the federated exchange has here now
        self.keys = keys
        #: those bound upstream in this session
        self.bound: set[BindingKey] = set()

    async def _set_up_source(self, side: Side) -> str:
        spec, conn = self.spec, side.conn
        self._connected(side)
        internal = spec.internal
        conn.declare_exchange_passive(spec.source)  # the upstream's must exist (404 else)
        await side.call()
        conn.declare_exchange(
            internal, UPSTREAM_TYPE, internal=True, arguments=spec.upstream_exchange_args()
        )
        await side.call()
        conn.declare_queue(internal, durable=True, arguments=spec.upstream_queue_args() or None)
        await side.call()
        conn.bind_queue(internal, internal, "")
        await side.call()
        self.bound = set()
        for key in sorted(self.keys()):
            conn.bind_exchange(internal, spec.source, key[0], binding_arguments(key))
            await side.call()
            self.bound.add(key)
        return internal

    def _alongside(self, source: Side, destination: Side) -> list[Any]:
        return [self._mirror_bindings(source)]

    async def _mirror_bindings(self, source: Side) -> None:
        """Bindings made or removed here, made or removed upstream (their replies come
        back among the deliveries and are passed over; a refusal closes the channel,
        and the next session binds afresh)."""
        spec, conn = self.spec, source.conn
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            add, remove = binding_changes(self.bound, self.keys())
            for key in add:
                conn.bind_exchange(spec.internal, spec.source, key[0], binding_arguments(key))
                self.bound.add(key)
            for key in remove:
                conn.unbind_exchange(spec.internal, spec.source, key[0], binding_arguments(key))
                self.bound.discard(key)
            if add or remove:
                source.flush()


class QueueLink(FederationLink):
    """A queue federated from one upstream: consumed there while there is demand here."""

    def __init__(
        self,
        spec: LinkSpec,
        *,
        node: str,
        local: LocalBroker | None,
        demand: Callable[[], tuple[int, int]],
    ) -> None:
        super().__init__(spec, node=node, local=local)
        #: (consumers, ready messages) of the queue here now
        self.demand = demand
        self.consuming: str | None = None
        self._tags = itertools.count(1)

    async def _set_up_source(self, side: Side) -> str:
        """The upstream's queue, declared durable if it does not exist (as RabbitMQ's
        queue links do)."""
        assert self.spec.kind != EXCHANGE
        self._connected(side)
        await self._queue(side, self.spec.source, None)
        return self.spec.source

    async def _consume(self, source: Side, queue: str) -> None:
        self.consuming = None  # a new session: the watcher decides

    def _alongside(self, source: Side, destination: Side) -> list[Any]:
        return [self._follow_demand(source)]

    def wants(self) -> bool:
        """Whether to consume upstream now (with hysteresis: start when consumers here
        have nothing ready, stop once a window is ready or none is left)."""
        consumers, ready = self.demand()
        if self.consuming is None:
            return consumers > 0 and ready == 0
        return consumers > 0 and ready < self.transfer.prefetch

    async def _follow_demand(self, source: Side) -> None:
        conn = source.conn
        no_ack = self.definition.ack_mode == NO_ACK
        while True:
            wanted = self.wants()
            if wanted and self.consuming is None:
                base = self.spec.upstream.consumer_tag or CONSUMER_TAG
                self.consuming = f"{base}-{next(self._tags)}"
                conn.consume(self.spec.source, self.consuming, no_ack=no_ack)
                source.flush()
            elif not wanted and self.consuming is not None:
                conn.cancel(self.consuming)
                self.consuming = None
                source.flush()
            await asyncio.sleep(WATCH_INTERVAL)
