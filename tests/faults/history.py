"""What a fault-injection run observed: publishes, deliveries and faults.

The checker reads nothing else, so a history can be written by hand in a
unit test, saved as JSON after a soak and checked again later. Times are
wall-clock seconds (``time.time()``), the clock the brokerd logs use too.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: publish outcomes; only ``ack`` promises anything
ACK = "ack"
NACK = "nack"
RETURNED = "returned"  # mandatory and taken by no queue
UNKNOWN = "unknown"  # the connection died (or timed out) before an answer
OUTCOMES = (ACK, NACK, RETURNED, UNKNOWN)


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

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

    def publish(self, record: Publish) -> None:
        with self._lock:
            self.history.publishes.append(record)

    def delivery(self, record: Delivery) -> None:
        with self._lock:
            self.history.deliveries.append(record)
            self.last_delivery = record.at

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
