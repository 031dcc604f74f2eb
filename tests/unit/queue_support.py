"""Fakes for the queue model's unit tests: a clock with timers run by hand, a consumer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pamqp import commands

from brokerd.model.message import Message
from brokerd.model.queue import Queue
from brokerd.model.vhost import VirtualHost


class FakeHandle:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTimers:
    """``expiry.Timers`` with a clock that moves only when told (``advance``)."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.handles: list[FakeHandle] = []

    def now(self) -> float:
        return self.t

    def later(self, delay: float, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle(self.t + max(delay, 0.0), callback)
        self.handles.append(handle)
        return handle

    @property
    def pending(self) -> list[FakeHandle]:
        return [h for h in self.handles if not h.cancelled]

    def advance(self, seconds: float) -> None:
        """Move the clock on, running each timer due on the way at its own time."""
        target = self.t + seconds
        while True:
            due = [h for h in self.pending if h.when <= target]
            if not due:
                break
            handle = min(due, key=lambda h: h.when)
            self.handles.remove(handle)
            self.t = max(self.t, handle.when)
            handle.callback()
        self.t = target


class Sink:
    """A consumer that keeps what it is given; ready while under its prefetch."""

    exclusive = False
    no_local = False

    def __init__(self, prefetch: int = 0, no_ack: bool = False, tag: str = "c") -> None:
        self.tag = tag
        self.no_ack = no_ack
        self.connection_id = 1
        self.prefetch = prefetch
        self.got: list[tuple[Message, bool]] = []
        self.unacked: list[Message] = []

    def ready(self) -> bool:
        return not self.prefetch or len(self.unacked) < self.prefetch

    def deliver(self, queue: Queue, message: Message, redelivered: bool) -> None:
        self.got.append((message, redelivered))
        if not self.no_ack:
            self.unacked.append(message)

    def cancelled(self, queue: Queue) -> None:
        pass

    def bodies(self) -> list[bytes]:
        return [m.body for m, _ in self.got]

    def take(self, *bodies: bytes) -> list[Message]:
        """Remove these deliveries from the unacked ones (to settle them), in this order."""
        taken = [next(m for m in self.unacked if m.body == b) for b in bodies]
        for m in taken:
            self.unacked.remove(m)
        return taken


def msg(
    body: bytes | str,
    *,
    exchange: str = "",
    routing_key: str = "q",
    expiration: str | None = None,
    **properties: Any,
) -> Message:
    """A message as published (to the default exchange with routing key ``q``)."""
    if isinstance(body, str):
        body = body.encode()
    props = commands.Basic.Properties(expiration=expiration, **properties)
    return Message.build(exchange, routing_key, body, props, publisher=1)


def declare(vhost: VirtualHost, name: str, **arguments: Any) -> Queue:
    queue, _ = vhost.declare_queue(name, connection_id=1, arguments=arguments)
    return queue


def bodies(queue: Queue) -> list[bytes]:
    return [bytes(m.body) for m, _ in queue.ready()]
