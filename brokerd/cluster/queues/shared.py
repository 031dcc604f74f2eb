"""The cluster's queue types, as the model and the channel see them.

- ``SharedQueue``: a queue of the cluster vhost declared with exclusive=0.
  There is one such queue for the whole cluster, and its master copy lives
  on its *owner*, the primary its placement names (``place``, from the state
  log; issue 23), whoever is root. On the owner the object
  *is* that master (the local queue type; consumers connected to other
  servers attach to it as ``RemoteConsumer``). On every other server it is a
  proxy: pushes are forwarded to the owner, consumers, gets, purges, counts
  and settlements are proxied there. Each role is an implementation of the
  model's ``QueueType`` (``roles.Owner``, ``roles.Proxy``), and the queue
  hands every call to the one it holds. When a placement changes the owner,
  each server swaps the queue's role; the object stays, so channels holding
  it never notice.
- ``MetaQueue``: another server's private (exclusive) queue as this server's
  exchanges are bound to it by meta-bindings. Routing reaches it like a
  queue; a push forwards the message to that server.

The channel only ever calls the ``QueueType`` interface; what crosses servers is
in ``brokerd.cluster.queues.owner`` (owner side) and ``brokerd.cluster.queues.proxy``.

A replicated or quorum queue's store on its owner is a
``replicated.ReplicatingStore`` over the local journal store, so every
event reaches the other primaries, whose copies (``replica.Copies``) a
next owner starts from. A classic queue is its owner's alone, as RabbitMQ's
classic queue is its node's: no copy elsewhere; transient, it goes with its
owner; durable, it waits for it (``placement``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from brokerd.cluster.queues.replication.content import QueueCopy
from brokerd.cluster.queues.replication.entry import Entry
from brokerd.cluster.queues.roles import Owner, Proxy
from brokerd.model.interfaces import ConsumerSink, PublishWaiter, Reply
from brokerd.model.message import Message
from brokerd.model.queue import Queue
from brokerd.model.storage import QueueStore

if TYPE_CHECKING:
    from brokerd.cluster.plane.transport import Mark, Transport
    from brokerd.cluster.queues.handover import Handovers
    from brokerd.cluster.queues.orphans import Orphans
    from brokerd.cluster.queues.owner import OwnerSide
    from brokerd.cluster.queues.proxied import ProxiedConsumer
    from brokerd.cluster.queues.proxy import ProxySide
    from brokerd.cluster.queues.replication.copies import Copies
    from brokerd.cluster.queues.replication.store import ReplicatingStore
    from brokerd.cluster.queues.replication.stream import Stream
    from brokerd.store.queues import JournalQueueStore


T = TypeVar("T")


class Inner(Generic[T]):
    """An attribute of a shared queue that is its inner queue's: read there (and
    written there, ``writable``), so the vhost and the channels see one queue."""

    __slots__ = ("name", "writable")

    def __init__(self, *, writable: bool = False) -> None:
        self.writable = writable
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, queue: SharedQueue | None, owner: type | None = None) -> T:
        if queue is None:
            return self  # type: ignore[return-value]
        return getattr(queue.inner, self.name)  # type: ignore[no-any-return]

    def __set__(self, queue: SharedQueue, value: T) -> None:
        if not self.writable:
            raise AttributeError(f"a shared queue's {self.name} is its inner queue's")
        setattr(queue.inner, self.name, value)


class Services(Protocol):
    """What a shared queue asks of this server's queue service (``service.QueueService``):
    the sides its roles hand calls to, and the cluster facts a placement needs."""

    spid: str
    is_root: bool
    default_queue_type: str | None
    proxy: ProxySide
    owner_side: OwnerSide
    copies: Copies
    stream: Stream
    orphans: Orphans
    handovers: Handovers
    transport: Transport

    def clock(self) -> float: ...

    def reachable(self, spid: str) -> bool: ...

    def forward(
        self,
        spid: str | None,
        message: Message,
        target: tuple[str, str],
        waiter: PublishWaiter | None,
        redelivered: bool = False,
    ) -> bool: ...

    def forward_private(
        self, spid: str, queue: str, message: Message, waiter: PublishWaiter | None
    ) -> bool: ...

    def owner_placed(self, queue: SharedQueue) -> None: ...

    def regrouped(self, queue: SharedQueue) -> None: ...

    def placements_changed(self) -> None: ...


#: gets and purges that may wait for a move to end at once; more are answered at once
MAX_DEFERRED = 10_000
#: seconds publishes wait behind an old owner's settlement of earlier ones
#: (``behind``); one that settles nothing so long is cut off or paused, and its
#: session's end sends them on (flagged)
BEHIND_PATIENCE = 2.0
#: former owners a shared queue remembers (``SharedQueue.former_owners``)
FORMER_OWNERS = 8


class SharedQueue:
    """One cluster-wide queue on this server: the master on its owner, a proxy
    elsewhere. It holds a model ``Queue`` (``inner``: the messages, when this server
    owns it; the consumers connected here, always) and serves every ``QueueType``
    call in its role on this server (``roles.Owner`` hands it to ``inner``,
    ``roles.Proxy`` to the owner); the vhost, the exchanges and the channels see this
    object, so a placement that swaps the role goes unnoticed by them.

    How the cluster keeps it is its kind, a subclass in a module of its own, as
    RabbitMQ's ``rabbit_classic_queue`` and ``rabbit_quorum_queue`` implement
    ``rabbit_queue_type``: ``classic.ClassicQueue`` (its owner alone),
    ``replicated.ReplicatedQueue`` (every primary keeps a copy) and
    ``quorum.QuorumQueue`` (its group does). The service makes each declared queue
    of the kind its arguments name (``QueueService.make_queue``)."""

    #: its kind's name, as ``x-queue-type`` names it and brokers report it
    kind = ""
    #: its copies on other primaries let a next owner take it over, with the publishes
    #: kept for it meanwhile (``orphans``); False: it lives and dies with its owner
    replicated_kind = False

    def __init__(
        self,
        name: str,
        vhost: str,
        *,
        services: Services,
        durable: bool = False,
        exclusive_owner: int | None = None,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        assert exclusive_owner is None, "a private queue is no shared queue"
        #: the local queue: its messages while this server owns it, its consumers here
        self.inner = inner = Queue(
            name, vhost, durable=durable, auto_delete=auto_delete, arguments=arguments, timed=False
        )
        inner.face = self  # consumers and stores are handed this object: acks come here
        # what it is never changes: plain attributes (read on every publish), the
        # inner queue's own values
        self.name = inner.name
        self.vhost = inner.vhost
        self.durable = inner.durable
        self.auto_delete = inner.auto_delete
        self.arguments = inner.arguments
        inner.on_unused = self._unused
        #: the cluster's removal of the queue (``ClusterController._shared_unused``)
        self.on_unused: Callable[[SharedQueue], None] | None = None
        #: exchanges bound to it (the vhost's bindings, on this object)
        self.bindings: dict[tuple[Any, ...], Any] = {}
        #: this server's journal of the queue (the vhost's store sets it)
        self.journal_store: JournalQueueStore | None = None
        self._replicated: ReplicatingStore | None = None
        self._owner = Owner(self, inner)
        self._proxy = Proxy(self, inner)
        #: the role every ``QueueType`` call goes to (``local`` swaps it)
        self.role: Owner | Proxy = self._proxy
        self.services = services
        #: master (True) or proxy until its placement says (``_first_local``)
        self.local = self._first_local()
        #: the queue's owner (None until placed, and while it is unavailable), the
        #: placement's epoch, and the owner it waits for while unavailable
        self.owner: str | None = None
        self.epoch = 0
        self.home: str | None = None
        #: the addresses of the primaries keeping its copies, its first owner first (a
        #: quorum queue whose ``x-quorum-initial-group-size`` leaves some out); None:
        #: every primary keeps one, or none does (classic). Its declare says
        self.group: tuple[str, ...] | None = None
        #: the state-log entry that placed it: an owner fenced by a later entry
        #: holds it from before its fence (its failover moves it)
        self.placed_seq = 0
        #: this server's consumers as attached at the owner (proxy role)
        self.proxied: dict[ConsumerSink, ProxiedConsumer] = {}
        #: the primary the queue is being handed to (``handover``): its owner delivers
        #: nothing meanwhile, every other server keeps its publishes for it
        self.moving: str | None = None
        #: when this server learnt of the move (the root calls off one that lasts)
        self.move_since = 0.0
        #: owner only, while moving: past the hand-over point, so nothing more goes in
        self.frozen = False
        #: gets and purges asked here while it moved: run once it has its owner
        self.deferred: list[Callable[[], None]] = []
        #: this server's last forward of a publish for it, to its owner then
        #: (``behind``; a replicated queue's)
        self.sent: Mark | None = None
        #: since when ``behind`` found the old owner holding it (0: it did not)
        self.behind_since = 0.0
        #: its last owners before the present one, newest last: what one of them
        #: forwards here is a relay of what it kept when fenced (``intake.apply``)
        self.former_owners: deque[str] = deque(maxlen=FORMER_OWNERS)

    # -- what it is, as the vhost, the exchanges and the channels read it ---------------

    exclusive_owner = None
    exclusive = False
    #: the consumers connected to this server (on the owner, those of other servers
    #: too, as ``owner.RemoteConsumer``)
    consumers = Inner[list[ConsumerSink]]()
    message_count = Inner[int]()
    consumer_count = Inner[int]()
    had_consumers = Inner[bool]()
    deleted = Inner[bool](writable=True)
    #: deliveries not yet settled (the channels and the owner side count them)
    unacked = Inner[int](writable=True)
    stats_in = Inner[int](writable=True)
    stats_out = Inner[int](writable=True)
    stats_dropped = Inner[int]()
    stats_expired = Inner[int]()
    stats_dead_lettered = Inner[int]()
    stats_corrupt = Inner[int]()
    page_limit = Inner[int](writable=True)
    dead_letters = Inner[Any](writable=True)

    def touch(self) -> None:
        self.inner.touch()

    def check_unused(self) -> None:
        self.inner.check_unused()

    def stop_timers(self) -> None:
        self.inner.stop_timers()

    def drop_all(self) -> int:
        return self.inner.drop_all()

    def attach(self, consumer: ConsumerSink) -> None:
        """List a consumer its owner accepted (a proxied one): no check, no dispatch."""
        self.inner.attach(consumer)

    def detach(self, consumer: ConsumerSink) -> bool:
        """Take a consumer off without consequence (``Queue.detach``)."""
        return self.inner.detach(consumer)

    def take(self, no_ack: bool = False, recipient: Any = None) -> Any:
        return self.inner.take(no_ack, recipient)

    def ready(self) -> list[tuple[Message, bool]]:
        return self.inner.ready()

    def _unused(self, _inner: Queue) -> None:
        """The inner queue lost its last consumer (auto-delete) or went unused
        (x-expires): the cluster removes the shared queue."""
        if self.on_unused is not None:
            self.on_unused(self)

    # -- where it lives -----------------------------------------------------------------

    @property
    def local(self) -> bool:
        """This server holds the queue's messages (its owner), else it proxies it."""
        return self.role is self._owner

    @local.setter
    def local(self, master: bool) -> None:
        self.role = self._owner if master else self._proxy
        self.inner.timed = master  # TTL and x-expires act on the owner only

    @property
    def group_key(self) -> frozenset[str] | None:
        """Whose acks its confirms and deliveries wait for (``replicaset.Group``)."""
        return frozenset(self.group) if self.group is not None else None

    def owner_spid(self) -> str | None:
        """The server holding the master copy now (None: nobody, for the moment)."""
        return self.owner

    def replica_states(self) -> list[dict[str, Any]] | None:
        """The master copy's replicas with their in-sync state, for the console and
        ``brokerd ctl queues`` (``_replicas``); None on a proxy, which does not know
        (its master reports them)."""
        if not self.local:
            return None
        return self._replicas()

    # -- what its kind decides -----------------------------------------------------------

    def _first_local(self) -> bool:
        """Is it the master here before any placement says where it lives?"""
        raise NotImplementedError

    def _replicas(self) -> list[dict[str, Any]]:
        """The replicas of the master copy, with their in-sync state."""
        raise NotImplementedError

    def unavailable(self) -> bool:
        """It has no owner now and calls are answered at once (RabbitMQ's answer for a
        queue whose node is down), rather than waiting for its next owner."""
        raise NotImplementedError

    def to_owner(self, message: Message, waiter: PublishWaiter | None) -> bool:
        """A publish on a server that does not own it: on to its owner (or kept)."""
        raise NotImplementedError

    def _taken_over(self, entries: dict[int, Entry], copy: QueueCopy | None) -> None:
        """This server just became its owner, with ``copy`` (entries by message id):
        what the kind's store needs."""
        raise NotImplementedError

    def _copy_to_keep(self) -> QueueCopy:
        """This server stops owning it: the content kept as its copy here."""
        raise NotImplementedError

    @property
    def replicated(self) -> ReplicatingStore | None:
        """The owner's store of a replicated or quorum queue (owner role only)."""
        return self._replicated

    @replicated.setter
    def replicated(self, store: ReplicatingStore | None) -> None:
        self._replicated = store
        self.inner.store = store if store is not None else self.journal_store

    @property
    def store(self) -> QueueStore | None:
        """The master numbers and replicates (over the journal); a proxy's journal
        belongs to its replica."""
        return self.inner.store

    @store.setter
    def store(self, store: QueueStore | None) -> None:
        self.journal_store = store  # type: ignore[assignment]
        if self._replicated is not None:
            self._replicated.local = store  # type: ignore[assignment]
        else:
            self.inner.store = store

    # -- QueueType: served by the role -------------------------------------------------

    def load_recovered(self, messages: Iterable[tuple[Message, bool]]) -> int:
        return self.role.load_recovered(messages)

    def push(self, message: Message, waiter: PublishWaiter | None = None) -> bool:
        return self.role.push(message, waiter)

    def ack(self, messages: Any) -> None:
        self.role.ack(messages)

    def reject(self, messages: Any) -> None:
        self.role.reject(messages)

    def requeue(self, messages: Any) -> None:
        self.role.requeue(messages)

    def dispatch(self) -> None:
        self.role.dispatch()

    def get(self, no_ack: bool, reply: Reply, recipient: Any = None) -> None:
        self.role.get(no_ack, reply, recipient)

    def purge(self, reply: Reply) -> None:
        self.role.purge(reply)

    def stat(self, reply: Reply) -> None:
        self.role.stat(reply)

    def add_consumer(self, consumer: ConsumerSink, reply: Reply | None = None) -> None:
        self.role.add_consumer(consumer, reply)

    def remove_consumer(self, consumer: ConsumerSink) -> None:
        self.role.remove_consumer(consumer)

    def restore(self, message: Message, waiter: PublishWaiter | None = None) -> None:
        if self.moving is not None and self.local:
            self.push_moving(message, waiter, True)
        else:
            self.inner.restore(message, waiter)

    # -- the role -----------------------------------------------------------------------

    def regroup(self, group: tuple[str, ...]) -> None:
        """A new group from the state log (``queue.group``: a shrink): confirms and
        deliveries wait for a majority of it from now on."""
        self.group = group
        self.services.regrouped(self)

    def place(
        self,
        owner: str | None,
        epoch: int,
        home: str | None,
        seq: int = 0,
        moving: str | None = None,
    ) -> None:
        """The queue's placement, from the state log (entry ``seq``): its owner serves
        it, every other server proxies it. ``moving``: the owner stays, and hands the
        queue to that primary (``handover``); the next placement ends the move."""
        if epoch < self.epoch:
            return
        was_moving = self.moving
        if self.owner is not None and owner != self.owner:
            if self.owner in self.former_owners:
                self.former_owners.remove(self.owner)
            self.former_owners.append(self.owner)
        self.owner, self.epoch, self.home = owner, epoch, home
        self.moving = moving if owner is not None else None
        self.placed_seq = seq
        services = self.services
        if owner is not None:
            services.owner_placed(self)
        if owner == services.spid:
            self._own()
        else:
            self._disown()
            services.proxy.replaced(self)  # its consumers here follow the owner
        if self.moving is not None:
            if was_moving is None:
                self.move_since = services.clock()
            services.handovers.started(self)
        elif was_moving is not None:
            self._moved()
        # an owner handing the queue over delivers nothing, not even when an ack or a
        # credit frees a consumer (the model queue dispatches on those by itself)
        self.inner.delivering = not (self.local and self.moving is not None)
        services.placements_changed()
        services.orphans.send()  # publishes kept for its next owner

    def behind(self) -> str:
        """The old owner still holding this server's last forward for the queue
        unsettled ("" if none). Its owner changed meanwhile, and that forward may
        yet reach the new owner through the old one (a fenced owner keeps what it
        is sent and relays it): a publish from here must wait behind it, not
        overtake it on a link of its own. For ``BEHIND_PATIENCE`` at most."""
        sent = self.sent
        if sent is None:
            return ""
        spid = sent[0].spid
        if spid == self.owner:
            return ""
        services = self.services
        if services.transport.unsettled_upto(sent):
            now = services.clock()
            if not self.behind_since:
                self.behind_since = now
            if now - self.behind_since < BEHIND_PATIENCE:
                return spid
        self.sent = None
        self.behind_since = 0.0
        return ""

    def _moved(self) -> None:
        """The move is over (the target owns the queue, or the root called it off):
        what waited for it goes on, wherever the queue is now."""
        self.frozen = False
        self.inner.delivering = True
        self.services.handovers.ended(self)
        deferred, self.deferred = self.deferred, []
        for call in deferred:
            call()
        if self.local:
            self.dispatch()

    def defer(self, call: Callable[[], None]) -> bool:
        """Run ``call`` once the move is over; False when too many wait already."""
        if len(self.deferred) >= MAX_DEFERRED:
            return False
        self.deferred.append(call)
        return True

    def push_moving(
        self, message: Message, waiter: PublishWaiter | None, redelivered: bool = False
    ) -> bool:
        """A publish for the queue this server owns and is handing over: into the queue
        until it is frozen (nothing delivered), kept for the next owner after."""
        if self.frozen:
            return self.services.orphans.hold(message, ("", self.name), waiter, redelivered)
        return self.inner.push_held(message, waiter, redelivered=redelivered)

    def _owning(self) -> bool:
        """Already set up as its owner (a replicated queue needs its store too)."""
        return True

    def _own(self) -> None:
        """This server owns the queue. A classic queue's content is what its journal
        kept (a restart); a replicated one's is this server's copy (empty for a new
        queue): what the old owner had delivered comes back ready and flagged
        redelivered, in the order it numbered it (its consumers' sessions ended with
        it), and the replicas are reset to this server's copy."""
        if self.local and self._owning():
            return
        self.local = True
        services = self.services
        replica = services.copies.take(self.name)
        ready = []
        entries: dict[int, Entry] = {}
        for mid, entry in replica.ordered() if replica is not None else ():
            if entry.acquired:
                entry.requeue()
            entries[mid] = entry
            ready.append((entry.message, entry.redelivered))
        self._taken_over(entries, replica)
        if ready:
            self.inner.replace_messages(ready)
        services.proxy.forget(self)
        self.inner.start_timers()  # TTL and x-expires act on the owner only
        self.dispatch()

    def _disown(self) -> None:
        """Another server owns it, or nobody for now (this one was found lost while it
        was only slow): what it held is kept, in order, as this server's copy: the
        next owner's stream resets it, or it is the content again if this server
        owns the queue again (its journal keeps the persistent part across a
        restart too). Publishes no quorum held go on to the next owner; consumers
        from elsewhere go, and this server's own are attached at the owner."""
        if not self.local:
            return
        services = self.services
        services.owner_side.release_queue(self)
        self.local = False
        replica = self._copy_to_keep()
        if replica.entries:
            services.copies.hand(self.name, replica)
        services.copies.disowned()
        self.inner.clear()  # and its timers stop: the next owner's copy expires
        for consumer in [c for c in self.inner.consumers if getattr(c, "remote", False)]:
            self.inner.detach(consumer)
        services.proxy.adopt(self)

    def __repr__(self) -> str:
        role = "master" if self.local else "proxy"
        return f"<{type(self).__name__} {self.vhost}:{self.name} {role} {self.message_count} ready>"


