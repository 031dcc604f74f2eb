"""A connection's output side, as a part of ``Connection``: frames gathered per loop
turn, handed to the shell as buffers, and the pausing of deliveries when output
or the transport is full. Split from ``connection.py`` by concern; the state
lives on the ``Connection``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from brokerd.model.errors import CONNECTION_FORCED
from brokerd.protocol.negotiation import ConnectionState

if TYPE_CHECKING:
    from brokerd.protocol.connection import Connection

#: bytes of output a connection may gather in one loop turn before its consumers pause
OUTPUT_HIGH_WATER = 1024 * 1024


def _coalesce(out: list[Any]) -> list[bytes | memoryview]:
    """Join the runs of small ``bytes`` between a large body's views."""
    buffers: list[bytes | memoryview] = []
    run: list[bytes] = []
    for part in out:
        if type(part) is memoryview:
            if run:
                buffers.append(b"".join(run))
                run = []
            buffers.append(part)
        else:
            run.append(part)
    if run:
        buffers.append(b"".join(run))
    return buffers


class Output:
    """Output behaviour of :class:`~brokerd.protocol.connection.Connection`."""

    def hold_output(self: Connection, gate: Any) -> None:
        """Hold everything written from now on until ``gate`` opens (a delivery whose
        acquisition a store must make known elsewhere first: replication). Each
        gate starts a segment of held output; segments leave in order, each once
        its own gate and every earlier one has opened, so a steady stream of
        deliveries flows one replica round trip behind instead of waiting for the
        latest gate."""
        if gate.opened:
            return
        holds = self._holds
        if holds and holds[-1][0] is gate:
            return
        holds.append([gate])
        gate.on_open(self._release_held)

    def _release_held(self: Connection) -> None:
        holds = self._holds
        while holds and holds[0][0].opened:
            segment = holds.popleft()
            if segment[0].failed:
                # what was held can never be sent (the acquisitions were not replicated
                # before this server stopped being root): the client must reconnect
                holds.clear()
                self._held_bytes = 0
                self.close(CONNECTION_FORCED, "cluster root moved while deliveries were in flight")
                return
            for data in segment[1:]:
                if type(data) is list:
                    self._emit_parts(data, sum(map(len, data)))
                    self._held_bytes -= sum(map(len, data))
                else:
                    self._emit(data)
                    self._held_bytes -= len(data)
        if not holds:
            self._held_bytes = 0

    def _hold(self: Connection, data: Any, size: int) -> None:
        self._holds[-1].append(data)
        self._held_bytes += size
        if self._held_bytes > OUTPUT_HIGH_WATER and not self._output_full:
            self._output_full = True  # consumers pause while their output waits
            self.writable = False

    def write(self: Connection, data: bytes) -> None:
        if self._holds:
            self._hold(data, len(data))
        else:
            self._emit(data)

    def _emit(self: Connection, data: bytes) -> None:
        out = self._out
        if not out:
            out.append(data)
            self._out_bytes = len(data)
            if self.on_output is not None:
                self.on_output()
        else:
            out.append(data)
            self._out_bytes += len(data)
            if self._out_bytes > OUTPUT_HIGH_WATER and not self._output_full:
                # deliveries pause until this buffer is handed to the transport
                self._output_full = True
                self.writable = False

    def write_parts(self: Connection, parts: list[bytes | memoryview]) -> None:
        """Content frames that share a large body (``Message.content_parts``): they
        leave as separate buffers (``output_buffers``), never joined into a copy."""
        size = sum(map(len, parts))
        if self._holds:
            self._hold(parts, size)
        else:
            self._emit_parts(parts, size)

    def _emit_parts(self: Connection, parts: list[bytes | memoryview], size: int) -> None:
        out = self._out
        self._parted = True
        if not out:
            out.extend(parts)
            self._out_bytes = size
            if self.on_output is not None:
                self.on_output()
        else:
            out.extend(parts)
            self._out_bytes += size
        if self._out_bytes > OUTPUT_HIGH_WATER and not self._output_full:
            self._output_full = True
            self.writable = False

    def confirm_later(self: Connection, channel: Any) -> None:
        """A channel has confirms ready outside this connection's own reading (a queue
        on another server settled): send them with the next output."""
        self._confirm_dirty.add(channel)
        if self.on_output is not None:
            self.on_output()  # the shell flushes once this loop turn

    def output_buffers(self: Connection) -> list[bytes | memoryview]:
        """Everything queued for the peer since the last call, as buffers for
        ``transport.writelines``: one joined ``bytes`` unless a large body was
        written (its views then pass through between joined runs of the rest)."""
        if self._confirm_dirty:
            self._flush_confirms()
        out = self._out
        if not out:
            return []
        if self._parted:
            self._parted = False
            buffers = _coalesce(out)
        else:
            buffers = [b"".join(out)]
        out.clear()
        self._out_bytes = 0
        self.last_sent = self.clock()
        if self._output_full and self._held_bytes <= OUTPUT_HIGH_WATER:
            self._output_full = False
            if not self._transport_paused and self.state is ConnectionState.OPEN:
                self.resume_writing()
        return buffers

    def data_to_send(self: Connection) -> bytes:
        """Everything queued for the peer since the last call, as one ``bytes``."""
        buffers = self.output_buffers()
        if len(buffers) == 1 and isinstance(buffers[0], bytes):
            return buffers[0]
        return b"".join(buffers)

    # -- flow control from the transport ------------------------------------------

    def pause_writing(self: Connection) -> None:
        """The transport's buffer is above its high-water mark."""
        self._transport_paused = True
        self.writable = False

    def resume_writing(self: Connection) -> None:
        self._transport_paused = False
        if self._output_full:
            return
        self.writable = True
        queues = {c.queue for ch in self.channels.values() for c in ch.consumers.values()}
        for queue in queues:
            queue.dispatch()
