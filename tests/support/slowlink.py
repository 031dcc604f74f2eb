"""A slow link: a TCP proxy that delays, caps and stalls what it carries (issue 41).

``tc netem`` is not in this kernel, so latency and bandwidth come from a small
proxy between two servers: the cluster file names the proxy as the known host,
and every link to that server passes through it. Each direction is a reader and
a writer with a bounded queue of chunks between them:

- ``delay``: each chunk leaves ``delay`` seconds after it arrived (order kept);
- ``rate``: bytes per second at most (0: no cap);
- ``stalled``: nothing leaves until it is released; the reader stops taking
  once the queue is full, so the sender's kernel buffers fill and its writes
  back up, as on a link that stopped moving.

The proxy runs its own event loop in a thread, so a test or the fault harness
drives it from blocking code (``set``, ``stall``, ``release``, ``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import threading
import time
from dataclasses import dataclass

#: setns(2)'s flag for a network namespace
CLONE_NEWNET = 0x40000000


def enter_namespace(name: str) -> None:
    """Move the calling thread into the named network namespace (``ip netns``'s)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {name}: {os.strerror(errno)}")
    finally:
        os.close(fd)


#: chunks one direction holds before its reader stops reading (backpressure)
QUEUE_CHUNKS = 64
CHUNK = 65536


@dataclass
class Shape:
    """What a link does to the bytes it carries, both directions alike."""

    delay: float = 0.0
    rate: float = 0.0
    stalled: bool = False


class SlowLink:
    """``listen`` (host, port 0 for any) forwarding to ``target``; ``address`` once started."""

    def __init__(
        self, listen: tuple[str, int], target: tuple[str, int], namespace: str | None = None
    ) -> None:
        self.listen = listen
        self.target = target
        #: the network namespace the proxy's sockets live in (None: the test's own).
        #: On the test bed it is the target server's: the proxy is then one more port
        #: of that server's address, and a cut (a route in the sender's namespace)
        #: drops what goes through it as it drops the rest
        self.namespace = namespace
        self.shape = Shape()
        self.address: tuple[str, int] = listen
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._entered = threading.Event()
        self._entry_error: OSError | None = None
        self._server: asyncio.AbstractServer | None = None
        self._moving = asyncio.Event()
        self._pipes: set[asyncio.Task[None]] = set()
        #: each direction of each connection carried: what it moved and holds now
        self._flows: dict[int, _Flow] = {}

    # -- control, from any thread -----------------------------------------------------

    def start(self) -> SlowLink:
        self._thread.start()
        self._entered.wait(10)
        if self._entry_error is not None:
            raise self._entry_error
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def _run(self) -> None:
        """The proxy's thread: into its namespace (a thread may join one of its own:
        sockets it makes from then on are that namespace's), then the loop."""
        try:
            if self.namespace is not None:
                enter_namespace(self.namespace)
        except OSError as exc:
            self._entry_error = exc
            self._entered.set()
            return
        self._entered.set()
        self._loop.run_forever()

    def set(self, delay: float = 0.0, rate: float = 0.0) -> None:
        self._call(self._set, delay, rate)

    def stall(self) -> None:
        self._call(self._set_stalled, True)

    def release(self) -> None:
        self._call(self._set_stalled, False)

    def clear(self) -> None:
        """Back to a plain, fast link."""
        self.set(0.0, 0.0)
        self.release()

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def describe(self) -> list[str]:
        """One line per direction of each open connection: bytes moved, chunks queued,
        and whether its writer still runs (a fault run's stall dumps show them)."""
        if not self._thread.is_alive():
            return []
        lines: list[str] = []
        done = threading.Event()

        def run() -> None:
            lines.extend(str(f) for f in self._flows.values())
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(5)
        return lines

    def _call(self, fn: object, *args: object) -> None:
        done = threading.Event()

        def run() -> None:
            fn(*args)  # type: ignore[operator]
            done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    # -- the loop's side ----------------------------------------------------------------

    def _set(self, delay: float, rate: float) -> None:
        self.shape.delay, self.shape.rate = max(0.0, delay), max(0.0, rate)

    def _set_stalled(self, stalled: bool) -> None:
        self.shape.stalled = stalled
        if stalled:
            self._moving.clear()
        else:
            self._moving.set()

    async def _start(self) -> None:
        self._moving.set()
        self._server = await asyncio.start_server(self._accept, *self.listen, reuse_address=True)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = (host, port)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        for source, sink, way in ((reader, up_writer, "in"), (up_reader, writer, "out")):
            task = asyncio.get_running_loop().create_task(
                self._pipe(source, sink, f"{peer[0]}:{peer[1]} {way}")
            )
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, name: str
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)
        flow = self._flows[id(queue)] = _Flow(name, queue)
        writer = asyncio.get_running_loop().create_task(self._deliver(queue, sink, flow))
        flow.writer = writer
        try:
            while True:
                chunk = await source.read(CHUNK)
                if not chunk:
                    break
                flow.read += len(chunk)
                await queue.put((time.monotonic(), chunk))
            await queue.put((time.monotonic(), b""))
            await writer
        except (OSError, asyncio.CancelledError):
            writer.cancel()
        finally:
            self._flows.pop(id(queue), None)
            sink.close()

    async def _deliver(
        self,
        queue: asyncio.Queue[tuple[float, bytes]],
        sink: asyncio.StreamWriter,
        flow: _Flow | None = None,
    ) -> None:
        while True:
            arrived, chunk = await queue.get()
            if not chunk:
                with contextlib.suppress(OSError):
                    sink.write_eof()
                return
            await self._moving.wait()
            wait = arrived + self.shape.delay - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if self.shape.rate:
                await asyncio.sleep(len(chunk) / self.shape.rate)
            await self._moving.wait()
            sink.write(chunk)
            await sink.drain()
            if flow is not None:
                flow.written += len(chunk)


@dataclass
class _Flow:
    """One direction of one proxied connection, for ``SlowLink.describe``."""

    name: str
    queue: asyncio.Queue[tuple[float, bytes]]
    read: int = 0
    written: int = 0
    writer: asyncio.Task[None] | None = None

    def __str__(self) -> str:
        writer = self.writer
        if writer is None or not writer.done():
            state = "running"
        elif writer.cancelled():
            state = "cancelled"
        else:
            state = f"ended ({writer.exception()!r})"
        return (
            f"{self.name}: read={self.read} written={self.written} "
            f"queued={self.queue.qsize()} writer={state}"
        )
