"""What a fault-injection run observed: publishes, deliveries and faults.

The checker reads nothing else, so a history can be written by hand in a
unit test, saved as JSON after a soak and checked again later. Times are
wall-clock seconds (``time.time()``), the clock the brokerd logs use too.

Flood publishers (unconfirmed, thousands a second: names from
``FLOOD_PREFIX``) are recorded compactly, since a record object per message
would grow without bound over a soak: per connection a first sequence
number and an array of write times (its numbers are consecutive), and
their deliveries per consumer connection as parallel arrays.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

#: publish outcomes; only ``ack`` promises anything
ACK = "ack"
NACK = "nack"
RETURNED = "returned"  # mandatory and taken by no queue
UNKNOWN = "unknown"  # the connection died (or timed out) before an answer
OUTCOMES = (ACK, NACK, RETURNED, UNKNOWN)
#: flood publishers are named f0, f1, ... (confirmed ones p0, p1, ...)
FLOOD_PREFIX = "f"


def is_flood(publisher: str) -> bool:
    """Whether a body's publisher name is a flood publisher's (recorded compactly)."""
    return publisher.startswith(FLOOD_PREFIX)


@dataclass(frozen=True)
class Publish:
    """One publish attempt; a sequence number is never used twice by a publisher."""

    publisher: str
    seq: int
    queue: str
    server: int
    sent: float
    done: float
    outcome: str


@dataclass(frozen=True)
class Delivery:
    """One message handed to a consumer (``session``: its connection count, from 1)."""

    consumer: str
    session: int
    server: int
    publisher: str
    seq: int
    redelivered: bool
    at: float


@dataclass
class Fault:
    """One injected fault: ``start`` when applied, ``end`` when undone (restart,
    SIGCONT, heal), ``recovered`` when the cluster had a settled root again."""

    kind: str
    target: int
    role: str  # root, primary or secondary when the fault was applied
    start: float
    end: float | None = None
    recovered: float | None = None
    peer: int | None = None  # the other end of a cut link
    peer_role: str | None = None
    note: str = ""
    #: a network fault's heal began (``end`` is when it was done): what a server did
    #: before this, it did cut off
    healing: float | None = None
    #: a network fault's cut was in place (its routes and links changed: on a loaded
    #: machine the ``ip`` commands take a while after ``start``); None: not recorded
    cut: float | None = None


@dataclass
class FloodSession:
    """One connection of a flood publisher. Its sequence numbers are consecutive from
    ``first``: one per ``sent`` entry (when basic_publish returned, i.e. the message
    was written to the socket), then ``cut`` more whose basic_publish failed with the
    connection (maybe written, maybe not: never counted as published)."""

    server: int
    opened: float
    first: int
    sent: array[float] = field(default_factory=lambda: array("d"))
    cut: int = 0
    closed: float | None = None
    #: why the connection ended ("" : closed by the harness at the stop)
    error: str = ""

    @property
    def end(self) -> int:
        """One past its last sequence number."""
        return self.first + len(self.sent) + self.cut

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "sent": self.sent.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FloodSession:
        return cls(**{**data, "sent": array("d", data.get("sent", []))})


@dataclass
class FloodPublisher:
    """A flood publisher's connections in order; message ``seq`` went to
    ``queues[seq % len(queues)]``, as the confirmed publishers' do."""

    name: str
    queues: list[str]
    sessions: list[FloodSession] = field(default_factory=list)

    @property
    def end(self) -> int:
        """One past the last sequence number it tried (they start at 1)."""
        return self.sessions[-1].end if self.sessions else 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "queues": list(self.queues),
            "sessions": [s.to_dict() for s in self.sessions],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FloodPublisher:
        sessions = [FloodSession.from_dict(s) for s in data.get("sessions", [])]
        return cls(data["name"], list(data["queues"]), sessions)


