"""The message plane's link records: every record survives a round trip, and a
malformed batch is refused whole (never a crash, never a partial apply)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from brokerd.cluster.plane import records as rec
from tests.support.examples import examples

text = st.text(max_size=40)
blob = st.binary(max_size=300)
u32 = st.integers(min_value=0, max_value=2**32 - 1)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
flag = st.booleans()

RECORDS = st.one_of(
    st.builds(
        rec.Forward,
        u64,
        text,
        st.lists(st.tuples(text, text), max_size=5),
        text,
        text,
        blob,
        blob,
        flag,
    ),
    st.builds(
        lambda f, n, ok, r: rec.Settle(f, f + n, ok, r),
        st.integers(0, 2**40),
        st.integers(0, 1000),
        flag,
        u32,
    ),
    st.builds(rec.Consume, u64, text, text, u32, flag, flag, flag, text),
    st.builds(rec.Cancel, text),
    st.builds(rec.Get, u64, text, flag),
    st.builds(rec.Ack, st.lists(u64, min_size=1, max_size=20)),
    st.builds(rec.Reject, st.lists(u64, min_size=1, max_size=20), flag),
    st.builds(rec.Credit, text, u32),
    st.builds(rec.Purge, u64, text),
    st.builds(rec.Stat, u64, text),
    st.builds(rec.Reply, u64, st.integers(0, 65535), text, u32, u32, flag),
    st.builds(rec.Deliver, text, u64, flag, text, text, blob, blob),
    st.builds(rec.Got, u64, u64, flag, u32, text, text, blob, blob),
    st.builds(rec.Session, u64),
    st.builds(rec.Void, u64),
    st.builds(rec.Drained, text, u64),
    st.builds(
        rec.Replicate,
        u64,
        st.sampled_from([rec.R_ENQUEUE, rec.R_SYNC]),
        text,
        u64,
        st.integers(0, 7),
        text,
        text,
        blob,
        blob,
    ),
    st.builds(
        rec.Replicate,
        u64,
        st.sampled_from([rec.R_ACQUIRE, rec.R_SETTLE, rec.R_REQUEUE, rec.R_PURGE, rec.R_RESET]),
        text,
        u64,
        st.integers(0, 7),
    ),
    st.builds(rec.Replicated, u64),
)


def _fold_acks(records: list[rec.Record]) -> list[rec.Record]:
    """What a batch makes of consecutive acks: one record."""
    out: list[rec.Record] = []
    for r in records:
        if isinstance(r, rec.Ack) and out and isinstance(out[-1], rec.Ack):
            out[-1] = rec.Ack(out[-1].ids + r.ids)
        else:
            out.append(r)
    return out


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(RECORDS, max_size=12))
def test_every_record_round_trips_in_order(records: list[rec.Record]) -> None:
    batch = rec.Batch()
    for r in records:
        batch.record(r)
    assert rec.decode(batch.take()) == _fold_acks(records)
    assert not batch  # take() empties it


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(RECORDS, min_size=1, max_size=6), st.data())
def test_a_cut_batch_is_refused_not_half_applied(
    records: list[rec.Record], data: st.DataObject
) -> None:
    batch = rec.Batch()
    for r in records:
        batch.record(r)
    raw = batch.take()
    cut = data.draw(st.integers(min_value=5, max_value=len(raw) - 1))
    try:
        decoded = rec.decode(raw[:cut])
    except rec.RecordError:
        return
    # a cut that happens to fall between records decodes to a prefix, never garbage
    assert decoded == _fold_acks(records)[: len(decoded)]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"XXXX", "not a record batch"),
        (rec.MAGIC + bytes((99,)), "unknown record type"),
        (rec.MAGIC + struct.pack("!BQQBI", rec.SETTLE, 5, 4, 1, 0), "ends before it starts"),
        (rec.MAGIC + bytes((rec.CANCEL,)) + struct.pack("!H", 2) + b"\xff\xfe", "not UTF-8"),
        (rec.MAGIC + bytes((rec.ACK,)) + struct.pack("!I", 2**31), "truncated"),
    ],
)
def test_malformed_batches_are_refused_with_a_reason(raw: bytes, why: str) -> None:
    with pytest.raises(rec.RecordError, match=why):
        rec.decode(raw)


def test_a_void_record_is_encoded_as_a_void_not_a_session() -> None:
    batch = rec.Batch()
    batch.record(rec.Void(7))
    batch.record(rec.Session(8))
    assert rec.decode(batch.take()) == [rec.Void(7), rec.Session(8)]


def test_consecutive_acks_fold_into_one_record() -> None:
    batch = rec.Batch()
    for i in range(1, 101):
        batch.ack([i])
    batch.cancel("t")
    batch.ack([500])
    decoded = rec.decode(batch.take())
    assert decoded == [rec.Ack(list(range(1, 101))), rec.Cancel("t"), rec.Ack([500])]
