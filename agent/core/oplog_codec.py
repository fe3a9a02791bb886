"""Framing of the op log: length, CRC-32 and a JSON record per frame.

Decides which bytes of a log file are valid. Invariant: a frame is valid only
if its length fits in the file and its checksum matches; an invalid *last*
frame is a torn write (the agent died mid-append) and is dropped; an invalid
frame followed by more data is corruption, which must not be silently skipped.
It must not know about files or fsync: it turns bytes into records and back.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import msgspec

from agent.core.records import Record

HEADER = struct.Struct(">II")  # payload length, crc32(payload)
MAX_RECORD_BYTES = 1 << 20

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)


class CorruptLog(ValueError):
    """A damaged frame before the end of the log: replaying past it would lie."""


@dataclass(frozen=True)
class Decoded:
    records: list[Record]
    valid_bytes: int  # length of the valid prefix; the file should be truncated to it
    torn: bool  # a partial or damaged last frame was dropped


def encode(record: Record) -> bytes:
    payload = _encoder.encode(record)
    return HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def decode(data: bytes) -> Decoded:
    records: list[Record] = []
    offset = 0
    while offset < len(data):
        frame = _frame_at(data, offset)
        if frame is None:
            return Decoded(records, offset, torn=True)
        payload, end = frame
        records.append(_decoder.decode(payload))
        offset = end
    return Decoded(records, offset, torn=False)


def _frame_at(data: bytes, offset: int) -> tuple[bytes, int] | None:
    """The payload and end of the frame at `offset`; None if it is the torn tail."""
    if offset + HEADER.size > len(data):
        return None
    length, crc = HEADER.unpack_from(data, offset)
    end = offset + HEADER.size + length
    if length > MAX_RECORD_BYTES or end > len(data):
        if end >= len(data):
            return None
        raise CorruptLog(f"frame at byte {offset} has impossible length {length}")
    payload = data[offset + HEADER.size : end]
    if zlib.crc32(payload) != crc:
        if end == len(data):
            return None
        raise CorruptLog(f"checksum mismatch in frame at byte {offset}")
    return payload, end
