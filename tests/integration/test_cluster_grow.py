"""A cluster that grows and shrinks live (issue 43): primaries join with ``--join``
or DNS discovery and are admitted by the root; ``brokerd ctl cluster forget``
removes a stopped one; a forgotten server that returns is refused. Real brokerd
processes on loopback, heartbeat 0.3 s / 1.0 s; no member is restarted for any
change, and "never two roots" is checked on every background sample.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_harness import Cluster, MakeCluster
from tests.support.clients import confirmed_publishers, connect, drain_queues
from tests.support.sampler import Sampler

pytestmark = [pytest.mark.integration, pytest.mark.serial]


def members(cluster: Cluster, index: int) -> dict[str, Any]:
    return cluster.ctl(index, "cluster", "members")


def at_version(cluster: Cluster, index: int, version: int, count: int) -> dict[str, Any] | None:
    """The members ``index`` holds once they are at ``version``, ``count`` of them, and
    a majority holds that set."""
    held = members(cluster, index)
    rows = [r for r in held["members"] if r["type"] == "primary"]
    if held["version"] == version and held["committed"] and len(rows) == count:
        return held
    return None


def join(cluster: Cluster, through: int, extra: list[str] | None = None) -> int:
    index = cluster.add_primary()
    cluster.start(index, extra=["--join", cluster.address(through), *(extra or [])])
    return index


def wait_version(cluster: Cluster, indexes: list[int], version: int, count: int) -> None:
    for index in indexes:
        cluster.wait_until(
            lambda i=index: at_version(cluster, i, version, count),
            timeout=20,
            what=f"members version {version} ({count} primaries) on {index}",
        )


def test_three_primaries_grow_to_five_and_shrink_back_under_load_losing_nothing(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3)
    cluster.start_settled()
    runs = {i: cluster.spid(i) for i in range(3)}
    setup = connect(cluster.ports[0])
    queues = ["grow-quorum", "grow-classic"]
    ch = setup.channel()
    ch.queue_declare(queues[0], durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_declare(queues[1], durable=True)
    setup.close()
    publishers = [functools.partial(connect, cluster.ports[i]) for i in (1, 2)]
    with Sampler(cluster) as sampler, confirmed_publishers(publishers, queues) as confirmed:
        first = join(cluster, 0)
        wait_version(cluster, [0, 1, 2, first], 1, 4)
        second = join(cluster, 1)
        wait_version(cluster, [0, 1, 2, first, second], 2, 5)
        for index in (first, second):
            view = cluster.status(index, timeout=5)
            assert view is not None and view["listed"], f"{index} admitted but not listed"
            assert view["known_primaries"] == 5
        assert cluster.status(0, timeout=5)["known_primaries"] == 5
        cluster.wait_until(
            lambda: cluster.ctl(second, "ready") if cluster.ctl(second, "ready")["ready"] else None,
            timeout=20,
            what="the second joiner ready",
        )
        during = sum(len(c) for c in confirmed)
        # shrink: a planned stop, then the forget, one server at a time
        for index, version, count in ((second, 3, 4), (first, 4, 3)):
            address = cluster.address(index)
            cluster.stop(index)
            forgot = cluster.ctl(0, "cluster", "forget", address)
            assert forgot["committed"] and address not in forgot["members"], forgot
            wait_version(cluster, [0, 1, 2], version, count)
        held = members(cluster, 2)
        assert sorted(r["address"] for r in held["members"]) == sorted(
            cluster.address(i) for i in range(3)
        )
        assert {f["address"] for f in held["forgotten"]} == {
            cluster.address(first),
            cluster.address(second),
        }
        assert cluster.status(1, timeout=5)["known_primaries"] == 3
        after = sum(len(c) for c in confirmed)
    assert not sampler.double_roots, sampler.double_roots
    assert after > during > 0, "publishing went on through the changes"
    assert {i: cluster.spid(i) for i in range(3)} == runs, "a member was restarted"
    drain = connect(cluster.ports[0])
    got = drain_queues(drain, queues, timeout=20)
    drain.close()
    sent = set().union(*confirmed)
    lost = sent - set(got)
    assert not lost, f"{len(lost)} of {len(sent)} confirmed messages lost: {sorted(lost)[:5]}"


def test_a_forgotten_server_that_returns_is_refused_and_a_new_disk_joins(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3)
    cluster.start_settled()
    joiner = join(cluster, 2)
    wait_version(cluster, [0, 1, 2, joiner], 1, 4)
    address = cluster.address(joiner)
    with pytest.raises(Exception, match="running"):
        cluster.ctl(0, "cluster", "forget", address)  # refused while it runs
    cluster.stop(joiner)
    cluster.ctl(1, "cluster", "forget", address)
    wait_version(cluster, [0, 1, 2], 2, 3)

    cluster.start(joiner, extra=["--join", cluster.address(0)])  # its old disk

    def refused() -> str | None:
        view = cluster.status(joiner, timeout=5) or {}
        texts = [a["message"] for a in view.get("alarms", []) if a["kind"] == "forgotten"]
        return texts[0] if texts else None

    reason = cluster.wait_until(refused, timeout=15, what="the forgotten server's alarm")
    assert "was forgotten by this cluster" in reason and "remove its data directory" in reason
    assert address not in {r["address"] for r in members(cluster, 0)["members"]}
    assert members(cluster, 0)["version"] == 2
    view = cluster.status(joiner, timeout=5)
    assert view is not None and not view["ready"]
    cluster.stop(joiner)

    shutil.rmtree(cluster.nodes[joiner].home)  # a new disk: a new server
    cluster.start(joiner, extra=["--join", cluster.address(0)])
    wait_version(cluster, [0, 1, 2, joiner], 3, 4)
    assert not refused()


def test_a_primary_found_by_dns_discovery_joins_without_being_named(
    make_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_cluster(3)
    cluster.start_settled()
    # "localhost" resolves to this machine: the discovered address is node 0's port
    found = tmp_path / "discovery.toml"
    found.write_text(
        cluster.file.read_text()
        + f'\n[discovery]\ndns = "localhost"\nport = {cluster.ports[0]}\ninterval = 0.5\n'
    )
    index = cluster.add_primary()
    cluster.start(index, file=found)
    wait_version(cluster, [0, index], 1, 4)
    assert cluster.ctl(index, "ready")["ready"] in (True, False)  # answers either way
    cluster.wait_until(
        lambda: cluster.ctl(index, "ready")["ready"] or None, timeout=20, what="ready"
    )


def test_a_joiner_with_the_wrong_secret_is_never_admitted(
    make_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_cluster(3)
    cluster.start_settled()
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(cluster.file.read_text().replace(cluster_secret(cluster), "not-the-secret"))
    index = cluster.add_primary()
    cluster.start(index, file=wrong, extra=["--join", cluster.address(0)])

    def auth_alarm() -> list[str] | None:
        kinds = [a["message"] for a in (cluster.status(index, timeout=5) or {}).get("alarms", [])]
        return kinds if any("authentication" in k for k in kinds) else None

    cluster.wait_until(auth_alarm, timeout=15, what="the joiner's link refused")
    assert members(cluster, 0)["version"] == 0
    assert cluster.status(index, timeout=5)["listed"] is False


def cluster_secret(cluster: Cluster) -> str:
    for line in cluster.file.read_text().splitlines():
        if line.startswith("secret"):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no secret in the cluster file")


def queue_row(cluster: Cluster, index: int, name: str) -> dict[str, Any]:
    rows = cluster.ctl(index, "queues")["queues"]
    return next(r for r in rows if r["name"] == name)


def declare_grouped(cluster: Cluster, name: str, size: int | None = None) -> dict[str, Any]:
    """Declare quorum queue ``name`` through server 0 (a group of ``size``, or the
    default three) and wait until it is placed: its row, with its group and owner."""
    arguments: dict[str, Any] = {"x-queue-type": "quorum"}
    if size is not None:
        arguments["x-quorum-initial-group-size"] = size
    setup = connect(cluster.ports[0])
    setup.channel().queue_declare(name, durable=True, arguments=arguments)
    setup.close()
    return cluster.wait_until(
        lambda: (r := queue_row(cluster, 0, name))["group"] and r["owner_address"] and r,
        timeout=10,
        what=f"{name} placed",
    )


def test_a_quorum_queue_shrinks_off_a_member_under_load_and_off_a_forgotten_one(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3)
    cluster.start_settled()
    fourth = join(cluster, 0)
    wait_version(cluster, [0, 1, 2, fourth], 1, 4)
    row = declare_grouped(cluster, "shrinking")
    group, owner = row["group"], row["owner_address"]
    assert len(group) == 3
    leaving = next(a for a in group if a != owner)
    publishers = [functools.partial(connect, cluster.ports[i]) for i in (1, 2)]
    with confirmed_publishers(publishers, ["shrinking"]) as confirmed:
        cluster.wait_until(lambda: sum(map(len, confirmed)) > 50, timeout=10, what="traffic")
        shrunk = cluster.ctl(1, "queues", "shrink", leaving)
        assert [r["queue"] for r in shrunk["queues"]] == ["shrinking"], shrunk
        assert shrunk["queues"][0]["changed"], shrunk
        cluster.wait_until(
            lambda: all(
                queue_row(cluster, i, "shrinking")["group"] == [a for a in group if a != leaving]
                for i in (0, 1, 2, fourth)
            ),
            timeout=10,
            what="the new group everywhere",
        )
        again = cluster.ctl(2, "queues", "shrink", owner)
        assert not again["queues"][0]["changed"]
        assert "not be a majority" in again["queues"][0]["reason"]
        before = sum(map(len, confirmed))
        cluster.wait_until(
            lambda: sum(map(len, confirmed)) > before + 50, timeout=10, what="confirms go on"
        )
    drain = connect(cluster.ports[0])
    got = drain_queues(drain, ["shrinking"], timeout=20)
    drain.close()
    lost = set().union(*confirmed) - set(got)
    assert not lost, f"{len(lost)} confirmed messages lost"

    # a forgotten member leaves the groups naming it (a group of three: the queue here
    # is down to two, which keeps it; a new one of three is declared for this)
    row = declare_grouped(cluster, "forgetting")
    victim = next(
        i
        for i in (0, 1, 2, fourth)
        if cluster.address(i) in row["group"]
        and cluster.address(i) != row["owner_address"]
        and cluster.status(i, timeout=5)["is_root"] is False
    )
    address = cluster.address(victim)
    cluster.stop(victim)
    survivor = next(i for i in (0, 1, 2, fourth) if i != victim)
    cluster.ctl(survivor, "cluster", "forget", address)
    cluster.wait_until(
        lambda: address not in queue_row(cluster, survivor, "forgetting")["group"],
        timeout=10,
        what="the forgotten member out of the group",
    )
    assert len(queue_row(cluster, survivor, "forgetting")["group"]) == 2


def test_a_quorum_queue_grows_onto_a_joined_primary_that_then_holds_it(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3)
    cluster.start_settled()
    row = declare_grouped(cluster, "growing", 2)
    owner_address, other = (
        row["owner_address"],
        next(a for a in row["group"] if a != row["owner_address"]),
    )
    fourth = join(cluster, 0)
    wait_version(cluster, [0, 1, 2, fourth], 1, 4)
    by_address = {cluster.address(i): i for i in (0, 1, 2)}
    clients = [i for i in (0, 1, 2) if cluster.address(i) != other]
    publishers = [functools.partial(connect, cluster.ports[i]) for i in clients]
    with confirmed_publishers(publishers, ["growing"]) as confirmed:
        cluster.wait_until(lambda: sum(map(len, confirmed)) > 100, timeout=10, what="traffic")
        grown = cluster.ctl(1, "queues", "grow", cluster.address(fourth))
        assert [r["queue"] for r in grown["queues"]] == ["growing"] and grown["queues"][0][
            "changed"
        ], grown
        assert queue_row(cluster, fourth, "growing")["group"] == [
            *row["group"],
            cluster.address(fourth),
        ]
        # the old second member leaves: confirms now need the new one, which counts
        # only once it holds the queue
        cluster.stop(by_address[other])
        before = sum(map(len, confirmed))
        cluster.wait_until(
            lambda: sum(map(len, confirmed)) > before + 100,
            timeout=20,
            what="confirms on the owner and the grown member",
        )
    owner = by_address[owner_address]
    moved = cluster.ctl(owner, "queue", "move", "growing", cluster.spid(fourth))
    assert moved["to"], moved
    cluster.wait_until(
        lambda: queue_row(cluster, owner, "growing")["owner_address"] == cluster.address(fourth),
        timeout=10,
        what="the queue on the grown member",
    )
    drain = connect(cluster.ports[owner])
    got = drain_queues(drain, ["growing"], timeout=20)
    drain.close()
    lost = set().union(*confirmed) - set(got)
    assert not lost, f"{len(lost)} of {sum(map(len, confirmed))} confirmed messages lost"


def test_the_root_grows_groups_below_the_target_size_onto_caught_up_members(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3)
    # a top-level key: before the file's tables
    cluster.file.write_text("quorum_target_group_size = 3\n" + cluster.file.read_text())
    cluster.start_settled()
    setup = connect(cluster.ports[0])
    setup.channel().queue_declare(
        "targeted",
        durable=True,
        arguments={"x-queue-type": "quorum", "x-quorum-initial-group-size": 1},
    )
    setup.close()
    grown = cluster.wait_until(
        lambda: len(g := queue_row(cluster, 2, "targeted")["group"] or []) == 3 and g,
        timeout=15,
        what="the group grown to the target",
    )
    assert sorted(grown) == sorted(cluster.address(i) for i in range(3))


def test_over_tls_links_a_joiner_with_the_cluster_cas_certificate_is_admitted(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3, tls=True)
    cluster.start_settled()
    index = join(cluster, 0)  # its links present the file's default certificate
    wait_version(cluster, [0, index], 1, 4)
    assert cluster.address(index) in {r["address"] for r in members(cluster, 1)["members"]}
