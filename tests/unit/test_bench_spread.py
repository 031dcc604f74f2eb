"""The spread benchmark's choices, checked without starting a broker.

``python -m brokerd.bench.spread`` starts brokerd and RabbitMQ clusters;
these pin what it promises before it does (issue 23): where each queue's
clients connect for every cluster size, which set-ups a variant measures with
which queue arguments, and that the defaults still run the set-ups whose
labels earlier reports were written under.
"""

from __future__ import annotations

import pytest

from brokerd.bench.cluster import GUEST
from brokerd.bench.scenarios import Options
from brokerd.bench.spread import (
    BROKERD,
    CLASSIC,
    QUORUM,
    QUORUM_ALONE,
    RABBIT,
    RABBIT_ONE,
    SINGLE,
    build_runs,
    endpoints,
    parse_args,
    ratio_names,
    select_setups,
    variant,
)


def test_cross_with_three_servers_keeps_both_clients_off_the_owner() -> None:
    plans = [endpoints(i, 3, "cross") for i in range(6)]
    assert [owner for owner, _p, _c in plans] == [0, 1, 2, 0, 1, 2]
    for owner, publisher, consumer in plans:
        assert len({owner, publisher, consumer}) == 3


def test_cross_with_two_servers_puts_both_clients_on_the_other_one() -> None:
    plans = [endpoints(i, 2, "cross") for i in range(6)]
    assert [owner for owner, _p, _c in plans] == [0, 1, 0, 1, 0, 1]
    for owner, publisher, consumer in plans:
        assert publisher == consumer != owner


@pytest.mark.parametrize("servers", [1, 2, 3])
def test_local_and_a_single_server_keep_everything_on_the_owner(servers: int) -> None:
    for i in range(6):
        owner, publisher, consumer = endpoints(i, servers, "local")
        assert owner == publisher == consumer == i % servers
    assert {endpoints(i, 1, "cross") for i in range(6)} == {(0, 0, 0)}


def test_defaults_run_the_transient_set_ups_under_their_earlier_labels() -> None:
    args = parse_args([])
    assert (args.nodes, args.durable, args.layout, args.no_rabbitmq) == (3, False, "cross", False)
    setups = select_setups(args.nodes, args.durable, not args.no_rabbitmq)
    assert [s.label for s in setups] == [
        "brokerd, one server",
        "brokerd, 3 primaries, classic queues spread",
        "brokerd, 3 primaries, durable, no type (replicated, on its owner)",
        "RabbitMQ, 3 nodes, classic queues spread",
        "RabbitMQ, one node",
    ]
    assert [s.servers for s in setups] == [SINGLE, BROKERD, BROKERD, RABBIT, RABBIT_ONE]
    assert [s.arguments for s in setups] == [None, CLASSIC, None, None, None]
    assert [s.durable_queues for s in setups] == [False, False, True, False, False]
    assert not any(s.persistent for s in setups)
    assert variant(args) == "transient, 3 nodes, layout cross"


def test_durable_sets_replicated_brokerd_against_quorum_queues() -> None:
    args = parse_args(["--durable", "--nodes", "2", "--layout", "local"])
    setups = select_setups(args.nodes, args.durable, True)
    assert [(s.key, s.servers) for s in setups] == [
        ("one", SINGLE),
        ("cluster", BROKERD),
        ("rabbit", RABBIT),
        ("rabbit-one", RABBIT_ONE),
    ]
    assert all(s.persistent and not s.durable_queues for s in setups)
    assert [s.arguments for s in setups] == [None, None, QUORUM, QUORUM_ALONE]
    assert QUORUM_ALONE["x-quorum-initial-group-size"] == 1
    # the labels say what ran, so that a JSON report read alone is unambiguous
    assert all("persistent" in s.label for s in setups)
    assert "2 primaries" in setups[1].label and "2 nodes, quorum" in setups[2].label
    assert variant(args) == "durable, persistent, 2 nodes, layout local"


def test_every_ratio_names_set_ups_of_its_variant() -> None:
    for durable in (False, True):
        keys = {s.key for s in select_setups(2, durable, True)}
        lines = ratio_names(2, durable)
        assert all(top in keys and bottom in keys for top, bottom, _ in lines)
        assert any("RabbitMQ one node" in line for _t, _b, line in lines)
    brokerd_only = {s.key for s in select_setups(3, True, False)}
    assert brokerd_only == {"one", "cluster"}


def test_fewer_than_two_nodes_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--nodes", "1"])
    assert "--nodes must be 2 or more" in capsys.readouterr().err


def test_each_queue_is_its_own_declared_on_its_owner() -> None:
    # the runs are built within a millisecond: their names must differ all the same
    # (they once did not, and six publishers shared one queue)
    ports = [5001, 5002]
    runs = build_runs(ports, Options(), 6, "cross", QUORUM, persistent=True)
    assert len({name for run in runs for name in run.queue_names}) == 6
    for i, run in enumerate(runs):
        owner, publisher, consumer = endpoints(i, 2, "cross")
        assert run.url.port == ports[owner]
        assert run.opts.publish_url == GUEST.format(port=ports[publisher])
        assert run.opts.consume_url == GUEST.format(port=ports[consumer])
        assert run.opts.queue_arguments == QUORUM
        assert run.persistent
    transient = build_runs([5001], Options(), 2, "local", None, durable=True)
    assert [(r.persistent, r.opts.durable_queues) for r in transient] == [(False, True)] * 2


def test_a_group_size_adds_quorum_groups_on_both_clusters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = parse_args(["--durable", "--group-size", "2"])
    setups = select_setups(args.nodes, args.durable, True, args.group_size)
    grouped = [s for s in setups if s.key in ("cluster-group", "rabbit-group")]
    assert [(s.key, s.servers) for s in grouped] == [
        ("cluster-group", BROKERD),
        ("rabbit-group", RABBIT),
    ]
    assert all(
        s.arguments == {"x-queue-type": "quorum", "x-quorum-initial-group-size": 2}
        and s.persistent
        and "quorum queues of 2 members" in s.label
        for s in grouped
    )
    keys = {s.key for s in setups}
    lines = ratio_names(args.nodes, True, 2)
    assert all(top in keys and bottom in keys for top, bottom, _ in lines)
    assert variant(args).endswith("quorum groups of 2")
    with pytest.raises(SystemExit):
        parse_args(["--group-size", "2"])  # transient: quorum queues are durable
    assert "--group-size needs --durable" in capsys.readouterr().err
