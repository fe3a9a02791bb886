"""Framing of the op log: which bytes of a log file are valid records, and which are not.

A log (format 2) starts with MAGIC; each frame is a 12-byte header — payload
length, CRC-32 of the length field, CRC-32 of the length field and the payload —
then a JSON record. Decides, from bytes only:
- a frame whose header and payload check is a record;
- the end of the file cut inside the last frame (header cut, or payload cut
  with an intact header), a damaged last frame, or zero bytes to the end (what a
  filesystem may leave after a power loss), even when they start inside a frame,
  is a torn tail: dropped;
- anything else — a damaged header or payload with more data after it, a length
  the writer never writes, a checksummed payload that is no record — is
  corruption before the end: `CorruptLog` names the offset and carries the
  records before it, and nothing after it is ever silently dropped.
A log whose first bytes are MAGIC with a few bytes flipped is format 2 with a
damaged header: `CorruptLog` at byte 0 that carries every frame after it (a
repair keeps them all). A log without MAGIC is format 1 (CRC over the payload
only, no header check), read once to migrate (the op log rewrites it in format
2 before it appends). A record whose frame would be longer than MAX_RECORD_BYTES
is never written (`RecordTooLarge`). It must not know about files or fsync: it
turns bytes into records and back.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from agent.core.records import Record

MAGIC = b"THAW-OPLOG 2\n"
HEADER = struct.Struct(">III")  # payload length, crc32(length), crc32(length + payload)
V1_HEADER = struct.Struct(">II")  # format 1: payload length, crc32(payload)
MAX_RECORD_BYTES = 1 << 20
MAGIC_FLIPS_TOLERATED = 3  # more differing bytes than this: not a damaged format-2 magic

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)

FrameAt = Callable[[bytes, int, int], tuple[bytes, int] | None]


class CorruptLog(ValueError):
    """Damage before the end of the log: replaying past it would lie.
    `records` are the valid records before `offset` (what `--repair` keeps)."""

    def __init__(self, offset: int, reason: str, records: list[Record]) -> None:
        super().__init__(f"byte {offset}: {reason}")
        self.offset = offset
        self.reason = reason
        self.records = records


class RecordTooLarge(ValueError):
    """A record longer than MAX_RECORD_BYTES: the reader would take it for damage."""


class _Damage(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Decoded:
    records: list[Record]
    valid_bytes: int  # length of the valid prefix; the file should be truncated to it
    torn: bool  # a torn or zero-filled tail was dropped
    version: int  # 2, or 1 for a log to migrate


def encode(record: Record) -> bytes:
    """One format-2 frame; RecordTooLarge past MAX_RECORD_BYTES."""
    payload = _encoder.encode(record)
    if len(payload) > MAX_RECORD_BYTES:
        raise RecordTooLarge(f"a {type(record).__name__} record of {len(payload)} bytes "
                             f"(at most {MAX_RECORD_BYTES})")
    length = struct.pack(">I", len(payload))
    head_crc = zlib.crc32(length)
    return length + struct.pack(">II", head_crc, zlib.crc32(payload, head_crc)) + payload


def decode(data: bytes) -> Decoded:
    """Every valid record of a log file's bytes; raises CorruptLog on damage before the end."""
    if data.startswith(MAGIC):
        return _decode(data, len(MAGIC), _frame_v2, version=2)
    if MAGIC.startswith(data) or not any(data):  # new, the magic cut short, or zero-filled
        return Decoded([], 0, torn=bool(data), version=2)
    if _damaged_magic(data):
        try:
            kept = _decode(data, len(MAGIC), _frame_v2, version=2).records
        except CorruptLog as exc:
            raise CorruptLog(0, f"damaged format header, and at byte {exc.offset}: "
                                f"{exc.reason}", exc.records) from None
        raise CorruptLog(0, "damaged format header", kept)
    return _decode(data, 0, _frame_v1, version=1)


def _damaged_magic(data: bytes) -> bool:
    head = data[: len(MAGIC)]
    flips = sum(a != b for a, b in zip(head, MAGIC, strict=False))
    return len(head) == len(MAGIC) and 0 < flips <= MAGIC_FLIPS_TOLERATED


def _decode(data: bytes, offset: int, frame_at: FrameAt, version: int) -> Decoded:
    records: list[Record] = []
    zeros_from = len(data.rstrip(b"\0"))  # from here to the end only zero bytes
    while offset < len(data):
        if offset >= zeros_from:
            return Decoded(records, offset, torn=True, version=version)
        try:
            frame = frame_at(data, offset, zeros_from)
            if frame is None:
                return Decoded(records, offset, torn=True, version=version)
            payload, end = frame
            records.append(_record(payload))
        except _Damage as damage:
            raise CorruptLog(offset, damage.reason, records) from None
        offset = end
    return Decoded(records, offset, torn=False, version=version)


def _record(payload: bytes) -> Record:
    try:
        record: Record = _decoder.decode(payload)
        return record
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _Damage(f"a checksummed frame holds no record ({exc})") from None


def _frame_v2(data: bytes, offset: int, zeros_from: int) -> tuple[bytes, int] | None:
    """The payload and end of the frame at `offset`; None for a torn tail: the file ends
    inside it, or the zero bytes that run to the end of the file start inside it."""
    header_end = offset + HEADER.size
    if header_end > len(data):
        return None  # the header itself cut short: the last append was torn
    length, head_crc, crc = HEADER.unpack_from(data, offset)
    if zlib.crc32(data[offset : offset + 4]) != head_crc:
        if header_end == len(data) or zeros_from < header_end:
            return None
        raise _Damage("damaged frame header")
    if not 0 < length <= MAX_RECORD_BYTES:
        raise _Damage(f"impossible record length {length}")
    end = header_end + length
    if end > len(data):
        return None  # an intact header whose payload the file ends inside
    payload = data[header_end:end]
    if zlib.crc32(payload, head_crc) != crc:
        if end == len(data) or zeros_from < end:
            return None  # the last frame, damaged or zero-filled: torn
        raise _Damage("checksum mismatch")
    return payload, end


def _frame_v1(data: bytes, offset: int, zeros_from: int) -> tuple[bytes, int] | None:
    """Format 1 (migration only): no header check, so a length past the end can only be
    taken as a torn tail when nothing but that frame's header is left."""
    header_end = offset + V1_HEADER.size
    if header_end > len(data):
        return None
    length, crc = V1_HEADER.unpack_from(data, offset)
    end = header_end + length
    if not 0 < length <= MAX_RECORD_BYTES:
        if header_end == len(data) or zeros_from < header_end:
            return None
        raise _Damage(f"impossible record length {length}")
    if end > len(data):
        return None
    payload = data[header_end:end]
    if zlib.crc32(payload) != crc:
        if end == len(data) or zeros_from < end:
            return None
        raise _Damage("checksum mismatch")
    return payload, end
