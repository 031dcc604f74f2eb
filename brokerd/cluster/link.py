"""An outgoing cluster link: an aio-pika connection to one known host or peer.

The link logs in with the cluster user and secret on the cluster vhost and
tells the peer who we are in its client properties; the peer's spid comes
back in the server properties. It reconnects with capped exponential
backoff until stopped, and reports refusals (wrong secret, checksum
mismatch) to its owner so both can raise an alarm.

A link is two connections, a control lane and a data lane (``Lane``). A
message posted to a lane is written at once, as one publish on its connection
(``post``), so messages on a lane arrive in the order they were posted: a
delivery is never overtaken by the ack of a later one, nor a wiring entry by
the next. Statuses and root announcements go on the control lane and never
wait behind data (``docs/architecture.md``, "Flow control"). A message posted
while the link is down is dropped (the planes above treat a link that went
down as a lost session).

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
import math
import random
import ssl
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import aio_pika
import aiormq
from pamqp import commands

from brokerd.cluster.config import UNIX_SCHEME
from brokerd.cluster.messages import CLUSTER_EXCHANGE, CONTROL_KINDS, LINK_PROPERTY
from brokerd.cluster.probes import LaneProbe
from brokerd.wire.codec import content_parts, encode_properties, method_frame

log = logging.getLogger("brokerd.cluster.link")

BACKOFF_MIN = 0.2
#: a peer back from a restart is linked again within about this long: a secondary,
#: which no primary links to, has only its own retries to find a restarted owner of
#: the queues its clients use (the fault harness saw 4 s stalls at a 5 s cap); a
#: dead peer costs one refused connection a second, with jitter against storms
BACKOFF_MAX = 1.0
#: after a connection attempt was reset or cut short: ask again this soon, a few times
#: (a process being killed still holds its listening socket for a moment; asked again
#: a little later, its port refuses, which is what tells the peer is gone)
QUICK_RETRY = 0.02
QUICK_RETRIES = 5
#: every link message carries the same properties, encoded once
_PROPERTIES = encode_properties(
    commands.Basic.Properties(delivery_mode=1, message_id="rookery-link")
)
#: the names of a link's two connections (the ``lane`` of its identity)
CONTROL = "control"
DATA_LANE = "data"


class UnixTransport(aiormq.connection.TransportFactory):
    """aiormq's transport over a Unix socket: the links between the workers of one
    host. A socket file with nothing behind it, or none at all, is a refusal, as a
    closed TCP port is (membership reads that as the peer's process being gone)."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def create(
        self, url: Any, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        kwargs.pop("ssl_context_provider", None)
        try:
            return await asyncio.open_unix_connection(self.path, **kwargs)
        except FileNotFoundError:
            refused = ConnectionRefusedError(errno.ECONNREFUSED, f"no socket at {self.path}")
            raise aiormq.exceptions.AMQPConnectionError(*refused.args) from refused
        except OSError as exc:
            raise aiormq.exceptions.AMQPConnectionError(*exc.args) from exc


class LaneTransport(aiormq.connection.TransportFactory):
    """The transport aiormq would open (TCP, TLS or a Unix socket), keeping its
    writer for the lane: the lane writes its messages to it itself (``Lane.write``)."""

    def __init__(self, lane: Lane, inner: aiormq.connection.TransportFactory) -> None:
        self.lane = lane
        self.inner = inner

    async def create(
        self, url: Any, **kwargs: Any
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await self.inner.create(url, **kwargs)
        self.lane.writer = writer
        return reader, writer


class Lane:
    """One of a link's two connections.

    A message posted to a lane is written to its connection's transport at once,
    as the frames of one ``basic.publish``, so messages leave in the order they
    were posted, the moment they are posted. aiormq's own writer (a queue and a
    task, and a drain per publish) costs two or three loop turns a message, and
    under load a turn takes milliseconds: a publisher two servers away waited
    for its confirms behind them. aiormq still writes its own frames (heartbeats,
    the close) on the same transport, whole frames between ours. What the peer
    has not read yet waits in the transport's buffer, and shows as ``backlog``:
    a peer that reads slowly (or pauses our data lane: flow control) backs it up
    here and nowhere else."""

    __slots__ = ("amqp", "connection", "frame_max", "heads", "name", "sent", "writer")

    def __init__(self, name: str) -> None:
        self.name = name
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.amqp: aiormq.abc.AbstractChannel | None = None
        #: the connection's transport (kept by ``LaneTransport``) and its frame size
        self.writer: asyncio.StreamWriter | None = None
        self.frame_max = 0
        #: the ``basic.publish`` method frame for each kind of message, made once
        self.heads: dict[str, bytes] = {}
        #: bytes written since the link came up (for the dump and the metrics)
        self.sent = 0

    @property
    def backlog(self) -> int:
        """Bytes written and not yet taken by the socket."""
        writer = self.writer
        return 0 if writer is None else writer.transport.get_write_buffer_size()

    def opened(self, channel: aiormq.abc.AbstractChannel) -> None:
        self.amqp = channel
        self.frame_max = channel.connection.connection_tune.frame_max  # type: ignore[attr-defined]
        self.heads.clear()

    def write(self, kind: str, body: bytes) -> bool:
        """One message, written now; False if the connection is closing."""
        writer, channel = self.writer, self.amqp
        if writer is None or channel is None or writer.is_closing():
            return False
        head = self.heads.get(kind)
        if head is None:
            publish = commands.Basic.Publish(exchange=CLUSTER_EXCHANGE, routing_key=kind)
            head = self.heads[kind] = method_frame(channel.number, publish)
        writer.writelines([head, *content_parts(channel.number, _PROPERTIES, body, self.frame_max)])
        self.sent += len(body)
        return True

    def clear(self) -> None:
        self.amqp = None
        self.writer = None


def link_heartbeat(timeout: float) -> int:
    """The AMQP heartbeat a link's lanes ask for: twice the cluster's heartbeat
    timeout, whole seconds, at least 2. The peer closes a lane it has heard nothing
    on for two heartbeats, aiormq after three, so a half-open lane lasts seconds, not
    the default 60 s heartbeat's two minutes; a peer merely paused past its timeout
    is out of the view already (the statuses decide that, not the lanes)."""
    return max(2, math.ceil(2 * timeout))


class Link:
    """One outgoing link; ``on_up(link)`` / ``on_down(link, reason)`` report its state.

    A link is two AMQP connections to the peer: the *control* lane carries
    statuses, root announcements and replicas' acks, the *data* lane everything
    else (forwards, deliveries, the replication stream, wiring). Control never
    waits behind data on either side: not in our outbox, not in the kernel's
    socket buffers, not in the peer's reading (it reads each connection on its
    own, and pauses only the data lane to slow us down: flow control). The link
    is up while both connections are; losing either loses the link."""

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
        ssl_context: ssl.SSLContext | None = None,
        discovery: bool = False,
        heartbeat: int = 0,
    ) -> None:
        self.address = address
        #: only asks who answers (a host's port, which any of its workers may take):
        #: the control lane alone, as a second connection may reach another worker
        self.discovery = discovery
        credentials = f"{quote(user, safe='')}:{quote(secret, safe='')}"
        scheme = "amqps" if ssl_context is not None else "amqp"
        #: a sibling worker's link socket (None: a TCP address)
        self.socket_path = address[len(UNIX_SCHEME) :] if address.startswith(UNIX_SCHEME) else None
        # a Unix socket has no host or port for the URL to name: the transport ignores them
        where = "localhost" if self.socket_path is not None else address
        self.url = f"{scheme}://{credentials}@{where}/{quote(vhost, safe='')}"
        if heartbeat:
            # each lane's own liveness: a lane whose far end is gone without a FIN or
            # RST (a half-open connection) is closed by either side within a few
            # heartbeats, instead of carrying messages into nothing (link_heartbeat)
            self.url += f"?heartbeat={heartbeat}"
        #: links over mutual TLS: the cluster CA, and this server's certificate
        self.ssl_context = ssl_context
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
        self.control = Lane(CONTROL)
        self.data = Lane(DATA_LANE)
        #: does the data lane deliver, end to end (``probes.py``)
        self.probe = LaneProbe()
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
    def backlog(self) -> int:
        """Bytes written on the data lane that the peer has not read yet."""
        return self.data.backlog

    @property
    def pending(self) -> bool:
        """Written messages wait in a lane's transport for the peer to read them."""
        return bool(self.control.backlog or self.data.backlog) and self.up

    async def send(self, kind: str, body: bytes) -> bool:
        """Post one message and wait until the socket took it; False if the link is not up."""
        if not self.post(kind, body):
            return False
        lane = self._lane(kind, False)
        while lane.backlog and self.up:
            await asyncio.sleep(0.001)
        return self.up

    def _lane(self, kind: str, control: bool) -> Lane:
        return self.control if control or kind in CONTROL_KINDS else self.data

    def post(self, kind: str, body: bytes, control: bool = False) -> bool:
        """Write one message on its lane; False (dropped) if the link is not up.
        Statuses and root announcements take the control lane by their kind;
        ``control`` sends another message there (a replica's cumulative ack, which
        no other message depends on the order of, and the root waits for)."""
        if not self.up:
            return False
        lane = self._lane(kind, control)
        if lane.write(kind, body):
            return True
        self._lost(f"{lane.name} lane: its connection is closing")
        return False

    async def _run(self) -> None:
        backoff = BACKOFF_MIN
        quick = 0
        while not self._stopped:
            self._closed.clear()
            try:
                await self._connect()
            except Exception as exc:
                await self._close_connection()
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
            self.probe.restart()
            self.last_error = ""
            for lane in (self.control, self.data):
                lane.sent = 0
            self.on_up(self)
            await self._closed.wait()
            await self._close_connection()

    async def _connect(self) -> None:
        """Open the control lane, then the data lane (the peer learns who we are from
        the first; a peer that refuses us refuses it)."""
        for lane in (self.control,) if self.discovery else (self.control, self.data):
            await self._connect_lane(lane)

    async def _connect_lane(self, lane: Lane) -> None:
        # aio_pika.connect() folds client_properties into the URL query, which
        # cannot carry a table; handed to the connection's kwargs they reach
        # aiormq.connect() intact
        connection = aio_pika.Connection(self.url, ssl_context=self.ssl_context)
        inner: aiormq.connection.TransportFactory
        if self.socket_path is not None:
            inner = UnixTransport(self.socket_path)
        elif self.ssl_context is not None:
            inner = aiormq.connection.TLSTransportFactory()
        else:
            inner = aiormq.connection.TCPTransportFactory()
        lane.clear()
        connection.kwargs["transport_factory"] = LaneTransport(lane, inner)
        connection.kwargs["client_properties"] = {
            LINK_PROPERTY: {**self.identity(), "lane": lane.name},
            "connection_name": f"rookery-link-{lane.name}",
        }
        await connection.connect(timeout=self.connect_timeout)
        try:
            underlay = connection.transport.connection  # type: ignore[union-attr]
            if lane is self.control:
                self.server_properties = dict(underlay.server_properties or {})
                self.peer_spid = str(self.server_properties.get("spid") or "") or None
            elif str((underlay.server_properties or {}).get("spid") or "") != self.peer_spid:
                raise ConnectionError("the data lane reached another server than the control lane")
            # no publisher confirms: the planes settle their own messages, and a
            # confirm round trip per message would cap the link's throughput
            channel = await connection.channel(publisher_confirms=False)
            lane.opened(await channel.get_underlay_channel())
        except Exception:
            await connection.close()
            raise
        connection.close_callbacks.add(lambda *_: self._lost(f"{lane.name} lane closed"))
        lane.connection = connection

    def _lost(self, reason: str) -> None:
        if self.state == "up":
            log.info("link lost address=%s peer=%s reason=%s", self.address, self.peer_spid, reason)
            self.state = "retrying"
            self.last_error = reason
            for lane in (self.control, self.data):
                lane.clear()
            self.on_down(self, reason)
        self._closed.set()

    def drop(self, reason: str) -> None:
        """Close the current connections (a duplicate, ourselves, a cut); it may reconnect."""
        self._lost(reason)

    async def _close_connection(self) -> None:
        for lane in (self.control, self.data):
            connection, lane.connection = lane.connection, None
            lane.clear()
            if connection is not None and not connection.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), timeout=2.0)

    def describe(self) -> dict[str, Any]:
        """The link's lanes for the dump, ``ctl status`` and the metrics."""
        return {
            "state": self.state,
            "peer": self.peer_spid,
            "backlog": self.data.backlog,
            "control_backlog": self.control.backlog,
            "sent": self.data.sent,
            "control_sent": self.control.sent,
            # data-lane probes sent for the link's life, and those not echoed yet
            "probes": self.probe.sent,
            "probes_owed": len(self.probe.waiting),
        }


