"""HPACK (RFC 7541) for the edge's HTTP/2 server: a decoder for the requests' header
blocks and an encoder for the answers'. Pure: bytes in, header lists out.

Decoder: the whole of RFC 7541 — indexed fields, literals with and without
indexing, never-indexed literals, table size updates (only at a block's start,
never above what we advertised, and required once a lowered size took effect),
Huffman strings (the code table is the `hpack` package's; short decoded strings
are memoised process-wide, as the same few values come again and again). A block
is always decoded whole, so the dynamic table stays in step with the client's,
but past `max_list_bytes` (each field counting its name, value and 32, as
SETTINGS_MAX_HEADER_LIST_SIZE does) the fields are counted and dropped: a small
block that repeats a large table entry (an HPACK bomb) costs its bytes, not its
expansion. Any coding error is `CompressionError`, which ends the connection
(COMPRESSION_ERROR).

Encoder: never touches the dynamic table — a field is a static index when the
whole field is in the static table (`:status: 200`), else a literal without
indexing under the static table's name index, or with a literal name. So the
client's table size is never our concern, and the encoding of a field is a pure
function of the field, memoised (short fields only).
"""

from __future__ import annotations

from collections import deque

from hpack.exceptions import HPACKDecodingError
from hpack.huffman_table import decode_huffman

STATIC: tuple[tuple[bytes, bytes], ...] = (
    (b":authority", b""), (b":method", b"GET"), (b":method", b"POST"), (b":path", b"/"),
    (b":path", b"/index.html"), (b":scheme", b"http"), (b":scheme", b"https"),
    (b":status", b"200"), (b":status", b"204"), (b":status", b"206"), (b":status", b"304"),
    (b":status", b"400"), (b":status", b"404"), (b":status", b"500"),
    (b"accept-charset", b""), (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""), (b"accept-ranges", b""), (b"accept", b""),
    (b"access-control-allow-origin", b""), (b"age", b""), (b"allow", b""),
    (b"authorization", b""), (b"cache-control", b""), (b"content-disposition", b""),
    (b"content-encoding", b""), (b"content-language", b""), (b"content-length", b""),
    (b"content-location", b""), (b"content-range", b""), (b"content-type", b""),
    (b"cookie", b""), (b"date", b""), (b"etag", b""), (b"expect", b""), (b"expires", b""),
    (b"from", b""), (b"host", b""), (b"if-match", b""), (b"if-modified-since", b""),
    (b"if-none-match", b""), (b"if-range", b""), (b"if-unmodified-since", b""),
    (b"last-modified", b""), (b"link", b""), (b"location", b""), (b"max-forwards", b""),
    (b"proxy-authenticate", b""), (b"proxy-authorization", b""), (b"range", b""),
    (b"referer", b""), (b"refresh", b""), (b"retry-after", b""), (b"server", b""),
    (b"set-cookie", b""), (b"strict-transport-security", b""), (b"transfer-encoding", b""),
    (b"user-agent", b""), (b"vary", b""), (b"via", b""), (b"www-authenticate", b""),
)
STATIC_COUNT = len(STATIC)  # 61
ENTRY_OVERHEAD = 32  # what a table entry (and a header list field) costs beyond its bytes
MAX_INTEGER = 1 << 32  # larger integers are an error, not a long loop
_MEMO_LIMIT = 4096  # memoised strings / encodings kept before the memo starts over
_MEMO_STRING = 64  # Huffman strings up to this long are memoised (one memo per process:
_HUFFMAN: dict[bytes, bytes] = {}  # at most 4096 x (64 + 80) bytes, whatever clients send)
_MEMO_FIELD = 256  # fields up to this long are memoised by an encoder


class CompressionError(Exception):
    """The header block is not valid HPACK: a connection error (COMPRESSION_ERROR)."""


