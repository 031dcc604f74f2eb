"""A connection moving to the sibling worker that holds its queue (``brokerd --workers``).

The kernel gives each new connection to a worker at random (``SO_REUSEPORT``),
before anything says which queues it will use, and a client whose queue is on
another worker pays a hop on the local link for every message. So a connection
may move once, at the first ``basic.consume`` or the first ``basic.publish`` on
it, to the worker that owns the queue(s) it names, if it is *quiet* then: open,
not TLS (the session's keys live in this process), no consumer, no unacknowledged
delivery, no publish waiting for its confirm or its content, no transaction, no
exclusive queue of its own, nothing held for the replicas. Its state at that
point is small (``snapshot``): what the handshake negotiated, who logged in to
which vhost, and each channel's confirm mode, publish count and prefetch. The
frames that triggered the move and everything read after them travel with it, so
the new worker answers them as this one would have.

This module is the machine's part (sans-IO): noticing the moment
(``_move_point``), refusing it when the connection is not quiet (``movable``),
and the state to hand over and restore. Where to go is the server's
(``Mover.destination``: the owner of the named queues, if it is a sibling), and
so is the socket's passage (``brokerd/server/handoff.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from pamqp import decode as amqp_decode
from pamqp import encode as amqp_encode
from pamqp.base import Frame as Method

from brokerd.protocol.channel import Channel
from brokerd.protocol.negotiation import ConnectionState
from brokerd.wire import codec

if TYPE_CHECKING:
    from brokerd.model.broker import Broker
    from brokerd.protocol.connection import Connection

log = logging.getLogger("brokerd.connection")

_CONSUME_ID = bytes((0, 60, 0, 20))
_PUBLISH_ID = bytes((0, 60, 0, 40))
#: what the moment is, by the method that triggers it (each is looked at once)
_POINTS = {_CONSUME_ID: "consume", _PUBLISH_ID: "publish"}


class MoveError(ValueError):
    """A snapshot that cannot be restored here (a user or vhost this worker lacks)."""


def check_restorable(broker: Broker, state: dict[str, Any]) -> None:
    """MoveError unless ``broker`` has the snapshot's user and vhost: asked before the
    taker says it can take the connection, and again as it restores it."""
    user, vhost = state.get("user"), state.get("vhost")
    if user not in broker.users.users or vhost not in broker.vhosts:
        raise MoveError(f"no user {user!r} or vhost {vhost!r} here")


class Mover(Protocol):
    """Where a quiet connection should be, at its first consume or publish."""

    def destination(self, conn: Connection, channel: int, method: Method) -> Any | None:
        """A sibling to move to (an opaque token for the server), or None to stay."""


class Moving:
    """The move, as a part of :class:`~brokerd.protocol.connection.Connection`."""

    def _init_moving(self: Connection, mover: Mover | None) -> None:
        self.mover = mover
        #: the sibling this connection is moving to while its frames wait (None: not)
        self.moving_to: Any | None = None
        #: moved away: the socket is another worker's now (the teardown says nothing)
        self.moved = False
        self._points_seen: set[str] = set()
        #: a consume or publish is still to be looked at (the per-frame test)
        self._move_watch = mover is not None

    def _move_point(self: Connection, channel: int, payload: bytes) -> Any | None:
        """Before a channel's method frame: the destination if this is the moment to
        move (the connection's first consume or publish, and it is quiet)."""
        point = _POINTS.get(payload[:4])
        if point is None or point in self._points_seen or self.mover is None:
            return None
        self._points_seen.add(point)
        self._move_watch = len(self._points_seen) < len(_POINTS)
        if channel not in self.channels or not self.movable():
            return None
        try:
            method = codec.decode_method(payload)
        except (codec.UnknownMethod, codec.SyntaxError_):
            return None  # answered where it is, with the error
        return self.mover.destination(self, channel, method)

    def movable(self: Connection) -> bool:
        """Quiet: nothing of it is in flight anywhere but in its own socket."""
        if (
            self.state is not ConnectionState.OPEN
            or self.tls
            or self.cluster_link
            or self.moved
            or self.login is not None
            or self.read_paused
            or self.blocked_reason is not None
            or self._holds
            or self._confirm_dirty
        ):
            return False
        for ch in self.channels.values():
            if (
                ch.consumers
                or ch.unacked
                or ch.tx
                or ch._inflight
                or ch._confirms
                or ch._deferring is not None
                or ch._held is not None
                or ch._publish is not None
                or not ch.flow
            ):
                return False
        vhost = self.vhost
        return not any(q.exclusive_owner == self.id for q in vhost.queues.values())

    # -- the state handed over -----------------------------------------------------------

    def snapshot(self: Connection) -> dict[str, Any]:
        """What the sibling needs to go on where this connection is: the negotiated
        terms, the login, each channel, and the bytes not answered yet (the frames
        that wait, then what was read after them). MoveError if it cannot be told
        (client properties of a type the table encoding does not take back)."""
        if self._pending_error is not None:
            raise MoveError("a framing error waits to be answered")
        pending = b"".join(codec.frame(*waiting) for waiting in self._pending)
        try:
            properties = amqp_encode.field_table(self.client_properties).hex()
        except (TypeError, ValueError) as exc:
            raise MoveError(f"client properties: {exc}") from None
        return {
            "peer": list(self.peer),
            "frame_max": self.frame_max,
            "channel_max": self.channel_max,
            "heartbeat": self.heartbeat,
            "client_properties": properties,
            "user": self.user.name,
            "vhost": self.vhost.name,
            "messages_in": self.messages_in,
            "messages_out": self.messages_out,
            "channels": [
                {
                    "number": ch.number,
                    "confirm": ch.confirm,
                    "publish_seq": ch.publish_seq,
                    "prefetch": ch.prefetch,
                    "global_prefetch": ch.global_prefetch,
                    "last_queue": ch.last_queue,
                }
                for ch in self.channels.values()
            ],
            "pending": (pending + bytes(self._buf)).hex(),
        }

    def restore(self: Connection, state: dict[str, Any]) -> bytes:
        """Become the connection ``state`` describes, open and counted here; returns
        the bytes to process next. MoveError if this worker cannot take it."""
        check_restorable(self.broker, state)
        user = self.broker.users.users[state["user"]]
        vhost = self.broker.vhosts[state["vhost"]]
        raw = bytes.fromhex(state["client_properties"])
        _, properties = amqp_decode.field_table(raw)
        self.client_properties = properties
        caps = properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        self.frame_max = int(state["frame_max"])
        self.channel_max = int(state["channel_max"])
        self.heartbeat = int(state["heartbeat"])
        self.messages_in = int(state["messages_in"])
        self.messages_out = int(state["messages_out"])
        self.user = user
        self.vhost = vhost
        self._points_seen = set(_POINTS.values())  # moved once: it stays here
        self._move_watch = False
        self.broker.adopt_connection(vhost.name)
        self.counted = True
        self.state = ConnectionState.OPEN
        for entry in state["channels"]:
            ch = Channel(self, int(entry["number"]))
            ch.confirm = bool(entry["confirm"])
            ch.publish_seq = int(entry["publish_seq"])
            ch.prefetch = int(entry["prefetch"])
            ch.global_prefetch = int(entry["global_prefetch"])
            ch.last_queue = entry["last_queue"]
            self.channels[ch.number] = ch
        log.info(
            "moved in conn=%d peer=%s user=%s vhost=%s channels=%d",
            self.id,
            self.name,
            user.name,
            vhost.name,
            len(self.channels),
        )
        return bytes.fromhex(state["pending"])

    def stay(self: Connection) -> None:
        """The move did not happen: answer the frames that waited, here."""
        self.moving_to = None
        self._resume()

    def left(self: Connection) -> None:
        """The socket is the sibling's: release what was counted here, say nothing."""
        self.moved = True
        self.moving_to = None
        self._pending = []
        self._buf.clear()
        log.info("moved out conn=%d peer=%s", self.id, self.name)
        self._teardown()
        self.state = ConnectionState.CLOSED


__all__ = ["MoveError", "Mover", "Moving", "check_restorable"]
