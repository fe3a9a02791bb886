"""Op log framing: round trip, torn tails dropped, corruption refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.core import oplog_codec
from agent.core.records import Boot, Created, Launched, MachineSpec, Transition

SPEC = MachineSpec(app="hello", image="oci:/tmp/x:latest")


def sample_records() -> list:
    return [
        Boot(epoch=1, at=1.0),
        Created("m1", SPEC, "k1", 2.0),
        Transition("m1", "start", "starting", 3.0),
        Launched("m1", 1234, 99, 40000, 4.0),
        Transition("m1", "ready", "started", 5.0),
    ]


def encode_all(records: list) -> bytes:
    return b"".join(oplog_codec.encode(r) for r in records)


def test_records_round_trip_through_the_codec() -> None:
    data = encode_all(sample_records())
    decoded = oplog_codec.decode(data)
    assert decoded.records == sample_records()
    assert decoded.valid_bytes == len(data) and not decoded.torn


@given(st.integers(min_value=1, max_value=200))
def test_a_log_cut_anywhere_in_the_last_record_replays_to_the_records_before_it(cut: int) -> None:
    records = sample_records()
    head = encode_all(records[:-1])
    last = oplog_codec.encode(records[-1])
    cut = min(cut, len(last) - 1)
    decoded = oplog_codec.decode(head + last[:cut])
    assert decoded.records == records[:-1]
    assert decoded.torn and decoded.valid_bytes == len(head)


def test_a_flipped_byte_in_the_last_record_drops_only_that_record() -> None:
    records = sample_records()
    data = bytearray(encode_all(records))
    data[-3] ^= 0xFF
    decoded = oplog_codec.decode(bytes(data))
    assert decoded.records == records[:-1] and decoded.torn


def test_a_damaged_record_before_the_end_is_corruption_not_a_torn_tail() -> None:
    records = sample_records()
    first = oplog_codec.encode(records[0])
    data = bytearray(encode_all(records))
    data[len(first) + 10] ^= 0xFF  # inside the second record's payload
    with pytest.raises(oplog_codec.CorruptLog):
        oplog_codec.decode(bytes(data))


def test_an_empty_log_is_an_empty_state() -> None:
    decoded = oplog_codec.decode(b"")
    assert decoded.records == [] and not decoded.torn
