"""Cluster membership with real brokerd processes on loopback (DESIGN.md section 5).

Formation around the most senior primary, a late secondary, kill -9 and
SIGSTOP of the root, a 2-against-3 link partition, root hand-over, refused
links (checksum, secret), client admission while not ready, and start-up
errors. Heartbeat interval 0.3 s, timeout 1.0 s. Safety ("never two roots
that both believe they have quorum") is checked on every background sample,
not only at the end.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pika
import pytest
from pika.exceptions import AMQPConnectionError, ConnectionClosedByBroker

from tests.cluster_harness import (
    INTERVAL,
    TIMEOUT,
    MakeCluster,
    Sampler,
    brief,
    roots_with_quorum,
    write_cluster_file,
)

# serial: its timing is measured against the heartbeat, so it runs alone
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


# -- 3, 4: losing the root --------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_of_the_root_elects_the_next_senior_within_three_timeouts(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3, 1)
    cluster.start_all()
    first = cluster.wait_until(cluster.settled_root, timeout=8, what="formation")
    assert first == cluster.spid(0)
    survivors = [1, 2, 3]

    killed = cluster.kill(0)

    def new_root() -> str | None:
        root = cluster.agreed_root(survivors)
        return root if root not in (None, first) else None

    elected = cluster.wait_until(new_root, timeout=10, interval=0.02, what="a new root")
    elapsed = time.monotonic() - killed
    assert elected == cluster.spid(1), "the next senior primary must take over"
    assert elapsed < 3 * TIMEOUT, f"failover took {elapsed:.2f}s (limit {3 * TIMEOUT}s)"
    assert roots_with_quorum(cluster.sample(survivors)) == [1]

    def dead_everywhere() -> bool:
        # a survivor may follow the new root a moment before its own link to the
        # dead one has been refused (then the timeout would take it out anyway)
        views = cluster.sample(survivors)
        return len(views) == 3 and all(
            not p["active"] for v in views.values() for p in v["peers"] if p["spid"] == first
        )

    cluster.wait_until(dead_everywhere, timeout=TIMEOUT, what="the dead root inactive everywhere")
    assert cluster.root_overlaps() == []


@pytest.mark.slow
def test_sigstop_of_the_root_never_gives_two_roots(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3, 1)
    cluster.start_all()
    old = cluster.wait_until(cluster.settled_root, timeout=8, what="formation")
    assert old == cluster.spid(0)
    with Sampler(cluster) as sampler:
        time.sleep(0.3)
        stopped_at = cluster.pause(0)
        new = cluster.wait_until(
            lambda: (r := cluster.agreed_root([1, 2, 3])) not in (None, old) and r,
            timeout=10,
            what="a new root while the old one is stopped",
        )
        time.sleep(TIMEOUT)  # the old root stays frozen well past the timeout
        resumed_at = cluster.resume(0)
        again = cluster.wait_until(cluster.agreed_root, timeout=10, what="one root after SIGCONT")
        time.sleep(3 * INTERVAL + TIMEOUT)  # keep sampling the returned server
    assert new == cluster.spid(1)
    assert again == new, "the resumed old root must not take root back"
    assert cluster.agreed_root() == new
    assert roots_with_quorum(cluster.sample()) == [1]

    assert sampler.double_roots == [], sampler.double_roots
    assert cluster.root_overlaps() == []
    frozen = [s for s in sampler.samples if stopped_at < s.at < resumed_at]
    assert frozen and all(0 not in s.views for s in frozen), "a stopped server cannot answer"
    assert any(roots_with_quorum(s.views) == [1] for s in frozen)
    returned = [s for s in sampler.since(resumed_at) if 0 in s.views]
    assert len(returned) >= 5, "the old root was not sampled again after SIGCONT"
    # a stalled server abstains: the old root never claims root with quorum again
    claims = [s.at - resumed_at for s in returned if s.views[0]["is_root"] and s.views[0]["quorum"]]
    assert claims == [], f"old root claimed root with quorum {claims} s after SIGCONT"
    assert returned[-1].views[0]["root"] == new


@pytest.mark.slow
def test_a_resumed_old_root_does_not_order_changes_as_root(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3, 0)
    cluster.start_all()
    old = cluster.wait_until(cluster.settled_root, timeout=8, what="formation")
    assert old == cluster.spid(0)
    conn = connect(cluster.nodes[0].port)
    channel = conn.channel()
    outcome: dict[str, object] = {}

    def declare() -> None:  # the connection is used by this thread only from here on
        try:
            channel.queue_declare("declared-while-frozen")
            outcome["ok"] = True
        except Exception as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=declare)
    try:
        cluster.pause(0)
        # the others stop sending to the frozen root, so on SIGCONT the client's frame is
        # the first thing it reads (otherwise a peer's status may come first: a race)
        for index in (1, 2):
            cluster.ctl(index, "fault", "cut-link", old)
        thread.start()  # the declare waits in the frozen root's socket
        cluster.wait_until(
            lambda: cluster.agreed_root([1, 2]) not in (None, old), timeout=10, what="new root"
        )
        cluster.resume(0)
        thread.join(10)
        for index in (1, 2):
            cluster.ctl(index, "fault", "heal")
        cluster.wait_until(cluster.agreed_root, timeout=10, what="one root after SIGCONT")
        time.sleep(2 * INTERVAL)
    finally:
        cluster.resume(0)
        thread.join(10)
    assert not thread.is_alive(), "declare still waiting after the heal"
    if "ok" in outcome:
        conn.close()
        # declare-ok promises the queue is cluster state: the sitting root must have it
        probe = connect(cluster.nodes[1].port)
        try:
            probe.channel().queue_declare("declared-while-frozen", passive=True)
        finally:
            if probe.is_open:
                probe.close()
    else:  # refusing is allowed; ordering as a stale root is not
        assert "state ordered" not in cluster.nodes[0].process.log_text()  # type: ignore[union-attr]


# -- 5: partition ---------------------------------------------------------------------------


@pytest.mark.slow
def test_link_cuts_two_against_three(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(5, 0)
    cluster.start_all(stagger=0.1)
    old = cluster.wait_until(cluster.settled_root, timeout=10, what="formation")
    assert old == cluster.spid(0)
    minority, majority = [0, 1], [2, 3, 4]
    with Sampler(cluster) as sampler:
        cut_at = time.monotonic()
        for a in minority:
            for b in majority:
                cluster.ctl(a, "fault", "cut-link", cluster.spid(b))
                cluster.ctl(b, "fault", "cut-link", cluster.spid(a))
        # a cut ages out like a real one: the majority sees the old root until its
        # statuses are a timeout old, then elects among itself
        inside = {cluster.spid(i) for i in majority}
        new = cluster.wait_until(
            lambda: (r := cluster.agreed_root(majority)) in inside and r,
            timeout=3 * TIMEOUT + 2,
            what="majority root",
        )
        # each side counts the other inactive a timeout after its next beat was due:
        # the minority is not ready (its lease ran out) before it has also stopped
        # counting the majority's last statuses towards a quorum
        cluster.wait_until(
            lambda: (
                len(views := cluster.sample(minority)) == len(minority)
                and not any(v["ready"] or v["quorum"] for v in views.values())
            ),
            timeout=3 * TIMEOUT,
            what="the minority is neither ready nor in a quorum",
        )
        settled = time.monotonic()
        time.sleep(2 * TIMEOUT)  # the partition holds: keep sampling both sides
        healed_at = time.monotonic()
        for index in range(5):
            cluster.ctl(index, "fault", "heal")
        after = cluster.wait_until(
            cluster.agreed_root, timeout=4 * TIMEOUT, what="one root after heal"
        )
        time.sleep(2 * TIMEOUT)
        final = cluster.agreed_root()
    assert new == cluster.spid(2), "the most senior primary of the majority becomes root"
    assert sampler.double_roots == [], sampler.double_roots
    assert cluster.root_overlaps() == []
    partitioned = [s for s in sampler.samples if settled <= s.at < healed_at]
    assert len([s for s in partitioned if len(s.views) == 5]) >= 10
    for sample in partitioned:  # a view missing from a sample (slow answer) is skipped
        for index in minority:
            if (view := sample.views.get(index)) is not None:
                assert not view["ready"] and not view["is_root"], brief(view)
                assert not view["quorum"] and view["root"] is None, brief(view)
        for index in majority:
            if (view := sample.views.get(index)) is not None:
                # None only if a heartbeat came late on this busy machine; never another root
                assert view["root"] in (new, None), brief(view)
                assert not view["is_root"] or index == 2, brief(view)
    steady = [
        s for s in partitioned if all(s.views.get(i, {}).get("root") == new for i in majority)
    ]
    assert len(steady) >= 0.8 * len(partitioned), "the majority root did not hold"
    # the old root stepped down soon after the cut (it lost quorum at once on its side)
    old_claims = [
        s.at - cut_at for s in sampler.since(cut_at) if 0 in s.views and s.views[0]["is_root"]
    ]
    assert max(old_claims, default=0) < 2 * TIMEOUT, old_claims
    assert after == final == new, "healing must not move root away from the sitting root"


# -- 6: hand-over ---------------------------------------------------------------------------


@pytest.mark.slow
def test_root_disable_hands_over_and_enable_does_not_take_it_back(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3, 1)
    cluster.start_all()
    eldest = cluster.wait_until(cluster.settled_root, timeout=8, what="formation")
    assert eldest == cluster.spid(0)
    second = cluster.spid(1)
    with Sampler(cluster) as sampler:
        reply = cluster.ctl(0, "root", "disable")
        assert reply["root_enabled"] is False
        cluster.wait_until(
            lambda: cluster.agreed_root() == second, timeout=3 * TIMEOUT, what="hand-over"
        )
        view0 = cluster.status(0)
        assert view0 is not None
        assert view0["root_enabled"] is False and view0["is_root"] is False
        assert view0["root"] == second

        enabled_at = time.monotonic()
        reply = cluster.ctl(0, "root", "enable")
        assert reply["root_enabled"] is True
        time.sleep(5 * INTERVAL + TIMEOUT)
    assert sampler.double_roots == [], sampler.double_roots
    assert cluster.root_overlaps() == []
    after = sampler.since(enabled_at)
    assert len([s for s in after if len(s.views) == 4]) >= 10
    for sample in after:
        for view in sample.views.values():
            assert view["root"] in (second, None), f"root moved after enable: {brief(view)}"
    steady = [s for s in after if all(v["root"] == second for v in s.views.values())]
    assert len(steady) >= 0.8 * len(after), "the root did not hold after enable"
    final = cluster.sample()
    assert final[0]["root_enabled"] is True and final[0]["is_root"] is False
    assert cluster.agreed_root() == second


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


def connect(port: int, **kw: object) -> pika.BlockingConnection:
    params = pika.ConnectionParameters(
        "127.0.0.1",
        port,
        connection_attempts=1,
        socket_timeout=10,
        blocked_connection_timeout=10,
        **kw,
    )
    return pika.BlockingConnection(params)


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
def test_losing_quorum_blocks_publishers_and_holds_new_clients_until_healed(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3, 0, open_timeout=5)
    cluster.start_all()
    cluster.wait_until(cluster.settled_root, timeout=8, what="formation")
    existing = connect(cluster.nodes[1].port)
    events: list[str] = []
    existing.add_on_connection_blocked_callback(lambda *_: events.append("blocked"))
    existing.add_on_connection_unblocked_callback(lambda *_: events.append("unblocked"))

    def seen(event: str) -> bool:
        existing.process_data_events(time_limit=0.05)
        return event in events

    try:
        # server 1 ignores both others: it has no quorum and no root; 0 and 2 keep theirs
        for other in (0, 2):
            cluster.ctl(1, "fault", "cut-link", cluster.spid(other))
            cluster.ctl(other, "fault", "cut-link", cluster.spid(1))
        # blocked at once (its link to the root is cut), then the root ages out of its view
        cluster.wait_until(lambda: seen("blocked"), timeout=3 * TIMEOUT, what="connection.blocked")

        def rootless() -> bool:
            view = cluster.status(1)
            return view is not None and not view["ready"] and view["root"] is None

        cluster.wait_until(rootless, timeout=3 * TIMEOUT, what="server 1 without a root")
        # the other two keep their root (quorum 2 of 3)
        held = cluster.wait_until(
            lambda: cluster.settled_root([0, 2]), timeout=3 * TIMEOUT, what="root of 0 and 2"
        )
        assert held == cluster.spid(0)

        # a new client waits in connection.open and is admitted once the root is back
        result: dict[str, object] = {}

        def client() -> None:
            began = time.monotonic()
            try:
                conn = connect(cluster.nodes[1].port)
                result["waited"] = time.monotonic() - began
                conn.close()
            except Exception as exc:  # reported below
                result["error"] = exc

        thread = threading.Thread(target=client)
        thread.start()
        time.sleep(0.8)
        for index in range(3):
            cluster.ctl(index, "fault", "heal")
        thread.join(10)
        assert "error" not in result, result
        assert 0.7 <= result["waited"] < 5.0, result  # type: ignore[operator]
        cluster.wait_until(lambda: seen("unblocked"), timeout=3 * TIMEOUT, what="unblocked")
        assert events == ["blocked", "unblocked"]
        assert existing.is_open
        assert cluster.root_overlaps() == []
    finally:
        existing.close()


# -- a returning primary ------------------------------------------------------------------


@pytest.mark.slow
def test_a_restarted_primary_does_not_unseat_the_sitting_root(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3, 0)
    cluster.start_all()
    root = cluster.wait_until(cluster.settled_root, timeout=8, what="formation")
    cluster.kill(2)  # not the root
    time.sleep(7)  # long enough for the others' links to it to back off to several seconds
    with Sampler(cluster, indexes=[0, 1]) as sampler:
        restarted = time.monotonic()
        cluster.start(2)
        cluster.wait_until(
            lambda: cluster.agreed_root() == root, timeout=10, what="the restarted server joins"
        )
        time.sleep(2 * TIMEOUT)
    during = sampler.since(restarted)
    assert len(during) >= 10
    outages = [
        (round(s.at - restarted, 2), i, brief(v))
        for s in during
        for i, v in s.views.items()
        if not v["ready"] or v["root"] != root
    ]
    assert outages == [], f"{len(outages)} samples: first {outages[:2]} last {outages[-1:]}"


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
