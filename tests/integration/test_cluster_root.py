"""The root with real brokerd processes on loopback (DESIGN.md section 5): kill -9
and SIGSTOP of the root, a resumed old root, a 2-against-3 link partition, root
hand-over, and a restarted primary that must not unseat the sitting root.
Heartbeat interval 0.3 s, timeout 1.0 s. Safety ("never two roots that both
believe they have quorum") is checked on every background sample, not only at
the end.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.cluster_harness import (
    INTERVAL,
    TIMEOUT,
    MakeCluster,
)
from tests.support.clients import connect
from tests.support.sampler import Sampler, brief, roots_with_quorum

# serial: its timing is measured against the heartbeat, so it runs beside no
# browser, Spark or unit test (Makefile)
pytestmark = [pytest.mark.integration, pytest.mark.serial]


# -- 3, 4: losing the root --------------------------------------------------------------


@pytest.mark.slow
def test_kill_9_of_the_root_elects_the_next_senior_within_three_timeouts(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(3, 1)
    cluster.start_all()
    first = cluster.wait_until(cluster.quiet_root, timeout=8, what="formation")
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
    old = cluster.wait_until(cluster.quiet_root, timeout=8, what="formation")
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
        resuming = time.monotonic()
        resumed_at = cluster.resume(0)
        again = cluster.wait_until(cluster.agreed_root, timeout=10, what="one root after SIGCONT")
        time.sleep(3 * INTERVAL + TIMEOUT)  # keep sampling the returned server
    assert new == cluster.spid(1)
    assert again == new, "the resumed old root must not take root back"
    assert cluster.agreed_root() == new
    assert roots_with_quorum(cluster.sample()) == [1]

    assert sampler.double_roots == [], sampler.double_roots
    assert cluster.root_overlaps() == []
    # a sample still asking when SIGCONT went may fairly hold the old root's answer
    frozen = [s for s in sampler.samples if stopped_at < s.at and s.ended < resuming]
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
            channel.queue_declare("declared-while-frozen", durable=True)
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
    partitioned = [s for s in sampler.samples if settled <= s.at and s.ended < healed_at]
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
    eldest = cluster.wait_until(cluster.quiet_root, timeout=8, what="formation")
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
