"""The asyncio shell of one shovel: two connections, the transfer between them.

A session connects the source and the destination (each a ``ClientConnection``
over a socket), declares what the definition names, consumes with the
window, and hands every delivery and confirm to the ``Transfer``, which says
what to publish and what to acknowledge. Backpressure is the sockets': after
writing to the destination the source is read again only once the
destination's socket has drained, so a slow destination slows the source
down instead of filling a buffer.

When a session ends (a connection lost, refused, closed by a broker) what was
in flight goes back to the source broker, and the runner waits
``reconnect-delay``, doubling it per failure up to ``RECONNECT_MAX`` with
±20 % jitter, so a fleet of bridges does not reconnect in step after a WAN
cut. ``reconnect-delay`` 0 means what it means in RabbitMQ: no restart.

States (``status``): ``starting`` (connecting, or waiting to reconnect: the
reason says why), ``running``, ``blocked`` (the destination blocked our
publishes, flow control), ``terminated`` (refused credentials or
certificate, a missing queue or exchange, a precondition: the broker's own
reason; retried at the backoff, since an operator may fix the far side).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pamqp import commands

from brokerd.bridges.client import (
    Blocked,
    ChannelClosed,
    ClientConnection,
    Confirmed,
    ConnectionClosed,
    ConsumerCancelled,
    Delivered,
    Opened,
    ProtocolError,
    Reply,
    Unblocked,
)
from brokerd.bridges.definitions import NO_ACK, ON_CONFIRM, ShovelDefinition
from brokerd.bridges.transfer import Ack, Cancel, Delivery, Nack, Publish, Transfer
from brokerd.bridges.uri import AmqpUri

log = logging.getLogger("brokerd.bridges")

STARTING = "starting"
RUNNING = "running"
BLOCKED = "blocked"
TERMINATED = "terminated"

#: the longest wait between attempts, however many failed (seconds)
RECONNECT_MAX = 60.0
JITTER = 0.2
READ_SIZE = 256 * 1024
CONSUMER_TAG = "rookery-shovel"
#: seconds between looks at the source queue's depth (the bridge's backlog)
BACKLOG_EVERY = 5.0
#: reply codes after which retrying at once is pointless, the far side must change:
#: ACCESS_REFUSED, NOT_FOUND, RESOURCE_LOCKED, PRECONDITION_FAILED
REFUSALS = frozenset({403, 404, 405, 406})


class SessionEnded(Exception):
    """A session is over; ``terminal``: the far side refused (see ``REFUSALS``)."""

    def __init__(self, reason: str, terminal: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.terminal = terminal


@dataclass(frozen=True)
class LocalBroker:
    """Where ``amqp://`` (no host) leads: this broker's own listener and a login."""

    host: str
    port: int
    username: str
    password: str


