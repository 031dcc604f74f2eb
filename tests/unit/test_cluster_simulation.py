"""Hypothesis drives a simulated cluster of real Membership objects through any
schedule of faults: pauses (resumed from a stale view first), kill -9 (its port
refuses), link cuts, heals, root disable/enable, graceful stops, on links whose
delays reach two seconds. After every event every running server evaluates, as
a client could make it do at any moment, and at most one may act as root. Once
the faults are over (healed, resumed, enabled, short delays) a majority left
alive elects exactly one root within a few timeouts, and every running server
follows it."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.examples import examples
from tests.unit.membership_net import Net

TIMEOUT = 3.0


@st.composite
def schedules(draw: st.DrawFn) -> tuple[int, int, float, list[tuple[Any, ...]]]:
    size = draw(st.sampled_from([3, 3, 5]))
    seed = draw(st.integers(0, 2**16))
    max_delay = draw(st.sampled_from([0.02, 0.3, 2.0]))
    server = st.integers(0, size - 1)
    action = st.one_of(
        st.tuples(st.just("run"), st.floats(0.0, 4.0)),
        st.tuples(st.just("pause"), server),
        st.tuples(st.just("resume"), server, st.booleans()),
        st.tuples(st.just("kill"), server),
        st.tuples(st.just("stop"), server),
        st.tuples(st.just("cut"), server, server),
        st.tuples(st.just("heal")),
        st.tuples(st.just("disable"), server),
        st.tuples(st.just("enable"), server),
    )
    return size, seed, max_delay, draw(st.lists(action, min_size=1, max_size=14))


def apply(net: Net, step: tuple[Any, ...]) -> None:
    kind = step[0]
    if kind == "run":
        net.run(step[1])
    elif kind == "pause":
        net.pause(step[1])
    elif kind == "resume" and step[1] in net.paused:
        net.resume(step[1], stale_first=step[2])
    elif kind == "kill" and len(net.dead) < len(net.nodes) // 2:
        net.kill(step[1])
    elif kind == "stop" and len(net.dead) < len(net.nodes) // 2 and step[1] not in net.dead:
        if step[1] not in net.paused:
            net.nodes[step[1]].step_down()
            net.run(0.05)
        net.kill(step[1])
    elif kind == "cut" and step[1] != step[2]:
        net.cut(step[1], step[2])
    elif kind == "heal":
        net.heal()
    elif kind in ("disable", "enable") and step[1] not in net.dead | net.paused:
        node = net.nodes[step[1]]
        node.root_enabled = kind == "enable"
        node.evaluate()


@settings(
    max_examples=examples(60, fast=8),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(schedules())
def test_never_two_roots_and_one_root_once_the_faults_end(
    schedule: tuple[int, int, float, list[tuple[Any, ...]]],
) -> None:
    size, seed, max_delay, steps = schedule
    net = Net(size, seed=seed, delay=(0.0005, max_delay))
    net.run(6)  # formation (checked too)
    for step in steps:
        apply(net, step)
    # the faults end: links heal and speed up, paused servers resume, all may be root
    net.heal()
    net.delay = (0.0005, 0.02)
    for index in sorted(net.paused):
        net.resume(index)
    for index in net.running():
        net.nodes[index].root_enabled = True
    net.run(max_delay + 4 * TIMEOUT)
    root = net.root()
    assert root is not None, [net.nodes[i].decision for i in net.running()]
    spid = net.nodes[root].spid
    assert all(net.nodes[i].current_root == spid for i in net.running())
    assert all(net.nodes[i].ready for i in net.running())
