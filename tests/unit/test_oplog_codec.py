"""Op log framing: round trip, torn and zero-filled tails dropped, every other damage
refused with its offset — never a record lost silently, never one changed (pure)."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core import oplog_codec
from agent.core.oplog_codec import MAGIC, MAX_RECORD_BYTES, CorruptLog, RecordTooLarge
from agent.core.records import (
    Boot,
    Created,
    Gone,
    ImageResolved,
    Launched,
    MachineSpec,
    Record,
    Transition,
)

SPEC = MachineSpec(app="hello", image="oci:/tmp/x:latest")


def sample_records() -> list[Record]:
    return [
        Boot(epoch=1, at=1.0),
        Created("m1", SPEC, "k1", 2.0),
        Transition("m1", "start", "starting", 3.0),
        Launched("m1", 1234, 99, 40000, 4.0),
        Transition("m1", "ready", "started", 5.0),
    ]


def log_of(records: list[Record]) -> bytes:
    return MAGIC + b"".join(oplog_codec.encode(r) for r in records)


def v1_log_of(records: list[Record]) -> bytes:
    return b"".join(struct.pack(">II", len(p), zlib.crc32(p)) + p
                    for p in (oplog_codec._encoder.encode(r) for r in records))


def frame_starts(records: list[Record]) -> list[int]:
    starts, offset = [], len(MAGIC)
    for record in records:
        starts.append(offset)
        offset += len(oplog_codec.encode(record))
    return starts


def test_records_round_trip_through_the_codec() -> None:
    data = log_of(sample_records())
    decoded = oplog_codec.decode(data)
    assert decoded.records == sample_records() and decoded.version == 2
    assert decoded.valid_bytes == len(data) and not decoded.torn


@given(st.integers(min_value=1, max_value=200))
def test_a_log_cut_anywhere_in_the_last_record_replays_to_the_records_before_it(cut: int) -> None:
    records = sample_records()
    head = log_of(records[:-1])
    last = oplog_codec.encode(records[-1])
    cut = min(cut, len(last) - 1)
    decoded = oplog_codec.decode(head + last[:cut])
    assert decoded.records == records[:-1]
    assert decoded.torn and decoded.valid_bytes == len(head)


@pytest.mark.parametrize("zeros", [1, 12, 64, 4096])
def test_a_zero_filled_tail_is_dropped_as_a_power_loss_leaves_it(zeros: int) -> None:
    data = log_of(sample_records())
    decoded = oplog_codec.decode(data + bytes(zeros))
    assert decoded.records == sample_records() and decoded.torn
    assert decoded.valid_bytes == len(data)


@pytest.mark.parametrize("kept", [0, 4, 12, 40])
def test_a_zero_tail_that_starts_inside_a_frame_is_a_torn_tail(kept: int) -> None:
    """Group commit, then a power loss: of the unsynced frames only the first bytes of the
    first reached the disk, the rest of the file reads back as zeros."""
    records = sample_records()
    head = log_of(records[:2])
    unsynced = b"".join(oplog_codec.encode(r) for r in records[2:])
    decoded = oplog_codec.decode(head + unsynced[:kept] + bytes(len(unsynced) - kept))
    assert decoded.records == records[:2] and decoded.torn
    assert decoded.valid_bytes == len(head)


def test_a_length_flipped_to_point_past_the_end_is_corruption_not_a_torn_tail() -> None:
    """What the old format did: a length past the end with data after it was taken as a
    torn tail, and every record after it was silently dropped."""
    records = sample_records()
    data = bytearray(log_of(records))
    second = frame_starts(records)[1]
    data[second] ^= 0x01  # the length's high byte: now 16 MiB past the end
    with pytest.raises(CorruptLog) as caught:
        oplog_codec.decode(bytes(data))
    assert caught.value.offset == second and caught.value.records == records[:1]


def test_a_damaged_record_before_the_end_is_corruption_naming_its_offset() -> None:
    records = sample_records()
    data = bytearray(log_of(records))
    second = frame_starts(records)[1]
    data[second + 20] ^= 0xFF  # inside the second record's payload
    with pytest.raises(CorruptLog) as caught:
        oplog_codec.decode(bytes(data))
    assert caught.value.offset == second and "checksum" in caught.value.reason


def test_a_checksummed_frame_that_holds_no_record_is_corruption() -> None:
    payload = b'{"type": "unknown-kind"}'
    length = struct.pack(">I", len(payload))
    head = zlib.crc32(length)
    frame = length + struct.pack(">II", head, zlib.crc32(payload, head)) + payload
    with pytest.raises(CorruptLog):
        oplog_codec.decode(MAGIC + frame + oplog_codec.encode(Boot(1, 1.0)))


def test_an_empty_log_or_a_cut_magic_is_an_empty_state() -> None:
    assert oplog_codec.decode(b"").records == []
    assert oplog_codec.decode(MAGIC[:5]).torn
    zeros = oplog_codec.decode(bytes(4096))  # zero-filled: empty, not format 1
    assert zeros.records == [] and zeros.version == 2 and zeros.torn


def test_a_format_1_log_is_read_for_migration() -> None:
    records = sample_records()
    decoded = oplog_codec.decode(v1_log_of(records) + bytes(64))  # a zero-filled tail, too
    assert decoded.records == records and decoded.version == 1


@pytest.mark.parametrize("flips", [[0], [3, 7], [0, 5, 12]])
def test_a_damaged_magic_is_refused_with_every_record_after_it_kept_for_repair(
    flips: list[int],
) -> None:
    """Read as format 1, a flipped magic byte would lose the whole log to a repair."""
    records = sample_records()
    data = bytearray(log_of(records))
    for i in flips:
        data[i] ^= 0x20
    with pytest.raises(CorruptLog) as caught:
        oplog_codec.decode(bytes(data))
    assert caught.value.offset == 0 and caught.value.records == records
    assert "format header" in caught.value.reason


def test_a_record_too_long_for_a_frame_is_never_encoded() -> None:
    """The reader refuses a length past MAX_RECORD_BYTES as damage: the writer must not
    write one, or the log would stop the next boot."""
    huge = MachineSpec(app="hello", image="img", env={"X": "\x01" * MAX_RECORD_BYTES})
    with pytest.raises(RecordTooLarge):
        oplog_codec.encode(Created("m1", huge, "k1", 1.0))


def test_a_large_log_with_a_long_zero_tail_decodes_to_its_records() -> None:
    records = [Gone(f"m{i}", float(i)) for i in range(20_000)]
    decoded = oplog_codec.decode(log_of(records) + bytes(1 << 20))
    assert decoded.records == records and decoded.torn


# -- the fault property ----------------------------------------------------------------

ids = st.text("abc0123", min_size=1, max_size=14)
records_strategy = st.lists(
    st.one_of(
        st.builds(Boot, epoch=st.integers(0, 1000), at=st.floats(0, 1e9)),
        st.builds(Created, id=ids, spec=st.builds(
            MachineSpec, app=st.text("abcxyz-", min_size=1, max_size=20),
            image=st.text(min_size=1, max_size=40),
            env=st.dictionaries(st.text("ABCZ_", min_size=1, max_size=8), st.text(max_size=20),
                                max_size=3)),
                  offer_key=st.text(max_size=20), at=st.floats(0, 1e9)),
        st.builds(Launched, id=ids, pid=st.integers(1, 2**22), start_time=st.integers(0, 2**40),
                  port=st.integers(1, 65535), at=st.floats(0, 1e9)),
        st.builds(ImageResolved, id=ids, digest=st.text("0123456789abcdef", max_size=64),
                  at=st.floats(0, 1e9)),
        st.builds(Transition, id=ids,
                  event=st.sampled_from(["start", "ready", "stop", "exited"]),
                  state=st.sampled_from(["starting", "started", "stopped"]),
                  at=st.floats(0, 1e9), reason=st.text(max_size=30)),
        st.builds(Gone, id=ids, at=st.floats(0, 1e9)),
    ),
    min_size=1, max_size=12,
)


@settings(max_examples=500, deadline=None)
@given(records_strategy, st.data())
def test_a_flipped_bit_anywhere_gives_the_exact_records_before_it_or_a_refusal(
    records: list[Record], data: st.DataObject
) -> None:
    """Never fewer records silently, never a changed record: damage in the last frame
    drops that frame (a torn tail cannot be told from it); any other is refused."""
    log = log_of(records)
    bit = data.draw(st.integers(0, len(log) * 8 - 1))
    damaged = bytearray(log)
    damaged[bit // 8] ^= 1 << (bit % 8)
    starts = frame_starts(records)
    try:
        decoded = oplog_codec.decode(bytes(damaged))
    except CorruptLog as exc:
        assert exc.records == records[: len(exc.records)]  # the prefix, unchanged
        assert exc.offset in starts or exc.offset == 0
        if bit // 8 < len(MAGIC):  # the format header: a repair keeps every record
            assert exc.offset == 0 and exc.records == records
        return
    if bit // 8 >= starts[-1]:  # in the last frame
        assert decoded.records == records[:-1] and decoded.torn
    else:
        raise AssertionError(f"damage at byte {bit // 8} went unnoticed: {decoded}")


@settings(max_examples=300, deadline=None)
@given(records_strategy, st.data())
def test_a_flipped_bit_in_a_format_1_log_never_changes_a_record(
    records: list[Record], data: st.DataObject
) -> None:
    """Format 1 (read once, to migrate) has no header check: a damaged length cannot be
    told from a torn tail, so records after it may be missed — the reason for format 2 —
    but what it reads is always the log's own records, in order, unchanged."""
    log = v1_log_of(records)
    bit = data.draw(st.integers(0, len(log) * 8 - 1))
    damaged = bytearray(log)
    damaged[bit // 8] ^= 1 << (bit % 8)
    try:
        decoded = oplog_codec.decode(bytes(damaged))
    except CorruptLog as exc:
        assert exc.records == records[: len(exc.records)]
        return
    assert decoded.records == records[: len(decoded.records)]
    assert len(decoded.records) < len(records)  # the damaged frame itself is never read
