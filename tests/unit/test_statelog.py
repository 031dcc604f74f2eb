"""The compacted state log replays to the same wiring as the full log."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.wiring import statelog as sl
from brokerd.cluster.wiring.statelog import Entry, compact, replay
from tests.support.examples import examples

NAMES = ["a", "b", "c", "amq.topic"]


@st.composite
def logs(draw: st.DrawFn) -> list[Entry]:
    ops = draw(st.lists(st.sampled_from(sl.OPS), min_size=0, max_size=60))
    entries = []
    for seq, op in enumerate(ops, start=1):
        entries.append(
            Entry(
                seq=seq,
                op=op,
                vhost=draw(st.sampled_from(["/", "/", "v2"])),
                name=draw(st.sampled_from(NAMES)),
                source=draw(st.sampled_from(NAMES)),
                routing_key=draw(st.sampled_from(["", "k", "k.#"])),
                arguments=draw(st.sampled_from([(), (("x-match", "any"),)])),
                props=draw(st.sampled_from([(), (("durable", True),), (("epoch", 2),)])),
                spid=draw(st.sampled_from(["", "s1", "s2"]))
                if "meta" in op or op in (sl.SERVER_GONE, sl.QUEUE_PLACE, sl.QUEUE_DECLARE)
                else "",
            )
        )
    return entries


@settings(max_examples=examples(600), deadline=None)
@given(logs())
def test_compacted_log_replays_to_the_same_wiring(entries: list[Entry]) -> None:
    assert replay(compact(entries)) == replay(entries)


@settings(max_examples=examples(200), deadline=None)
@given(logs())
def test_compaction_is_idempotent_and_keeps_order(entries: list[Entry]) -> None:
    once = compact(entries)
    assert compact(once) == once
    assert [e.seq for e in once] == sorted(e.seq for e in once)
    assert len(once) <= len(entries)


def test_delete_cancels_declare_and_its_bindings() -> None:
    log = [
        Entry(1, sl.EXCHANGE_DECLARE, name="x"),
        Entry(2, sl.QUEUE_DECLARE, name="q"),
        Entry(3, sl.QUEUE_BIND, name="q", source="x", routing_key="k"),
        Entry(4, sl.META_BIND, name="private", source="x", routing_key="k", spid="s9"),
        Entry(5, sl.EXCHANGE_DELETE, name="x"),
    ]
    assert [e.seq for e in compact(log)] == [2]
    assert replay(log).queue_bindings == set()


def test_bindings_to_predeclared_exchanges_survive() -> None:
    log = [
        Entry(1, sl.QUEUE_DECLARE, name="q"),
        Entry(2, sl.QUEUE_BIND, name="q", source="amq.topic", routing_key="a.#"),
    ]
    assert [e.seq for e in compact(log)] == [1, 2]
    assert len(replay(log).queue_bindings) == 1


def test_server_gone_drops_its_meta_bindings_only() -> None:
    log = [
        Entry(1, sl.EXCHANGE_DECLARE, name="x"),
        Entry(2, sl.META_BIND, name="p1", source="x", spid="s1"),
        Entry(3, sl.META_BIND, name="p2", source="x", spid="s2"),
        Entry(4, sl.SERVER_GONE, spid="s1"),
    ]
    assert [e.seq for e in compact(log)] == [1, 3]


def test_the_latest_placement_survives_compaction_with_its_declare() -> None:
    log = [
        Entry(1, sl.QUEUE_DECLARE, name="q", spid="s1"),
        Entry(2, sl.QUEUE_PLACE, name="q", spid="", props=(("epoch", 2), ("home", "s1"))),
        Entry(3, sl.QUEUE_PLACE, name="q", spid="s1", props=(("epoch", 3),)),
        Entry(4, sl.QUEUE_DECLARE, name="r"),
    ]
    assert [e.seq for e in compact(log)] == [1, 3, 4]
    assert replay(log).owners == {("/", "q"): ("s1", (("epoch", 3),))}


def test_a_deleted_queue_takes_its_placement_with_it() -> None:
    log = [
        Entry(1, sl.QUEUE_DECLARE, name="q", spid="s1"),
        Entry(2, sl.QUEUE_PLACE, name="q", spid="s2", props=(("epoch", 2),)),
        Entry(3, sl.QUEUE_DELETE, name="q"),
        Entry(4, sl.QUEUE_PLACE, name="q", spid="s3"),
    ]
    assert compact(log) == []
    assert replay(log).owners == {}