#: TLS alerts a peer sends when it refuses the certificate we presented
_REFUSED_ALERTS = ("ALERT_UNKNOWN_CA", "ALERT_BAD_CERTIFICATE", "ALERT_CERTIFICATE", "REQUIRED")


def describe_tls_error(exc: BaseException) -> str | None:
    """ "TLS: ..." for a failed handshake, saying whose certificate was refused."""
    for error in _chain(exc):
        if isinstance(error, ssl.SSLCertVerificationError):
            return (
                "TLS: the peer's certificate failed verification against the cluster CA: "
                f"{error.verify_message or error.reason}"
            )
        if isinstance(error, ssl.SSLError):
            reason = str(error.reason or error)
            if any(alert in reason.upper() for alert in _REFUSED_ALERTS):
                return f"TLS: the peer refused this server's certificate ({reason})"
            return f"TLS: handshake failed ({reason})"
    return None


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
    tls = describe_tls_error(exc)
    if tls is not None:
        return tls
    if isinstance(exc, aiormq.exceptions.ProbableAuthenticationError):
        return "authentication refused (wrong cluster secret?)"
    if isinstance(exc, aiormq.exceptions.ConnectionClosed):
        return "closed by peer: " + " ".join(str(a) for a in exc.args[:2])
    for arg in exc.args:
        # the peer closed instead of opening (aiormq wraps its Connection.Close frame):
        # its reply text says why (a checksum mismatch, a forgotten server)
        if isinstance(arg, commands.Connection.Close):
            return f"closed by peer: {arg.reply_code} {arg.reply_text}"
    if isinstance(exc, aiormq.exceptions.AMQPError) and exc.args:
        return " ".join(str(a) for a in exc.args)
    if isinstance(exc, OSError | asyncio.TimeoutError):
        return f"unreachable: {exc.__class__.__name__} {exc}".strip()
    return f"{exc.__class__.__name__}: {exc}"
