"""The edge's own HPACK coder (edge/core/hpack.py: compiled) in the h2 library's place,
for the HTTP/2 connections to h2c machines (edge/adapters/h2upstream.py): with the
calls and attributes h2 uses of its encoder and decoder."""

from __future__ import annotations

from collections.abc import Iterable

import hpack.exceptions

from edge.core.hpack import CompressionError, Decoder, Encoder


class FieldEncoder:
    """The HPACK encoder of the edge's own HTTP/2 core (edge/core/hpack.py: compiled,
    memoised, no dynamic table, so whatever table size the machine allows suits it) in
    place of the h2 library's, which is most of a request's cost in pure Python."""

    def __init__(self) -> None:
        self.inner = Encoder()
        self.header_table_size = 4096  # set by h2 from the machine's SETTINGS; unused

    def encode(self, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        return self.inner.encode([(name, value) for name, value in headers])


class FieldDecoder:
    """The edge's own HPACK decoder (compiled) in place of the h2 library's, with the
    calls and errors h2 expects of one: an over-long list is a DenialOfServiceError to
    h2, a bad block a ProtocolError (both end the connection)."""

    def __init__(self) -> None:
        self.inner = Decoder(4096, 1 << 16)

    @property
    def max_header_list_size(self) -> int:
        return self.inner.max_list_bytes

    @max_header_list_size.setter
    def max_header_list_size(self, size: int) -> None:
        self.inner.max_list_bytes = size

    @property
    def max_allowed_table_size(self) -> int:
        return self.inner.allowed_table_bytes

    @max_allowed_table_size.setter
    def max_allowed_table_size(self, size: int) -> None:
        self.inner.limit(size)

    def decode(self, data: bytes, raw: bool = False) -> list[tuple[bytes, bytes]]:
        try:
            fields, over = self.inner.decode(data)
        except CompressionError as exc:
            raise hpack.exceptions.HPACKDecodingError(str(exc)) from None
        if over:
            raise hpack.exceptions.OversizedHeaderListError("a header list over the limit")
        return fields
