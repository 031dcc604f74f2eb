"""Cluster membership with real brokerd processes on loopback (DESIGN.md section 5).

Formation around the most senior primary, a late secondary, refused links
(checksum, secret), client admission while not ready, and start-up errors;
losing and handing over the root is in test_cluster_root.py. Heartbeat
interval 0.3 s, timeout 1.0 s. Safety ("never two roots that both believe they
have quorum") is checked on every background sample, not only at the end.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from pika.exceptions import AMQPConnectionError, ConnectionClosedByBroker

from tests.cluster_harness import (
    INTERVAL,
    TIMEOUT,
    MakeCluster,
    write_cluster_file,
)
from tests.support.clients import connect
from tests.support.sampler import Sampler, brief

# serial: its timing is measured against the heartbeat, so it runs beside no
# browser, Spark or unit test (Makefile)
pytestmark = [pytest.mark.integration, pytest.mark.serial]


def active_peers(view: dict) -> set[str]:
    return {p["spid"] for p in view["peers"] if p["active"]}


def alarm_kinds(view: dict | None) -> list[str]:
    return [a["kind"] for a in (view or {}).get("alarms", [])]


# -- 1, 2: formation ------------------------------------------------------------------


def test_three_primaries_two_secondaries_agree_on_the_eldest_primary(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3, 2)
    with Sampler(cluster) as sampler:
        cluster.start_all()
        eldest = cluster.spid(0)
        root = cluster.wait_until(cluster.agreed_root, timeout=8, what="one root everywhere")
        # every primary has voted by now (the youngest may still have been starting)
        settled = cluster.wait_until(cluster.settled_root, timeout=3 * TIMEOUT, what="settled")
    assert root == settled == eldest, f"root {root} is not the first-started primary {eldest}"

    views = cluster.sample()
    assert sorted(views) == [0, 1, 2, 3, 4]
    spids = {i: cluster.spid(i) for i in range(5)}
    primaries = {spids[i] for i in range(3)}
    for index, view in views.items():
        assert view["root"] == eldest and view["ready"] is True, brief(view)
        assert view["checksum"] == views[0]["checksum"]
        others = set(spids.values()) - {spids[index]}
        if index < 3:
            assert view["type"] == "primary"
            assert active_peers(view) == others, f"primary {index} sees {active_peers(view)}"
        else:
            # secondaries link to the primaries only, never to each other
            assert view["type"] == "secondary"
            assert active_peers(view) == primaries, f"secondary {index}"
            assert view["root_enabled"] is False
    assert [i for i, v in views.items() if v["is_root"]] == [0]
    assert views[0]["quorum"] is True

    # throughout formation: no secondary ever root, never two roots with quorum
    assert len(sampler.samples) > 10
    secondary_roots = [
        (s.at, i) for s in sampler.samples for i, v in s.views.items() if i >= 3 and v["is_root"]
    ]
    assert secondary_roots == []
    assert sampler.double_roots == []
    assert cluster.root_overlaps() == []


def test_a_late_secondary_joins_without_restarts(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3, 1)
    cluster.start_all()
    root = cluster.wait_until(cluster.settled_root, timeout=8, what="formation")
    pids_before = [n.process.proc.pid for n in cluster.nodes]  # type: ignore[union-attr]

    late = cluster.add_secondary()
    cluster.start(late)
    late_spid = cluster.spid(late)

    def joined() -> bool:
        views = cluster.sample()
        return (
            len(views) == 5
            and all(late_spid in active_peers(views[i]) for i in range(3))
            and views[late]["root"] == root
            and views[late]["ready"]
        )

    cluster.wait_until(joined, timeout=6, what="the late secondary joins")
    assert cluster.agreed_root() == root
    views = cluster.sample()
    for index in range(3):
        peer = next(p for p in views[index]["peers"] if p["spid"] == late_spid)
        assert peer["type"] == "secondary" and peer["active"]
    assert views[late]["is_root"] is False
    assert active_peers(views[late]) == {cluster.spid(i) for i in range(3)}
    # the first secondary does not link to the new one
    assert late_spid not in active_peers(views[3])
    # nobody was restarted
    assert [n.process.proc.pid for n in cluster.nodes[:4]] == pids_before  # type: ignore[union-attr]
    assert all(n.alive() for n in cluster.nodes)


def test_a_restarted_server_replaces_its_old_spid_everywhere(make_cluster: MakeCluster) -> None:
    """kill -9 and a restart at the same address: every other server shows one row
    for it, the new spid (naming the old one it replaces), no inactive ghost of the
    old one, and a true ``peers=`` count in its dump line (issue 25)."""
    cluster = make_cluster(3, 1)
    cluster.start_all()
    cluster.wait_until(cluster.settled_root, timeout=8, what="formation")
    root = cluster.index_of(cluster.settled_root())
    victim = next(i for i in (0, 1, 2) if i != root)
    old_spid = cluster.spid(victim)
    cluster.kill(victim)
    cluster.start(victim)
    new_spid = cluster.spid(victim)
    assert new_spid != old_spid
    others = [i for i in range(4) if i != victim]

    def one_row_each() -> bool:
        views = cluster.sample(others)
        if len(views) != 3:
            return False
        for view in views.values():
            spids = [p["spid"] for p in view["peers"]]
            if old_spid in spids or new_spid not in active_peers(view):
                return False
            if len(spids) != 3 or len(set(spids)) != 3:  # the other three servers
                return False
            row = next(p for p in view["peers"] if p["spid"] == new_spid)
            if row["replaces"] != [old_spid]:
                return False
        return True

    cluster.wait_until(one_row_each, timeout=15, what="the old spid retired everywhere")
    for index in others:
        dump = cluster.ctl(index, "dump")["dump"]
        assert "peers=3/3 " in dump, dump
        log = cluster.servers[index].log_text()
        assert f"spid={new_spid} replaces spid={old_spid}" in log


# -- 7, 8: refused links ---------------------------------------------------------------


def test_checksum_mismatch_is_refused_with_alarms_on_both_sides(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3, 0)
    cluster.start_all([0, 1])
    root = cluster.wait_until(lambda: cluster.agreed_root([0, 1]), timeout=8, what="formation")
    # the third known host starts with a known_hosts list of its own (one extra host)
    odd = write_cluster_file(
        cluster.base / "odd.toml",
        [*cluster.primary_ports, "127.0.0.1:1"],
        secret="cluster-secret-123",
    )
    cluster.start(2, file=odd)
    odd_spid = cluster.spid(2)
    with Sampler(cluster) as sampler:

        def alarmed() -> bool:
            views = cluster.sample()
            return len(views) == 3 and all(
                "config-mismatch" in alarm_kinds(v) for v in views.values()
            )

        cluster.wait_until(alarmed, timeout=6, what="config-mismatch alarms on both sides")
        time.sleep(2 * TIMEOUT)
    views = cluster.sample()
    assert views[2]["checksum"] != views[0]["checksum"]
    for index in (0, 1):
        alarm = next(a for a in views[index]["alarms"] if a["kind"] == "config-mismatch")
        assert "checksum" in alarm["message"]
    for sample in sampler.samples:
        for index in (0, 1):
            if index in sample.views:
                assert odd_spid not in active_peers(sample.views[index])
        if 2 in sample.views:
            assert active_peers(sample.views[2]) == set()
            assert not sample.views[2]["ready"]
    assert cluster.wait_until(lambda: cluster.agreed_root([0, 1]), timeout=3 * TIMEOUT) == root


def test_wrong_secret_is_refused_with_alarms_on_both_sides(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3, 0)
    cluster.start_all([0, 1])
    root = cluster.wait_until(lambda: cluster.agreed_root([0, 1]), timeout=8, what="formation")
    wrong = write_cluster_file(
        cluster.base / "wrong.toml", cluster.primary_ports, secret="not-the-secret"
    )
    cluster.start(2, file=wrong)
    wrong_spid = cluster.spid(2)
    with Sampler(cluster) as sampler:

        def alarmed() -> bool:
            views = cluster.sample()
            return (
                len(views) == 3
                and all(
                    any(k.startswith("inbound-auth") for k in alarm_kinds(views[i])) for i in (0, 1)
                )
                and any(k.startswith("link:") for k in alarm_kinds(views[2]))
            )

        cluster.wait_until(alarmed, timeout=6, what="auth alarms on both sides")
        time.sleep(2 * TIMEOUT)
    for sample in sampler.samples:
        for index in (0, 1):
            if index in sample.views:
                assert wrong_spid not in active_peers(sample.views[index])
        if 2 in sample.views:
            assert active_peers(sample.views[2]) == set()
    views = cluster.sample()
    # the refusing side names the refused login; the wrong side names the host it failed on
    link_alarms = [a for a in views[2]["alarms"] if a["kind"].startswith("link:")]
    assert {a["kind"] for a in link_alarms} >= {f"link:127.0.0.1:{cluster.primary_ports[0]}"}
    assert cluster.wait_until(lambda: cluster.agreed_root([0, 1]), timeout=3 * TIMEOUT) == root


# -- 9: client admission ------------------------------------------------------------------


@pytest.mark.slow
def test_client_admission_waits_then_541_then_admits_once_a_root_exists(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3, 0, open_timeout=2)
    cluster.start(0)
    started = time.monotonic()
    with pytest.raises((ConnectionClosedByBroker, AMQPConnectionError)) as info:
        connect(cluster.nodes[0].port)
    waited = time.monotonic() - started
    text = repr(info.value) + str(info.value)
    assert "not ready" in text, text
    assert "541" in text, text
    assert 1.8 <= waited < 6, f"connection.open waited {waited:.2f}s with open_timeout 2"
    view = cluster.status(0)
    assert view is not None and view["ready"] is False and view["quorum"] is False

    cluster.start(1)
    root = cluster.wait_until(lambda: cluster.agreed_root([0, 1]), timeout=8, what="a root")
    assert root == cluster.spid(0)
    for index in (0, 1):
        conn = connect(cluster.nodes[index].port)
        try:
            channel = conn.channel()
            channel.queue_declare("", exclusive=True)
        finally:
            conn.close()

    # only the cluster vhost is served
    with pytest.raises((ConnectionClosedByBroker, AMQPConnectionError)) as info:
        connect(cluster.nodes[1].port, virtual_host="elsewhere")
    text = repr(info.value) + str(info.value)
    assert "530" in text, text


@pytest.mark.slow
def test_a_server_cut_off_in_a_minority_sends_its_clients_away_until_healed(
    make_cluster: MakeCluster,
) -> None:
    """Cut off from both others, which keep their root: its publisher is blocked at
    once (its link to the root is cut), then, once the root has aged out of its view
    and it hears no quorum of primaries that have not ended, it is partitioned
    (RabbitMQ's pause_minority): the client is closed with 320 and a new one is
    refused at once, naming the cause, rather than held for as long as the cut
    lasts. Healed, it serves again. (Primaries that ended leave it holding its
    clients instead: ``test_quorum_loss_blocks_publishers_and_names_the_cause``.)"""
    cluster = make_cluster(3, 0, open_timeout=5)
    cluster.start_all()
    cluster.wait_until(cluster.settled_root, timeout=8, what="formation")
    existing = connect(cluster.nodes[1].port)
    events: list[str] = []
    existing.add_on_connection_blocked_callback(lambda *_: events.append("blocked"))
    closed: list[BaseException] = []

    def seen(event: str) -> bool:
        try:
            existing.process_data_events(time_limit=0.05)
        except ConnectionClosedByBroker as exc:
            closed.append(exc)
        return event in events or (event == "closed" and bool(closed))

    try:
        # server 1 ignores both others: it has no quorum and no root; 0 and 2 keep theirs
        cut = time.monotonic()
        for other in (0, 2):
            cluster.ctl(1, "fault", "cut-link", cluster.spid(other))
            cluster.ctl(other, "fault", "cut-link", cluster.spid(1))
        cluster.wait_until(lambda: seen("blocked"), timeout=3 * TIMEOUT, what="connection.blocked")
        cluster.wait_until(lambda: seen("closed"), timeout=3 * TIMEOUT, what="closed with 320")
        took = time.monotonic() - cut
        assert closed[0].args[0] == 320 and "partitioned" in closed[0].args[1], closed
        # the root ages out (the timeout after its next beat), then half an interval
        assert took < TIMEOUT + 2 * INTERVAL + 1.0, took
        view = cluster.status(1)
        assert view is not None and not view["ready"] and view["partitioned"], view
        # the other two keep their root (quorum 2 of 3)
        held = cluster.wait_until(
            lambda: cluster.settled_root([0, 2]), timeout=3 * TIMEOUT, what="root of 0 and 2"
        )
        assert held == cluster.spid(0)
        # a new client is refused at once, with the reason, not held in connection.open
        began = time.monotonic()
        with pytest.raises(AMQPConnectionError) as info:
            connect(cluster.nodes[1].port)
        assert time.monotonic() - began < 2.0
        assert "320" in repr(info.value) and "partitioned" in repr(info.value)
        for index in range(3):
            cluster.ctl(index, "fault", "heal")
        cluster.wait_until(lambda: cluster.settled_root(), timeout=3 * TIMEOUT, what="healed")
        view = cluster.status(1)
        assert view is not None and view["partitioned"] is None, view
        connect(cluster.nodes[1].port).close()
        assert cluster.root_overlaps() == []
    finally:
        if existing.is_open:
            existing.close()


# -- 10: start-up errors -------------------------------------------------------------------

GOOD_HOSTS = 'known_hosts = ["127.0.0.1:5999"]\n'


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        pytest.param(GOOD_HOSTS, [], "'secret'", id="missing-secret"),
        pytest.param(
            'secret = "short"\n' + GOOD_HOSTS, [], "at least 8 characters", id="short-secret"
        ),
        pytest.param(
            'secret = "long-enough"\nknown_hosts = []\n', [], "known_hosts", id="no-hosts"
        ),
        pytest.param(
            'secret = "long-enough"\n' + GOOD_HOSTS + "type = 'primary'\n",
            [],
            "type",
            id="type-in-file",
        ),
        pytest.param(
            'secret = "long-enough"\n' + GOOD_HOSTS + "[heartbeat]\ninterval = 2\ntimeout = 1\n",
            [],
            "must exceed the interval",
            id="timeout-below-interval",
        ),
        pytest.param('secret = "long-enough\n', [], "not valid TOML", id="bad-toml"),
        pytest.param(None, ["--type", "secondary"], "--cluster", id="secondary-without-cluster"),
        pytest.param(None, ["--enable-fault-injection"], "--cluster", id="faults-without-cluster"),
    ],
)
def test_bad_cluster_file_or_option_exits_2(
    tmp_path: Path, content: str | None, args: list[str], message: str
) -> None:
    cmd = [sys.executable, "-m", "brokerd", "--bind", "127.0.0.1", "--port", "0"]
    cmd += ["--data-dir", str(tmp_path / "data")]
    if content is not None:
        path = tmp_path / "cluster.toml"
        path.write_text(content)
        cmd += ["--cluster", str(path)]
    result = subprocess.run(cmd + args, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr


def test_missing_cluster_file_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    cmd = [sys.executable, "-m", "brokerd", "--bind", "127.0.0.1", "--port", "0"]
    cmd += ["--data-dir", str(tmp_path / "data"), "--cluster", str(missing)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert str(missing) in result.stderr


def test_cluster_members_lists_each_member_with_its_state(make_cluster: MakeCluster) -> None:
    """``brokerd ctl cluster members``: every known host and each secondary, with the
    run answering there, its type and state, and the root; a killed one goes down."""
    cluster = make_cluster(3, 1)
    cluster.start_all()
    root = cluster.wait_until(cluster.settled_root, timeout=10, what="formation")
    table = cluster.ctl(1, "cluster", "members")
    rows = {row["address"]: row for row in table["members"]}
    assert table["root"] == root and table["checksum"] == cluster.status(1)["checksum"]
    assert table["version"] == 0 and table["committed"] and table["forgotten"] == []
    assert set(rows) == {cluster.address(i) for i in range(4)}
    assert [rows[cluster.address(i)]["type"] for i in range(4)] == [
        "primary",
        "primary",
        "primary",
        "secondary",
    ]
    assert rows[cluster.address(1)]["state"] == "self"
    assert {rows[cluster.address(i)]["state"] for i in (0, 2, 3)} == {"up"}
    assert [r["spid"] for r in table["members"] if r["root"]] == [root]
    cluster.kill(2)

    def killed() -> str | None:
        state = {r["address"]: r["state"] for r in cluster.ctl(1, "cluster", "members")["members"]}[
            cluster.address(2)
        ]
        return state if state in ("down", "gone") else None

    assert cluster.wait_until(killed, timeout=3 * TIMEOUT + 5, what="the killed one down")
    home = str(cluster.nodes[1].home)
    text = subprocess.run(
        [sys.executable, "-m", "brokerd", "ctl", "--data-dir", home, "cluster", "members"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert text.returncode == 0, text.stderr
    assert "(root)" in text.stdout and "self" in text.stdout, text.stdout