@dataclass
class FloodDeliveries:
    """Flood messages handed to one consumer connection, in the order it took them:
    parallel arrays (``who`` indexes ``names``), a few bytes a delivery."""

    consumer: str
    session: int
    server: int
    names: list[str] = field(default_factory=list)
    who: array[int] = field(default_factory=lambda: array("H"))
    seq: array[int] = field(default_factory=lambda: array("q"))
    redelivered: array[int] = field(default_factory=lambda: array("b"))
    at: array[float] = field(default_factory=lambda: array("d"))

    def add(self, publisher: str, seq: int, redelivered: bool, at: float) -> None:
        try:
            index = self.names.index(publisher)  # a handful of flood publishers
        except ValueError:
            index = len(self.names)
            self.names.append(publisher)
        self.who.append(index)
        self.seq.append(seq)
        self.redelivered.append(int(redelivered))
        self.at.append(at)

    def __len__(self) -> int:
        return len(self.seq)

    def rows(self) -> Iterator[tuple[str, int, bool, float]]:
        """(publisher, seq, redelivered, at) in recorded order."""
        names = self.names
        for who, seq, flag, at in zip(self.who, self.seq, self.redelivered, self.at, strict=True):
            yield names[who], seq, bool(flag), at

    def to_dict(self) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "session": self.session,
            "server": self.server,
            "names": list(self.names),
            "who": self.who.tolist(),
            "seq": self.seq.tolist(),
            "redelivered": self.redelivered.tolist(),
            "at": self.at.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FloodDeliveries:
        return cls(
            data["consumer"],
            data["session"],
            data["server"],
            list(data["names"]),
            array("H", data["who"]),
            array("q", data["seq"]),
            array("b", data["redelivered"]),
            array("d", data["at"]),
        )


@dataclass
class History:
    publishes: list[Publish] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    #: when the fault phase ended and the drain began, and when the drain was done
    drain_start: float | None = None
    drain_end: float | None = None
    drained: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    #: flood mode: the unconfirmed publishers and the deliveries of their messages
    flood: list[FloodPublisher] = field(default_factory=list)
    flood_deliveries: list[FloodDeliveries] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the flood keys only when there was a flood (older files match)."""
        data = asdict(replace(self, flood=[], flood_deliveries=[]))
        del data["flood"], data["flood_deliveries"]
        if self.flood or self.flood_deliveries:
            data["flood"] = [p.to_dict() for p in self.flood]
            data["flood_deliveries"] = [d.to_dict() for d in self.flood_deliveries]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> History:
        return cls(
            publishes=[Publish(**p) for p in data.get("publishes", [])],
            deliveries=[Delivery(**d) for d in data.get("deliveries", [])],
            faults=[Fault(**f) for f in data.get("faults", [])],
            drain_start=data.get("drain_start"),
            drain_end=data.get("drain_end"),
            drained=bool(data.get("drained", False)),
            meta=dict(data.get("meta", {})),
            flood=[FloodPublisher.from_dict(p) for p in data.get("flood", [])],
            flood_deliveries=[
                FloodDeliveries.from_dict(d) for d in data.get("flood_deliveries", [])
            ],
        )

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: Path) -> History:
        return cls.from_dict(json.loads(path.read_text()))


class Recorder:
    """The live history, appended to from the client threads under one lock."""

    def __init__(self) -> None:
        self.history = History()
        self._lock = threading.Lock()
        self.last_delivery = 0.0
        #: (consumer, session) -> where that connection's flood deliveries go
        self._flood_streams: dict[tuple[str, int], FloodDeliveries] = {}

    def publish(self, record: Publish) -> None:
        with self._lock:
            self.history.publishes.append(record)

    def delivery(self, record: Delivery) -> None:
        """A delivery; a flood message's goes into its connection's arrays instead."""
        with self._lock:
            if is_flood(record.publisher):
                key = (record.consumer, record.session)
                stream = self._flood_streams.get(key)
                if stream is None:
                    stream = FloodDeliveries(record.consumer, record.session, record.server)
                    self._flood_streams[key] = stream
                    self.history.flood_deliveries.append(stream)
                stream.add(record.publisher, record.seq, record.redelivered, record.at)
            else:
                self.history.deliveries.append(record)
            self.last_delivery = record.at

    def flood_publisher(self, name: str, queues: list[str]) -> FloodPublisher:
        """Register a flood publisher; its thread alone appends to the record returned."""
        record = FloodPublisher(name, list(queues))
        with self._lock:
            self.history.flood.append(record)
        return record

    def flood_session(
        self, publisher: FloodPublisher, server: int, first: int, opened: float
    ) -> FloodSession:
        """A new connection of ``publisher``, its first message numbered ``first``."""
        session = FloodSession(server, opened, first)
        with self._lock:
            publisher.sessions.append(session)
        return session

    def fault(self, record: Fault) -> Fault:
        with self._lock:
            self.history.faults.append(record)
        return record

    def counts(self) -> tuple[int, int]:
        """(publishes, deliveries) so far, for progress lines."""
        with self._lock:
            return len(self.history.publishes), len(self.history.deliveries)


def body(publisher: str, seq: int, pad: int = 0) -> bytes:
    """A message body naming its publisher and sequence number (``pad`` bytes more)."""
    return f"{publisher}:{seq}:".encode() + b"x" * pad


def parse(payload: bytes) -> tuple[str, int]:
    """The (publisher, seq) of ``body``; ValueError on anything else."""
    publisher, seq, _rest = payload.split(b":", 2)
    return publisher.decode(), int(seq)
