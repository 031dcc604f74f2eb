"""The console and ``brokerd --workers`` hosts (issue 40): each worker links as its own
broker, ``worker-K@HOST:PORT``; the console groups them under their host, and a
worker that dies and is restarted by its host is a restart, not a lost broker."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from clusterapi import cluster, ingest
from clusterapi.ingest import LinkState
from clusterapi.linkparse import LinkProtocolError
from clusterapi.models import Alarm, Broker, BrokerEvent
from console.dashboard.rows import grouped_by_host
from tests.support.linkmessages import hello as link_hello

HOST = "10.0.0.5:5672"


def worker_hello(index: int, spid: str, workers: int = 2) -> dict[str, Any]:
    return link_hello(
        f"worker-{index}@{HOST}",
        spid,
        address=HOST,
        broker_type="standalone",
        cluster=None,
        checksum=None,
        host=HOST,
        worker=index,
        workers=workers,
    )


def linked(index: int, spid: str, channel: str) -> LinkState:
    broker, _ = ingest.register_hello(ingest.parse_hello(worker_hello(index, spid)), channel)
    return LinkState(broker.pk, broker.name, broker.broker_type, spid=broker.spid, host=broker.host)


def test_a_workers_hello_names_its_host() -> None:
    parsed = ingest.parse_hello(worker_hello(1, "s1"))
    assert (parsed.name, parsed.host, parsed.worker, parsed.workers) == (
        f"worker-1@{HOST}",
        HOST,
        1,
        2,
    )
    plain = ingest.parse_hello(link_hello("10.0.0.9:5672"))
    assert (plain.host, plain.worker, plain.workers) == ("", None, None)


@pytest.mark.parametrize(
    ("over", "error"),
    [
        ({"worker": None}, "needs 'worker'"),
        ({"worker": 2}, "needs 'worker'"),
        ({"worker": -1}, "needs 'worker'"),
        ({"workers": 0, "worker": 0}, "needs 'worker'"),
        ({"workers": 257}, "needs 'worker'"),
        ({"worker": "1"}, "wrong type"),
        ({"host": "", "worker": 1}, "need hello.host"),
        ({"host": "x" * 256}, "longer than 255"),
    ],
)
def test_a_malformed_worker_hello_is_refused(over: dict[str, Any], error: str) -> None:
    with pytest.raises(LinkProtocolError, match=error):
        ingest.parse_hello({**worker_hello(1, "s1"), **over})


@pytest.mark.django_db
def test_a_killed_worker_is_a_restart_not_a_lost_broker(in_memory_layer: Any) -> None:
    link = linked(1, "spid-a", "chan-1")
    assert ingest.link_closed(link, "chan-1", 1006) == "restarting"
    broker = Broker.objects.get(name=f"worker-1@{HOST}")
    assert broker.state == "up" and not broker.connected
    assert not Alarm.objects.filter(kind="broker.down").exists()
    lost = BrokerEvent.objects.get(kind="link_lost")
    assert f"a worker of {HOST}, which restarts it" in lost.message
    linked(1, "spid-b", "chan-2")  # its host restarted it
    restart = BrokerEvent.objects.get(kind="restart")
    assert restart.level == "warning" and restart.details["new_spid"] == "spid-b"
    assert not Alarm.objects.filter(kind="broker.down").exists()


@pytest.mark.django_db
def test_a_worker_its_host_does_not_bring_back_is_down_after_the_grace(
    in_memory_layer: Any, console_hearing: Any, settings: Any
) -> None:
    settings.BROKER_STALE_INTERVALS = 3
    link = linked(0, "spid-a", "chan-1")
    ingest.link_closed(link, "chan-1", 1006)
    Broker.objects.filter(pk=link.broker_id).update(
        last_seen=timezone.now() - dt.timedelta(seconds=5)
    )
    assert cluster.detect_stale() == []  # 5 s: past 3 heartbeats, within the grace
    Broker.objects.filter(pk=link.broker_id).update(
        last_seen=timezone.now() - dt.timedelta(seconds=cluster.WORKER_RESTART_GRACE + 1)
    )
    assert cluster.detect_stale() == [f"worker-0@{HOST}"]
    assert Alarm.objects.get(kind="broker.down").active


def _broker(name: str, **fields: Any) -> Broker:
    return Broker(name=name, state=fields.pop("state", "up"), **fields)


def test_the_broker_table_groups_workers_under_their_host() -> None:
    rows = grouped_by_host(
        [
            _broker("b.example:5672"),
            _broker(
                f"worker-1@{HOST}", host=HOST, worker=1, host_workers=3, counts={"connections": 4}
            ),
            _broker("a.example:5672"),
            _broker(
                f"worker-0@{HOST}", host=HOST, worker=0, host_workers=3, counts={"connections": 2}
            ),
            _broker(f"worker-2@{HOST}", host=HOST, worker=2, host_workers=3, state="down"),
        ]
    )
    assert [b.name for b in rows] == [
        f"worker-0@{HOST}",
        f"worker-1@{HOST}",
        f"worker-2@{HOST}",
        "a.example:5672",
        "b.example:5672",
    ]
    summary = rows[0].host_summary
    assert summary["up"] == 2 and summary["workers"] == 3 and summary["connections"] == 6
    assert all(b.host_summary is None for b in rows[1:])
