"""What a proxy side keeps and how it reads its owners' answers (``proxy.py``).

A session is one attachment of this server's proxies to one owner; a proxied
consumer is a local consumer as attached at its queue's owner; a request is a
get, purge or count asked of an owner, asked again under a new session. The
functions at the end read an owner's ``Reply`` records.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from brokerd.cluster.plane import records as rec
from brokerd.model.errors import (
    INTERNAL_ERROR,
    NOT_FOUND,
    AMQPError,
    ChannelError,
    ConnectionError_,
)
from brokerd.model.interfaces import ConsumerSink, Reply
from brokerd.model.message import Message

if TYPE_CHECKING:
    from brokerd.cluster.plane.outbound import Outbound
    from brokerd.cluster.queues.shared import SharedQueue


class Members(Protocol):
    """What the proxy side asks of membership."""

    config: Any
    not_ready_reason: str

    def clock(self) -> float: ...

    def in_sync(self, root: str) -> bool: ...


#: requests (gets, purges, counts) that may wait for an owner at once; more are refused
MAX_WAITING = 10_000
#: times a request is asked again of an owner that does not master its queue yet
RETRIES = 3


class Session:
    """One attachment of this server's proxies to the owner ``peer``."""

    __slots__ = ("epoch", "out", "peer")

    def __init__(self, peer: str, epoch: int, out: Outbound) -> None:
        self.peer = peer
        self.epoch = epoch
        self.out = out


class ProxiedConsumer:
    """A local consumer of a proxied shared queue, as attached at its owner."""

    __slots__ = (
        "attached",
        "consumer",
        "created",
        "owed",
        "pending",
        "queue",
        "reply",
        "session",
        "tag",
        "windowed",
    )

    def __init__(
        self, queue: SharedQueue, consumer: ConsumerSink, tag: str, reply: Reply | None, now: float
    ) -> None:
        self.queue = queue
        self.consumer = consumer
        self.tag = tag
        #: the client's consume-ok, until the owner first accepts it
        self.reply = reply
        self.created = now
        #: the session its consume went out under (None: not sent yet, or that ended)
        self.session: Session | None = None
        self.attached = False
        #: deliveries from the owner the consumer was not ready for yet
        self.pending: deque[tuple[Message, bool]] = deque()
        #: no prefetch window in ack mode: credit goes back as deliveries are written
        self.windowed = bool(getattr(consumer, "no_ack", False)) or not window_of(consumer)
        self.owed = 0


def window_of(consumer: ConsumerSink) -> int:
    return int(getattr(consumer, "window", 0) or 0)


@dataclass
class Request:
    """A get, purge or count asked of a queue's owner, re-asked under a new session."""

    queue: SharedQueue | None
    issue: Callable[[Session, int], None]
    answer: Callable[[Any], None]
    created: float
    consume: ProxiedConsumer | None = None
    session: Session | None = None
    retries: int = field(default=0)
    #: asks the queue itself, once its owner is this server (a failover chose it)
    here: Callable[[], None] | None = None


def is_current(message: Message, session: Session) -> bool:
    ref = message.ref
    return ref is not None and ref[0] is session  # type: ignore[index]


def is_ok(r: Any) -> bool:
    return isinstance(r, rec.Reply) and r.code == 0


def error_of(r: Any) -> AMQPError:
    if isinstance(r, AMQPError):
        return r
    if isinstance(r, rec.Reply):
        cls = ConnectionError_ if r.hard else ChannelError
        return cls(r.code, r.text)
    return ConnectionError_(INTERNAL_ERROR, "unexpected answer from the queue's owner")


def is_gone(r: Any) -> bool:
    """The owner's answer: it has no such queue."""
    return isinstance(r, rec.Reply) and r.code == NOT_FOUND


def missing(queue: Any) -> AMQPError:
    return ChannelError(NOT_FOUND, f"no queue '{queue.name}' in vhost '{queue.vhost}'")


def not_mastered(r: Any) -> bool:
    """The owner's answer: the queue is not mastered there (yet, or any more)."""
    return isinstance(r, rec.Reply) and r.code == INTERNAL_ERROR


def unavailable(queue: SharedQueue) -> bool:
    """A queue whose owner is away (a classic queue, or one no copy of which was
    left): RabbitMQ answers for it at once. A replicated queue not placed yet waits."""
    return queue.unavailable()


def not_ready(members: Any, queue: SharedQueue | None = None) -> AMQPError:
    if queue is not None and unavailable(queue):
        return ChannelError(
            NOT_FOUND,
            f"home node '{queue.home or 'unknown'}' of durable queue '{queue.name}' in vhost "
            f"'{queue.vhost}' is down or inaccessible",
        )
    reason = members.not_ready_reason or "no session with the queue's owner"
    return ConnectionError_(INTERNAL_ERROR, f"cluster not ready: {reason}")
