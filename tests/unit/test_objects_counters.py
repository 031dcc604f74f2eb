"""A queue's Enqueued/Delivered on the console keep counting across owner moves, owner
restarts, console restarts and counter resets: they never go backwards."""

from __future__ import annotations

import time
from typing import Any

import pytest

from clusterapi import ingest, objects, snapshots
from clusterapi.ingest import LinkState
from clusterapi.models import QueueSample, QueueSnapshot
from tests.support.linkmessages import hello as link_hello

pytestmark = pytest.mark.django_db

A, B = "127.0.0.1:5701", "127.0.0.1:5702"


def hello(name: str, spid: str, started: float) -> dict[str, Any]:
    return link_hello(name, spid, address=name, start_time=started)


class Broker:
    """One broker's link to the console: says hello, then sends full statuses."""

    def __init__(self, name: str, spid: str, started: float) -> None:
        self.name, self.spid, self.started = name, spid, started
        self.link = self.connect()
        self.seq = 0

    def connect(self) -> LinkState:
        """A new link (the console restarted, or the broker reconnected)."""
        broker, _ = ingest.register_hello(
            ingest.parse_hello(hello(self.name, self.spid, self.started)), f"chan-{self.name}"
        )
        self.seq = 0
        return LinkState(broker.pk, broker.name, broker.broker_type, spid=self.spid)

    def restart(self, spid: str) -> None:
        self.spid, self.started = spid, time.time()
        self.link = self.connect()

    def report(self, enqueued: int, delivered: int, master: bool, shared: bool = True) -> None:
        entry = {
            "vhost": "/",
            "name": "orders",
            "durable": True,
            "exclusive": False,
            "auto_delete": False,
            "shared": shared,
            "master": master,
            "messages": 0,
            "unacked": 0,
            "consumers": 0,
            "enqueued": enqueued,
            "delivered": delivered,
            "arguments": {},
        }
        message = {
            "v": 1,
            "type": "status",
            "seq": self.seq,
            "time": time.time(),
            "full": True,
            "view": {"is_root": master, "ready": True, "root_enabled": True, "peers": []},
            "counts": {},
            "totals": {},
            "rates": {},
            "queues": [entry],
            "exchanges": [],
            "bindings": [],
        }
        self.seq += 1
        assert not ingest.apply_status(self.link, message).resync


def shown() -> tuple[int, int]:
    """Enqueued and delivered as the queue list and the queue page show them."""
    row = objects.queues().get(vhost="/", name="orders")
    return row.enqueued, row.delivered


def test_a_move_to_another_owner_keeps_counting(settings) -> None:
    settings.QUEUE_SAMPLE_SECONDS = 0
    a = Broker(A, "spid-a", time.time() - 60)
    b = Broker(B, "spid-b", time.time() - 60)
    a.report(100, 90, master=True)
    b.report(30, 25, master=False)  # a proxy counts what passes through it
    assert shown() == (100, 90)
    # the move: b is the owner now and reports its own counters, a is a proxy
    b.report(36, 29, master=True)
    a.report(101, 91, master=False)
    assert shown() == (106, 94)  # where it was, plus what b counted since
    b.report(50, 45, master=True)
    assert shown() == (120, 110)
    # and back again: a carries on from the queue's count, not from its own
    a.report(103, 92, master=True)
    b.report(51, 46, master=False)
    assert shown() == (122, 111)
    # the lake keeps each broker's own counters
    latest = QueueSample.objects.filter(broker__name=B).order_by("-time", "-pk").first()
    assert latest is not None and latest.enqueued_total == 51


def test_a_restarted_owner_adds_to_the_count() -> None:
    a = Broker(A, "spid-a", time.time() - 60)
    a.report(100, 90, master=True)
    a.restart("spid-a2")  # counts from 0 again; it held the queue before and after
    a.report(7, 5, master=True)
    assert shown() == (107, 95)
    a.report(10, 9, master=True)
    assert shown() == (110, 99)


def test_a_console_restart_neither_loses_nor_doubles_an_unmoved_queue() -> None:
    a = Broker(A, "spid-a", time.time() - 60)
    a.report(100, 90, master=True, shared=False)
    a.link = a.connect()  # the same run of the broker, a new link
    a.report(140, 120, master=True, shared=False)
    assert shown() == (140, 120)


def test_a_console_restart_after_a_move_never_goes_backwards() -> None:
    a = Broker(A, "spid-a", time.time() - 60)
    b = Broker(B, "spid-b", time.time() - 60)
    a.report(100, 90, master=True)
    b.report(0, 0, master=False)
    b.report(5, 5, master=True)
    a.report(100, 90, master=False)
    assert shown() == (105, 95)
    b.link = b.connect()
    b.report(8, 8, master=True)  # b's own counter is far below the queue's count
    assert shown() == (105, 95)
    b.report(20, 18, master=True)
    assert shown() == (117, 105)


def test_a_counter_that_drops_is_a_reset() -> None:
    a = Broker(A, "spid-a", time.time() - 60)
    a.report(100, 90, master=True)
    a.report(3, 2, master=True)
    assert shown() == (103, 92)


def test_rates_of_a_move_are_the_owners_traffic_not_the_jump(settings) -> None:
    settings.QUEUE_SAMPLE_SECONDS = 0
    a = Broker(A, "spid-a", time.time() - 60)
    b = Broker(B, "spid-b", time.time() - 60)
    a.report(1000, 1000, master=True)
    b.report(10, 10, master=False)
    b.report(12, 12, master=True)
    sample = QueueSample.objects.filter(broker__name=B).order_by("-time", "-pk").first()
    assert sample is not None and sample.enqueued_total == 12 and 0 < sample.rate_in < 1000
    assert QueueSnapshot.objects.get(broker__name=B).enqueued == 1002


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # a proxy keeps its row's count (a new one starts at the queue's)
        ({"raw": 9, "master": False, "before": 5, "stored": 40, "floor": 50}, 40),
        ({"raw": 9, "master": False, "before": None, "stored": None, "floor": 50}, 50),
        # the owner, status after status: what it counted since
        ({"raw": 60, "master": True, "before": 50, "stored": 70, "was_master": True}, 80),
        ({"raw": 4, "master": True, "before": 50, "stored": 70, "was_master": True}, 74),
        # the owner since the last status: from the queue's count
        ({"raw": 14, "master": True, "before": 10, "stored": 70, "floor": 90}, 94),
        # the first status of a link: a new run adds, the same run never exceeds its counter
        ({"raw": 5, "master": True, "before": None, "stored": 70, "restarted": True}, 75),
        ({"raw": 80, "master": True, "before": None, "stored": 70}, 80),
        ({"raw": 5, "master": True, "before": None, "stored": 70}, 70),
        ({"raw": 5, "master": True, "before": None, "stored": None}, 5),
    ],
)
def test_carried(args: dict[str, Any], expected: int) -> None:
    defaults = {"was_master": False, "floor": 0, "restarted": False}
    result = snapshots.carried(**{**defaults, **args})
    assert result == expected
    assert result >= (args.get("stored") or 0)