class MetaQueue:
    """A private queue of another server, bound here by meta-bindings."""

    local = False
    exclusive = True

    def __init__(self, spid: str, name: str, services: Services) -> None:
        self.spid = spid
        self.name = name
        self.services = services
        self.bindings: dict[tuple[Any, ...], Any] = {}

    def push(self, message: Message, waiter: PublishWaiter | None = None) -> bool:
        return self.services.forward_private(self.spid, self.name, message, waiter)

    def __repr__(self) -> str:
        return f"<MetaQueue {self.name} on {self.spid}>"


class RemoteQueues:
    """The MetaQueues of this server, by (spid, queue name): ``replication.RemoteQueues``."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._queues: dict[tuple[str, str], MetaQueue] = {}

    def get(self, spid: str, queue: str) -> MetaQueue:
        found = self._queues.get((spid, queue))
        if found is None:
            found = self._queues[(spid, queue)] = MetaQueue(spid, queue, self.services)
        return found

    def find(self, spid: str, queue: str) -> MetaQueue | None:
        return self._queues.get((spid, queue))

    def of(self, spid: str) -> list[MetaQueue]:
        return [q for (s, _), q in self._queues.items() if s == spid]

    def drop(self, destination: Any) -> None:
        self._queues.pop((destination.spid, destination.name), None)
