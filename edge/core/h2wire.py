"""HTTP/2's vocabulary for the edge's own cores, the server (edge/core/h2proto.py) and the
client (edge/core/h2client.py): frame types and flags, error codes and settings (RFC
9113, RFC 8441), what a core reports (`Events`, `H2ConnectionError`) and what it
advertises (`Settings`)."""

from __future__ import annotations

import struct
from collections import deque

from mypy_extensions import mypyc_attr

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x6, 0x7, 0x8, 0x9
END_STREAM, END_HEADERS = 0x1, 0x4
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PREFACE_LINE = b"PRI * HTTP/2.0\r\n"  # an opening this long that then strays: a broken preface


PUSH_PROMISE = 0x5
ACK, PADDED, PRIORITY_FLAG = 0x1, 0x8, 0x20

# error codes (RFC 9113 7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

# settings (RFC 9113 6.5.2, RFC 8441 3)
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE = 1, 2, 3, 4
MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE, ENABLE_CONNECT_PROTOCOL = 5, 6, 8

DEFAULT_WINDOW = 65535
DEFAULT_FRAME = 16384
MAX_WINDOW = (1 << 31) - 1

FRAME_HEAD = struct.Struct(">HBBBL")  # a frame header: length (24 bits as 16 + 8), type, flags, id
SETTING = struct.Struct(">HL")
U32 = struct.Struct(">L")


def take_within(out: deque[bytes], window: int) -> bytes:
    """The next DATA payload from `out` that fits `window` (> 0): its first piece, or as
    much of it as fits, the rest left first in line."""
    chunk = out.popleft()
    if len(chunk) > window:
        out.appendleft(chunk[window:])
        chunk = chunk[:window]
    return chunk


class H2ConnectionError(Exception):
    """A connection error: send GOAWAY with `code` and close."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@mypyc_attr(allow_interpreted_subclasses=True)
class Events:
    """What the protocol tells its user; the defaults ignore it."""

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool,
                   too_large: bool) -> None:
        """A new stream's request head (`too_large`: its list was over the limit and cut)."""

    def on_data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        """Body bytes; `flow_length` (padding included) is owed back by `ack_data`."""

    def on_trailers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The peer's trailers (`on_end` follows)."""

    def on_end(self, stream_id: int) -> None:
        """The peer ended its side of the stream (after a body or trailers)."""

    def on_response(self, stream_id: int, headers: list[tuple[bytes, bytes]],
                    ended: bool) -> None:
        """(Client side) a stream's final response head; `ended`: no body follows."""

    def on_reset(self, stream_id: int, code: int) -> None:
        """The stream is gone: reset by the peer, or by us for a stream error (`code`:
        the RST_STREAM's)."""

    def on_window(self, stream_id: int) -> None:
        """The peer opened a window: the stream's, or the connection's (0)."""

    def on_goaway(self, last_stream_id: int, code: int) -> None:
        """The peer sent GOAWAY: streams past `last_stream_id` were not processed."""


class Settings:
    """What this side advertises (a client advertises `max_concurrent_streams` 0: no
    pushed streams)."""

    def __init__(self, max_concurrent_streams: int = 100, stream_window: int = DEFAULT_WINDOW,
                 connection_window: int = DEFAULT_WINDOW, max_header_list: int = 65536,
                 header_table: int = 4096, connect_protocol: bool = False) -> None:
        self.max_concurrent_streams = max_concurrent_streams
        self.stream_window = stream_window
        self.connection_window = connection_window
        self.max_header_list = max_header_list
        self.header_table = header_table
        self.connect_protocol = connect_protocol
