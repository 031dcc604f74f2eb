"""The flood benchmark's pure parts: where clients connect, what counts as a failure line.

The flood itself starts brokers (``python -m brokerd.bench.flood``); these
check the layout it promises (issue 21: publisher and consumer of a queue on
two servers other than each other) and the log counting its figures rest on.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime

import pytest

from brokerd.bench.flood.logs import scan_log
from brokerd.bench.flood.plan import FloodOptions, placement
from brokerd.bench.flood.report import render_markdown
from brokerd.bench.flood.status import percentile


def test_placement_spreads_queues_and_separates_publisher_from_consumer() -> None:
    plan = placement(6, 6, 3)
    assert plan.home == [0, 1, 2, 0, 1, 2]
    for q, server in plan.publishers:
        assert server != plan.consumer[q]
        assert plan.consumer[q] != plan.home[q]
    # every server carries as many publishers as consumers
    assert sorted(s for _q, s in plan.publishers) == sorted(plan.consumer)
    assert [q for q, _s in plan.publishers] == list(range(6))


def test_placement_more_publishers_than_queues_and_one_server() -> None:
    plan = placement(2, 5, 3)
    assert [q for q, _s in plan.publishers] == [0, 1, 0, 1, 0]
    assert all(s != plan.consumer[q] for q, s in plan.publishers)
    single = placement(6, 6, 1)
    assert set(single.home) | set(single.consumer) | {s for _q, s in single.publishers} == {0}
    with pytest.raises(ValueError):
        placement(0, 1, 3)


def _line(seconds: int, text: str) -> str:
    stamp = datetime(2026, 11, 26, 17, 1, seconds).strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp},000 WARNING brokerd.cluster: {text}\n"


def _t(seconds: int) -> float:
    return datetime(2026, 11, 26, 17, 1, seconds).timestamp()


def test_scan_log_counts_signatures_by_phase() -> None:
    log = [
        _line(1, "root changed spid=a from=None to=a"),  # start-up: before the flood
        _line(5, "ctl command=status args=[]"),
        _line(6, "root released spid=a reason=lease: fewer than a quorum of primaries echoed"),
        _line(7, "root released spid=a reason=no quorum: 1 of 3 primaries active"),
        _line(7, "replica b left the set (stopped acking) at seq=3"),
        _line(8, "forwards to a failed: 1234 unsettled (session voided)"),
        _line(8, "session voided by b (epoch 2): forwards nacked"),
        "Traceback (most recent call last):\n",
        _line(
            9,
            "connection.error conn=7 peer=x code=320 text='cluster root moved while "
            "deliveries were in flight'",
        ),
        _line(20, "root released spid=a reason=lease: fewer than a quorum"),
    ]
    out = scan_log(log, start=_t(5), end=_t(15), context=2)
    sig = out["signatures"]
    assert sig["root_changed"] == {"before": 1, "during": 0, "after": 0, "first": None}
    assert (sig["root_released"]["during"], sig["root_released"]["after"]) == (2, 1)
    assert sig["lease_lost"]["during"] == 1 and sig["lease_lost"]["after"] == 1
    assert sig["no_quorum"]["during"] == 1
    assert sig["replica_dropped"]["during"] == 1  # one line, even with both phrases
    assert sig["session_voided"]["during"] == 2  # the forwards line names the cause too
    assert sig["forwards_failed"]["during"] == 1
    assert out["forwards_unsettled"] == 1234
    assert sig["close_320"]["during"] == 1 and sig["root_moved"]["during"] == 1
    first = sig["root_released"]["first"]
    assert first["t"] == _t(6)
    # context: the previous lines without the benchmark's own status polls
    assert len(first["lines"]) == 2 and "ctl command" not in "".join(first["lines"])
    assert first["lines"][-1].endswith("echoed")


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0


def test_render_markdown_shows_totals_and_errors() -> None:
    run = {
        "target": "single",
        "label": "brokerd single server",
        "queues": [],
        "published": 360_000,
        "confirmed": None,
        "delivered": 90_000,
        "left": 0,
        "lost": 270_000,
        "delivered_fraction": 0.25,
        "deliveries_per_s": 1000.0,
        "delivery_window_s": 90.0,
        "go_to_last_delivery_s": 91.0,
        "deliveries_per_s_from_go": 989.0,
        "publish_taken_s": 3.0,
        "consumer_closes": 2,
        "timed_out": False,
        "workers": [],
        "logs": [],
        "status": [],
    }
    text = render_markdown(
        [run, {"target": "rabbitmq", "label": "RabbitMQ", "error": "boom"}], FloodOptions()
    )
    assert "| brokerd single server | 360,000 | - | 90,000 | 0 | 270,000 | 25.0 % |" in text
    assert "error: boom" in text


@pytest.mark.integration  # starts a Python process
def test_flood_workers_do_not_import_the_broker() -> None:
    # every module of the package (not only its bare __init__); __main__ would run the tool
    code = (
        "import importlib, pkgutil, sys, brokerd.bench.flood as flood\n"
        "names = {m.name for m in pkgutil.iter_modules(flood.__path__)} - {'__main__'}\n"
        "assert {'cli', 'run', 'workers', 'targets', 'status', 'report'} <= names, names\n"
        "for name in names:\n"
        "    importlib.import_module(f'brokerd.bench.flood.{name}')\n"
        "bad = [m for m in sys.modules if m.startswith("
        "('brokerd.model', 'brokerd.protocol', 'brokerd.server', 'brokerd.wire', "
        "'brokerd.cluster', 'brokerd.store'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