class Side:
    """One end's connection: a socket and the sans-IO client on it."""

    def __init__(self, name: str, uri: AmqpUri, local: LocalBroker | None, node: str) -> None:
        self.name = name
        self.uri = uri
        if uri.local:
            if local is None:
                raise SessionEnded(f"{name}: amqp:// means this broker, which has no local login")
            host, port, user, password = local.host, local.port, local.username, local.password
            mechanism = "plain"
        else:
            host, port, user, password = uri.host, uri.port, uri.username, uri.password
            mechanism = uri.mechanism
        self.address = (host, port)
        self.conn = ClientConnection(
            vhost=uri.vhost,
            username=user,
            password=password,
            mechanism=mechanism,
            heartbeat=uri.heartbeat if uri.heartbeat is not None else 30,
            client_properties={"connection_name": f"shovel {node} {name}"},
        )
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.heard = time.monotonic()
        self.pending: list[Any] = []
        #: the broker's, from connection.start (a federation link reads its cluster_name)
        self.server_properties: dict[str, Any] = {}

    async def connect(self) -> None:
        uri = self.uri
        context = _tls_context(uri) if uri.tls and not uri.local else None
        try:
            self.reader, self.writer = await asyncio.wait_for(
                asyncio.open_connection(
                    *self.address,
                    ssl=context,
                    server_hostname=uri.server_name if context is not None else None,
                ),
                uri.connection_timeout,
            )
        except ssl.SSLCertVerificationError as exc:
            raise SessionEnded(
                f"{self.name}: certificate refused: {exc.verify_message}", True
            ) from None
        except ssl.SSLError as exc:
            raise SessionEnded(f"{self.name}: TLS failed: {exc.reason or exc}", True) from None
        except (OSError, TimeoutError) as exc:
            where = f"{self.address[0]}:{self.address[1]}"
            raise SessionEnded(f"{self.name}: cannot connect to {where}: {_why(exc)}") from None
        self.flush()
        opened = await self.until(Opened)
        assert isinstance(opened, Opened)
        self.server_properties = opened.server_properties
        self.conn.open_channel()
        await self.call(Reply)

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.writer is not None:
            self.writer.write(data)

    async def read(self) -> list[Any]:
        """The next events from the socket (raises ``SessionEnded`` when it ends)."""
        assert self.reader is not None
        try:
            data = await self.reader.read(READ_SIZE)
        except (OSError, ssl.SSLError) as exc:
            raise SessionEnded(f"{self.name}: connection lost: {_why(exc)}") from None
        if not data:
            raise SessionEnded(f"{self.name}: connection closed by the broker")
        self.heard = time.monotonic()
        try:
            events = self.conn.receive(data)
        except ProtocolError as exc:
            raise SessionEnded(f"{self.name}: protocol error: {exc}") from None
        self.flush()
        for event in events:
            if isinstance(event, ConnectionClosed | ChannelClosed):
                raise SessionEnded(
                    f"{self.name}: {event.code} {event.text}", event.code in REFUSALS
                )
        return events

    async def until(self, kind: type) -> Any:
        """Read until an event of ``kind`` (the handshake and set-up steps, one at a
        time); other events stay pending, in order, for the pump."""
        scanned = 0
        while True:
            for index in range(scanned, len(self.pending)):
                if isinstance(self.pending[index], kind):
                    return self.pending.pop(index)
            scanned = len(self.pending)
            self.pending += await self.read()

    async def call(self, kind: type = Reply) -> Any:
        self.flush()
        return await self.until(kind)

    def close(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
                self.flush()
            self.writer.close()
            self.writer = None


def _why(exc: BaseException) -> str:
    return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc) or type(exc).__name__


def _tls_context(uri: AmqpUri) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=uri.option("cacertfile"))
    certfile = uri.option("certfile")
    if certfile:
        context.load_cert_chain(certfile, uri.option("keyfile"))
    if not uri.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif uri.server_name is None:
        context.check_hostname = False
    return context


