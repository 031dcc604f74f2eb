"""Lane probes (``brokerd/cluster/probes.py``): a link whose data lane stops
delivering while its heartbeats and control lane go on is found and rebuilt."""

from __future__ import annotations

from brokerd.cluster import probes
from brokerd.cluster.probes import LaneProbe, stall_after
from tests.unit.membership_net import Net

TIMEOUT = 3.0


def test_echoes_answer_every_probe_up_to_theirs_and_never_a_later_one() -> None:
    probe = LaneProbe()
    first, second = probe.next(0.0), probe.next(1.0)
    assert first is not None and second is not None
    probe.echo(first)
    assert [n for n, _ in probe.waiting] == [2]
    assert probe.stalled(5.9, 5.0) is None  # the oldest waiting left at 1.0
    assert probe.stalled(6.5, 5.0) == 5.5
    assert stall_after(1.0) == 10.0 and stall_after(TIMEOUT) == 12.0
    probe.restart()  # a new connection: an echo from the old one answers nothing new
    third = probe.next(7.0)
    probe.echo(second)  # type: ignore[arg-type]
    assert [n for n, _ in probe.waiting] == [3] and third == (3).to_bytes(8, "big")
    probe.echo(b"short")  # a malformed echo changes nothing
    assert len(probe.waiting) == 1


def test_a_link_owing_too_many_echoes_sends_no_more_probes() -> None:
    probe = LaneProbe()
    bodies = [probe.next(float(i)) for i in range(probes.MAX_WAITING + 5)]
    assert bodies[probes.MAX_WAITING] is None and len(probe.waiting) == probes.MAX_WAITING


def test_a_data_lane_that_delivers_nothing_is_rebuilt_the_others_are_not() -> None:
    net = Net(3, seed=1)
    net.run(6)
    original = net.send

    def lossy(src: int, dst: int, kind: str, body: bytes) -> None:
        # 0's data lane to 1 takes nothing: probes vanish, statuses still arrive
        if (src, dst) == (0, 1) and kind == probes.PROBE:
            return
        original(src, dst, kind, body)

    net.send = lossy  # type: ignore[method-assign]
    net.run(stall_after(TIMEOUT) + 2.5)
    links = {(i, j): net.nodes[i].peers[f"s{j}"].link for i in range(3) for j in range(3) if i != j}
    stalled = {pair: link.dropped for pair, link in links.items() if link.dropped}  # type: ignore[union-attr]
    assert list(stalled) == [(0, 1)], stalled
    assert "data lane stalled" in stalled[(0, 1)][0]
    assert net.root() == 0  # statuses went on: nothing else changed


def test_a_peer_that_does_not_say_it_echoes_is_not_probed() -> None:
    """An older server (a rolling upgrade) never echoes: its links are left alone."""
    net = Net(3, seed=1)
    net.run(6)
    for node in net.nodes:
        node.peers["s1" if node.spid != "s1" else "s0"].link.server_properties.pop("lane_probes")  # type: ignore[union-attr]
    link = net.nodes[0].peers["s1"].link
    sent = link.probe.sent  # type: ignore[union-attr]
    net.run(stall_after(TIMEOUT) + 2.5)
    assert link.probe.sent == sent and link.dropped == []  # type: ignore[union-attr]
