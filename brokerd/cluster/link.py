"""An outgoing cluster link: an aio-pika connection to one known host or peer.

The link logs in with the cluster user and secret on the cluster vhost and
tells the peer who we are in its client properties; the peer's spid comes
back in the server properties. It reconnects with capped exponential
backoff until stopped, and reports refusals (wrong secret, checksum
mismatch) to its owner so both can raise an alarm.

Everything sent on a link goes through one queue and one sender task
(``post``), so messages arrive in the order they were posted: a delivery is
never overtaken by the ack of a later one, nor a wiring entry by the next.
A message posted while the link is down is dropped (the planes above treat a
link that went down as a lost session).

``refused`` records whether the latest attempt to connect was refused
(ECONNREFUSED: nothing listens on the peer's port). Membership uses it, with
the links' own state, to tell a peer whose process is gone from one that is
merely silent (see ``Membership.check_gone``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import random
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import aio_pika
import aiormq

from brokerd.cluster.messages import CLUSTER_EXCHANGE, LINK_PROPERTY

log = logging.getLogger("brokerd.cluster.link")

BACKOFF_MIN = 0.2
BACKOFF_MAX = 5.0
#: after a connection attempt was reset or cut short: ask again this soon, a few times
#: (a process being killed still holds its listening socket for a moment; asked again
#: a little later, its port refuses, which is what tells the peer is gone)
QUICK_RETRY = 0.02
QUICK_RETRIES = 5
#: every link message carries the same properties (a message id saves aiormq making one)
_PROPERTIES = aiormq.spec.Basic.Properties(delivery_mode=1, message_id="rookery-link")


class Link:
    """One outgoing link; ``on_up(link)`` / ``on_down(link, reason)`` report its state."""

    def __init__(
        self,
        address: str,
        *,
        user: str,
        secret: str,
        vhost: str,
        identity: Callable[[], dict[str, Any]],
        on_up: Callable[[Link], None],
        on_down: Callable[[Link, str], None],
        connect_timeout: float = 3.0,
    ) -> None:
        self.address = address
        credentials = f"{quote(user, safe='')}:{quote(secret, safe='')}"
        self.url = f"amqp://{credentials}@{address}/{quote(vhost, safe='')}"
        self.identity = identity
        self.on_up = on_up
        self.on_down = on_down
        self.connect_timeout = connect_timeout
        self.peer_spid: str | None = None
        self.server_properties: dict[str, Any] = {}
        self.state = "connecting"
        self.last_error = ""
        #: the latest connection attempt was refused: nothing listens at ``address``
        self.refused = False
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._exchange: aio_pika.abc.AbstractExchange | None = None
        self._amqp: aiormq.abc.AbstractChannel | None = None
        #: posted messages not yet written, oldest first, and their total size
        self._outbox: deque[tuple[str, bytes]] = deque()
        self.backlog = 0
        self._ready = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._wake = asyncio.Event()
        self._stopped = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        self._stopped = True
        self._closed.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._close_connection()

    def retry_now(self) -> None:
        """Cut the backoff short (the peer just linked to us, so it is up)."""
        self._wake.set()

    @property
    def up(self) -> bool:
        return self.state == "up"

    @property
    def pending(self) -> bool:
        """Posted messages wait to be written."""
        return bool(self._outbox) and self.up

    async def send(self, kind: str, body: bytes) -> bool:
        """Post one message and wait until it is written; False if the link is not up."""
        if not self.post(kind, body):
            return False
        while self._outbox and self.up:
            await asyncio.sleep(0.001)
        return self.up

    def post(self, kind: str, body: bytes, urgent: bool = False) -> bool:
        """Queue one message for the sender task; False (dropped) if the link is not up.
        ``urgent``: ahead of everything waiting (a message no other depends on the order
        of, such as a replica's cumulative ack, which must not wait behind a backlog
        of forwards)."""
        if not self.up or self._exchange is None:
            return False
        if urgent:
            self._outbox.appendleft((kind, body))
        else:
            self._outbox.append((kind, body))
        self.backlog += len(body)
        self._ready.set()
        return True

    async def _send_loop(self, channel: aiormq.abc.AbstractChannel) -> None:
        """Write posted messages in order while the connection lasts; each waits until
        the transport took it, so a slow peer shows as ``backlog`` here."""
        outbox = self._outbox
        while True:
            await self._ready.wait()
            self._ready.clear()
            while outbox:
                kind, body = outbox.popleft()
                self.backlog -= len(body)
                try:
                    await channel.basic_publish(
                        body, exchange=CLUSTER_EXCHANGE, routing_key=kind, properties=_PROPERTIES
                    )
                except Exception as exc:  # the connection went away under us
                    self._lost(f"send failed: {exc}")
                    return

    async def _run(self) -> None:
        backoff = BACKOFF_MIN
        quick = 0
        while not self._stopped:
            self._closed.clear()
            try:
                await self._connect()
            except Exception as exc:
                self.refused = is_refused(exc)
                reason = describe_error(exc)
                if reason != self.last_error or self.state != "retrying":
                    log.info("link down address=%s reason=%s", self.address, reason)
                self.last_error = reason
                self.state = "retrying"
                self.on_down(self, reason)
                self._wake.clear()
                if is_reset(exc) and quick < QUICK_RETRIES:
                    quick += 1
                    pause = QUICK_RETRY
                else:
                    pause = backoff
                    backoff = min(backoff * 2, BACKOFF_MAX)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wake.wait(), timeout=pause * random.uniform(0.8, 1.2)
                    )
                continue
            backoff = BACKOFF_MIN
            quick = 0
            self.refused = False
            self.state = "up"
            self.last_error = ""
            assert self._amqp is not None
            self._sender = asyncio.get_running_loop().create_task(self._send_loop(self._amqp))
            self.on_up(self)
            await self._closed.wait()
            await self._close_connection()

    async def _connect(self) -> None:
        # aio_pika.connect() folds client_properties into the URL query, which
        # cannot carry a table; handed to the connection's kwargs they reach
        # aiormq.connect() intact
        connection = aio_pika.Connection(self.url)
        connection.kwargs["client_properties"] = {
            LINK_PROPERTY: self.identity(),
            "connection_name": "rookery-link",
        }
        await connection.connect(timeout=self.connect_timeout)
        try:
            underlay = connection.transport.connection  # type: ignore[union-attr]
            self.server_properties = dict(underlay.server_properties or {})
            self.peer_spid = str(self.server_properties.get("spid") or "") or None
            # no publisher confirms: the planes settle their own messages, and a
            # confirm round trip per message would cap the link's throughput
            channel = await connection.channel(publisher_confirms=False)
            self._exchange = await channel.get_exchange(CLUSTER_EXCHANGE, ensure=False)
            self._amqp = await channel.get_underlay_channel()
        except Exception:
            await connection.close()
            raise
        connection.close_callbacks.add(lambda *_: self._lost("connection closed"))
        self._connection = connection

    def _lost(self, reason: str) -> None:
        if self.state == "up":
            log.info("link lost address=%s peer=%s reason=%s", self.address, self.peer_spid, reason)
            self.state = "retrying"
            self.last_error = reason
            self._exchange = None
            self._amqp = None
            self._outbox.clear()
            self.backlog = 0
            self.on_down(self, reason)
        self._closed.set()

    def drop(self, reason: str) -> None:
        """Close the current connection (a duplicate, ourselves, a cut); it may reconnect."""
        self._lost(reason)

    async def _close_connection(self) -> None:
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
        connection, self._connection = self._connection, None
        self._exchange = None
        self._amqp = None
        self._outbox.clear()
        self.backlog = 0
        if connection is not None and not connection.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), timeout=2.0)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and its causes (aiormq and aio-pika wrap the OSError)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_refused(exc: BaseException) -> bool:
    """The connection attempt met ECONNREFUSED (a host name with several addresses
    that failed differently is not counted)."""
    return any(
        isinstance(e, ConnectionRefusedError)
        or (isinstance(e, OSError) and e.errno == errno.ECONNREFUSED)
        for e in _chain(exc)
    )


def is_reset(exc: BaseException) -> bool:
    """The connection was accepted, then reset or closed during the handshake: what
    a process being killed does while its listening socket lingers."""
    return any(
        isinstance(e, ConnectionResetError | BrokenPipeError | asyncio.IncompleteReadError)
        for e in _chain(exc)
    )


def describe_error(exc: BaseException) -> str:
    """A one-line reason for a failed link, keeping the broker's AMQP reply text."""
    if isinstance(exc, aiormq.exceptions.ProbableAuthenticationError):
        return "authentication refused (wrong cluster secret?)"
    if isinstance(exc, aiormq.exceptions.ConnectionClosed):
        return "closed by peer: " + " ".join(str(a) for a in exc.args[:2])
    if isinstance(exc, aiormq.exceptions.AMQPError) and exc.args:
        return " ".join(str(a) for a in exc.args)
    if isinstance(exc, OSError | asyncio.TimeoutError):
        return f"unreachable: {exc.__class__.__name__} {exc}".strip()
    return f"{exc.__class__.__name__}: {exc}"