class ShovelRunner:
    """One shovel, run until stopped (or, with ``src-delete-after``, done)."""

    def __init__(
        self,
        definition: ShovelDefinition,
        *,
        node: str,
        local: LocalBroker | None = None,
        on_done: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.definition = definition
        self.node = node
        self.local = local
        self.on_done = on_done
        self.transfer = Transfer(definition, node, clock)
        self.state = STARTING
        self.reason = "not started yet"
        self.since = time.time()
        #: since when it has not been running (None: it runs): the bridge-down alarm
        self.down_since: float | None = self.since
        self.failures = 0
        self.sessions = 0
        self.source: Side | None = None
        self.destination: Side | None = None
        self._stopped = asyncio.Event()
        self._queue_length_read = False
        #: the source queue's depth when last asked (None: not known yet)
        self.backlog: int | None = None
        self._source_queue: str | None = None
        #: the source queue's depth at the first session (``src-delete-after`` queue-length)
        self._queue_length: int | None = None

    # -- what the server and the console see ---------------------------------------------------

    def status(self) -> dict[str, Any]:
        definition = self.definition
        transfer = self.transfer
        return {
            "name": definition.name,
            "vhost": definition.vhost,
            "type": "dynamic",
            "state": self.state,
            "reason": self.reason,
            "since": self.since,
            "node": self.node,
            "src_uri": self.source.uri.redacted if self.source else definition.source.redacted[0],
            "dest_uri": (
                self.destination.uri.redacted
                if self.destination
                else definition.destination.redacted[0]
            ),
            "forwarded": transfer.forwarded,
            "acknowledged": transfer.acknowledged,
            "requeued": transfer.requeued,
            "in_flight": transfer.in_flight,
            "backlog": self.backlog,
            "remaining": transfer.remaining,
            "sessions": self.sessions,
        }

    def _set(self, state: str, reason: str) -> None:
        if (state, reason) != (self.state, self.reason):
            level = logging.WARNING if state in (TERMINATED, BLOCKED) else logging.INFO
            log.log(level, "shovel=%s state=%s reason=%s", self.definition.name, state, reason)
            self.state, self.reason, self.since = state, reason, time.time()
            if state == RUNNING:
                self.down_since = None
            elif self.down_since is None:
                self.down_since = self.since

    # -- the loop -------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopped.set()

    async def run(self) -> None:
        """Sessions until stopped, done, or (``reconnect-delay`` 0) the first failure."""
        while not self._stopped.is_set():
            try:
                await self._session()
            except SessionEnded as exc:
                self.failures += 1
                self._set(TERMINATED if exc.terminal else STARTING, exc.reason)
            except Exception as exc:  # a bug must not end the bridge for good, unseen
                log.exception("shovel=%s session failed", self.definition.name)
                self.failures += 1
                self._set(TERMINATED, f"internal error: {type(exc).__name__}: {exc}")
            finally:
                for side in (self.source, self.destination):
                    if side is not None:
                        side.close()
                self.transfer.reset()
            if self.transfer.done:
                self._set(TERMINATED, "src-delete-after reached: the shovel is done")
                if self.on_done is not None:
                    self.on_done(self.definition.name)
                return
            delay = self.definition.reconnect_delay
            if delay <= 0:
                if self.state != TERMINATED:
                    self._set(TERMINATED, f"{self.reason} (reconnect-delay 0: not restarted)")
                return
            backoff = min(RECONNECT_MAX, max(delay, delay * 2 ** max(0, self.failures - 1)))
            backoff *= 1 + random.uniform(-JITTER, JITTER)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), backoff)

    async def _session(self) -> None:
        definition = self.definition
        self._set(STARTING, "connecting")
        source = self.source = Side(
            "source", random.choice(definition.source.uris), self.local, self.node
        )
        destination = self.destination = Side(
            "destination", random.choice(definition.destination.uris), self.local, self.node
        )
        await source.connect()
        await destination.connect()
        queue = self._source_queue = await self._set_up_source(source)
        await self._set_up_destination(destination)
        mode = definition.ack_mode
        if mode == ON_CONFIRM:
            destination.conn.confirm_select()
            await destination.call()
        self._act(self.transfer.start(self._queue_length))
        if self.transfer.finished_taking:
            return
        if mode != NO_ACK:
            source.conn.qos(self.transfer.prefetch)
            await source.call()
        await self._consume(source, queue)
        self.sessions += 1
        self.failures = 0
        self._set(RUNNING, "")
        await self._pump(source, destination)

    async def _consume(self, source: Side, queue: str) -> None:
        """Start consuming ``queue`` at the source (a federated queue's link waits
        for demand instead)."""
        definition = self.definition
        consumer_args = definition.consumer_args or None
        no_ack = definition.ack_mode == NO_ACK
        source.conn.consume(queue, CONSUMER_TAG, no_ack=no_ack, arguments=consumer_args)
        await source.call()

    async def _set_up_source(self, side: Side) -> str:
        """The queue to consume from (declared if missing, as RabbitMQ's shovels do),
        or a private queue bound to the source exchange."""
        endpoint = self.definition.source
        conn = side.conn
        if endpoint.queue is not None:
            declared = await self._queue(side, endpoint.queue, endpoint.queue_args)
            self.backlog = int(declared.message_count)
            if not self._queue_length_read:
                self._queue_length = declared.message_count
                self._queue_length_read = True
            return endpoint.queue
        conn.declare_queue("", durable=False, exclusive=True, auto_delete=True)
        declared = (await side.call()).method
        assert endpoint.exchange is not None
        conn.bind_queue(declared.queue, endpoint.exchange, endpoint.exchange_key or "#")
        await side.call()
        return str(declared.queue)

    async def _set_up_destination(self, side: Side) -> None:
        endpoint = self.definition.destination
        if endpoint.queue is not None:
            await self._queue(side, endpoint.queue, endpoint.queue_args)
        elif endpoint.exchange:
            side.conn.declare_exchange_passive(endpoint.exchange)
            await side.call()

    async def _queue(self, side: Side, name: str, args: dict[str, Any] | None) -> Any:
        """Declare ``name`` passively; if it does not exist, declare it durable with
        ``args`` on a new channel (a 404 closes the channel it came on)."""
        if args is None:
            side.conn.declare_queue(name, passive=True)
            try:
                return (await side.call()).method
            except SessionEnded as exc:
                if not exc.reason.split(": ", 1)[-1].startswith("404"):
                    raise
            side.conn.open_channel()
            await side.call()
        side.conn.declare_queue(name, durable=True, arguments=args)
        return (await side.call()).method

    def _act(self, actions: list[Any]) -> None:
        assert self.source is not None and self.destination is not None
        src, dest = self.source.conn, self.destination.conn
        for action in actions:
            if isinstance(action, Publish):
                dest.publish(action.exchange, action.routing_key, action.properties, action.body)
            elif isinstance(action, Ack):
                src.ack(action.tag, action.multiple)
            elif isinstance(action, Nack):
                src.nack(action.tag, requeue=action.requeue)
            elif isinstance(action, Cancel):
                src.cancel(CONSUMER_TAG)

    async def _pump(self, source: Side, destination: Side) -> None:
        """Both directions until the session ends; heartbeats on both."""
        tasks = [
            asyncio.ensure_future(self._from_source(source, destination)),
            asyncio.ensure_future(self._from_destination(source, destination)),
            asyncio.ensure_future(self._heartbeats(source, destination)),
            asyncio.ensure_future(self._stopped.wait()),
            asyncio.ensure_future(self._watch_backlog(source)),
            *(asyncio.ensure_future(c) for c in self._alongside(source, destination)),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.transfer.done:
            return
        if self._stopped.is_set():
            raise SessionEnded("stopped")

    async def _watch_backlog(self, source: Side) -> None:
        """Ask the source queue's depth now and then (a passive declare: its reply
        comes back among the deliveries, ``_from_source`` reads it)."""
        while True:
            await asyncio.sleep(BACKLOG_EVERY)
            if self._source_queue is not None:
                source.conn.declare_queue(self._source_queue, passive=True)
                source.flush()

    def _alongside(self, source: Side, destination: Side) -> list[Any]:
        """More coroutines to run for the session (a federation link's binding and
        demand watchers); one that raises ends the session."""
        return []

    async def _from_source(self, source: Side, destination: Side) -> None:
        transfer = self.transfer
        events = source.pending
        source.pending = []
        while True:
            for event in events:
                if isinstance(event, Delivered):
                    delivery = Delivery(
                        event.tag,
                        event.exchange,
                        event.routing_key,
                        event.body,
                        event.properties,
                        event.redelivered,
                    )
                    self._act(transfer.delivered(delivery))
                elif isinstance(event, Reply) and isinstance(
                    event.method, commands.Queue.DeclareOk
                ):
                    self.backlog = int(event.method.message_count)
                elif isinstance(event, ConsumerCancelled):
                    raise SessionEnded("source: the broker cancelled the consumer (queue deleted?)")
            destination.flush()
            source.flush()
            if transfer.done:
                return
            if destination.writer is not None:
                try:
                    await destination.writer.drain()  # backpressure: the source waits
                except (OSError, ssl.SSLError) as exc:
                    raise SessionEnded(f"destination: connection lost: {_why(exc)}") from None
            events = await source.read()

    async def _from_destination(self, source: Side, destination: Side) -> None:
        transfer = self.transfer
        events = destination.pending
        destination.pending = []
        while True:
            for event in events:
                if isinstance(event, Confirmed):
                    self._act(transfer.confirmed(event.tag, event.multiple, event.ok))
                elif isinstance(event, Blocked):
                    self._set(BLOCKED, f"destination blocked publishes: {event.reason}")
                elif isinstance(event, Unblocked):
                    self._set(RUNNING, "")
            source.flush()
            if transfer.done:
                return
            events = await destination.read()

    async def _heartbeats(self, source: Side, destination: Side) -> None:
        while True:
            beats = [s.conn.heartbeat for s in (source, destination) if s.conn.heartbeat]
            if not beats:
                await asyncio.sleep(3600)
                continue
            await asyncio.sleep(min(beats) / 2)
            now = time.monotonic()
            for side in (source, destination):
                if not side.conn.heartbeat:
                    continue
                if now - side.heard > 2 * side.conn.heartbeat:
                    raise SessionEnded(f"{side.name}: missed heartbeats from the broker")
                side.conn.heartbeat_frame()
                side.flush()