class Decoder:
    """Decodes one connection's request header blocks, in order."""

    def __init__(self, max_table_bytes: int = 4096, max_list_bytes: int = 65536) -> None:
        self.allowed_table_bytes = max_table_bytes  # what a size update may ask for
        self.table_bytes = max_table_bytes  # the table's current maximum
        self.max_list_bytes = max_list_bytes
        self.table: deque[tuple[bytes, bytes]] = deque()  # newest first
        self.size = 0

    def limit(self, table_bytes: int) -> None:
        """Our SETTINGS_HEADER_TABLE_SIZE took effect: a table over it must be shrunk by a
        size update at the start of the next block (RFC 7541 4.2), or it is an error."""
        self.allowed_table_bytes = table_bytes

    def decode(self, block: bytes) -> tuple[list[tuple[bytes, bytes]], bool]:
        """(the fields, whether the list went over `max_list_bytes` and was cut)."""
        fields: list[tuple[bytes, bytes]] = []
        list_bytes = 0
        over = False
        at = 0
        end = len(block)
        while at < end:
            first = block[at]
            if first & 0xE0 != 0x20 and self.table_bytes > self.allowed_table_bytes:
                raise CompressionError("no table size update down to the size allowed")
            if first & 0x80:  # indexed field
                index, at = _integer(block, at, 7)
                field = self._field(index)
            elif first & 0x40:  # literal, added to the table
                index, at = _integer(block, at, 6)
                name, at = self._name(block, at, index)
                value, at = self._string(block, at)
                field = (name, value)
                self._add(field)
            elif first & 0x20:  # dynamic table size update
                if fields or over:
                    raise CompressionError("a table size update after a field")
                size, at = _integer(block, at, 5)
                if size > self.allowed_table_bytes:
                    raise CompressionError(f"a table size of {size} over the limit")
                self.table_bytes = size
                self._evict()
                continue
            else:  # literal without indexing, or never indexed
                index, at = _integer(block, at, 4)
                name, at = self._name(block, at, index)
                value, at = self._string(block, at)
                field = (name, value)
            list_bytes += len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
            if list_bytes > self.max_list_bytes:
                over = True
                fields.clear()
            if not over:
                fields.append(field)
        return fields, over

    def _field(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= STATIC_COUNT:
            return STATIC[index - 1]
        dynamic = index - STATIC_COUNT - 1
        if index == 0 or dynamic >= len(self.table):
            raise CompressionError(f"no table entry {index}")
        return self.table[dynamic]

    def _name(self, block: bytes, at: int, index: int) -> tuple[bytes, int]:
        if index:
            return self._field(index)[0], at
        return self._string(block, at)

    def _string(self, block: bytes, at: int) -> tuple[bytes, int]:
        if at >= len(block):
            raise CompressionError("a block that ends inside a field")
        huffman = block[at] & 0x80
        length, at = _integer(block, at, 7)
        end = at + length
        if end > len(block):
            raise CompressionError("a string longer than its block")
        raw = block[at:end]
        if not huffman:
            return raw, end
        decoded = _HUFFMAN.get(raw)
        if decoded is None:
            try:
                decoded = decode_huffman(raw)
            except HPACKDecodingError as exc:
                raise CompressionError(f"bad Huffman coding: {exc}") from None
            if length <= _MEMO_STRING:
                if len(_HUFFMAN) >= _MEMO_LIMIT:
                    _HUFFMAN.clear()
                _HUFFMAN[raw] = decoded
        return decoded, end

    def _add(self, field: tuple[bytes, bytes]) -> None:
        size = len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
        if size > self.table_bytes:  # larger than the table: it empties it (RFC 7541 4.4)
            self.table.clear()
            self.size = 0
            return
        self.table.appendleft(field)
        self.size += size
        self._evict()

    def _evict(self) -> None:
        while self.size > self.table_bytes:
            name, value = self.table.pop()
            self.size -= len(name) + len(value) + ENTRY_OVERHEAD


def _integer(block: bytes, at: int, prefix: int) -> tuple[int, int]:
    """(the integer with a `prefix`-bit prefix at `at`, the offset after it)."""
    mask = (1 << prefix) - 1
    value = block[at] & mask
    at += 1
    if value < mask:
        return value, at
    shift = 0
    end = len(block)
    while True:
        if at >= end:
            raise CompressionError("a block that ends inside an integer")
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        if value > MAX_INTEGER:
            raise CompressionError("an integer too large")
        if not byte & 0x80:
            return value, at
        shift += 7


def encode_integer(value: int, prefix: int, first: int) -> bytes:
    """`value` with a `prefix`-bit prefix, the first byte's other bits from `first`."""
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes((first | value,))
    out = bytearray((first | mask,))
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_STATIC_FIELD = {field: index + 1 for index, field in enumerate(STATIC) if field[1]}
_STATIC_NAME: dict[bytes, int] = {}
for _index, (_name, _value) in enumerate(STATIC):
    _STATIC_NAME.setdefault(_name, _index + 1)


class Encoder:
    """Encodes the answers' header lists (see the module's doc: no dynamic table)."""

    def __init__(self) -> None:
        self.memo: dict[tuple[bytes, bytes], bytes] = {}

    def encode(self, fields: list[tuple[bytes, bytes]]) -> bytes:
        memo = self.memo
        parts = []
        for field in fields:
            coded = memo.get(field)
            if coded is None:
                coded = encode_field(field[0], field[1])
                if len(field[0]) + len(field[1]) <= _MEMO_FIELD:
                    if len(memo) >= _MEMO_LIMIT:
                        memo.clear()
                    memo[field] = coded
            parts.append(coded)
        return b"".join(parts)


def encode_field(name: bytes, value: bytes) -> bytes:
    index = _STATIC_FIELD.get((name, value))
    if index is not None:
        return encode_integer(index, 7, 0x80)
    index = _STATIC_NAME.get(name, 0)
    if index:
        head = encode_integer(index, 4, 0x00)
    else:
        head = b"\x00" + encode_integer(len(name), 7, 0x00) + name
    return head + encode_integer(len(value), 7, 0x00) + value
