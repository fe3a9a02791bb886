"""What either side of HTTP/2 sends (edge/core/h2peer.py receives): our SETTINGS, HEADERS
(and CONTINUATION past the peer's frame size), DATA within the peer's windows,
WINDOW_UPDATE as received bytes are acknowledged, RST_STREAM and GOAWAY; and the state
both halves share — each stream's `StreamState`, and the windows. Pure: frames
accumulate in `out` until `data_to_send`."""

from __future__ import annotations

from edge.core.h2wire import (
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    ENABLE_CONNECT_PROTOCOL,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    FRAME_HEAD,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_HEADER_LIST_SIZE,
    RST_STREAM,
    SETTING,
    SETTINGS,
    U32,
    WINDOW_UPDATE,
    Settings,
)
from edge.core.hpack import Encoder

RECENTLY_RESET = 256  # stream ids we reset, remembered so frames already in flight are ignored


class StreamState:
    __slots__ = ("headed", "local_ended", "recv_owed", "recv_window", "remote_ended",
                 "send_window")

    def __init__(self, send_window: int, recv_window: int, remote_ended: bool) -> None:
        self.send_window = send_window
        self.recv_window = recv_window
        self.recv_owed = 0  # acknowledged bytes not yet given back by a WINDOW_UPDATE
        self.remote_ended = remote_ended
        self.local_ended = False
        self.headed = False  # (client side) its final response head came


class H2Sender:
    """One connection's sending half, and the state it shares with the receiving one."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.encoder = Encoder()
        self.streams: dict[int, StreamState] = {}
        # streams reset lately -> whether the peer reset them (True) or we did (False):
        # frames on a stream we reset may have been sent before the peer heard of it
        # and are dropped; on one it reset itself they are its error (RFC 9113 5.1)
        self.recently_reset: dict[int, bool] = {}
        self.last_stream_id = 0  # the highest stream the peer opened (server side)
        self.out: list[bytes] = []
        # the peer's settings, as they bear on what we send
        self.send_window = DEFAULT_WINDOW  # the connection's
        self.peer_stream_window = DEFAULT_WINDOW
        self.max_frame = DEFAULT_FRAME
        self.peer_max_streams = 100  # streams we may open (client side), till it says
        # the connection's receive window
        self.recv_window = settings.connection_window
        self.recv_owed = 0
        self.goaway_sent = False

    def start(self) -> None:
        """Our SETTINGS (and the connection's window, when larger than the default)."""
        s = self.settings
        values = [(MAX_CONCURRENT_STREAMS, s.max_concurrent_streams),
                  (INITIAL_WINDOW_SIZE, s.stream_window),
                  (MAX_HEADER_LIST_SIZE, s.max_header_list),
                  (HEADER_TABLE_SIZE, s.header_table), (ENABLE_PUSH, 0)]
        if s.connect_protocol:
            values.append((ENABLE_CONNECT_PROTOCOL, 1))
        self._frame(SETTINGS, 0, 0, b"".join(SETTING.pack(k, v) for k, v in values))
        if s.connection_window > DEFAULT_WINDOW:
            self._frame(WINDOW_UPDATE, 0, 0, U32.pack(s.connection_window - DEFAULT_WINDOW))

    # -- what we send --------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        length = len(payload)
        self.out.append(FRAME_HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id))
        if length:
            self.out.append(payload)

    def data_to_send(self) -> bytes:
        out = self.out
        if not out:
            return b""
        data = b"".join(out)
        out.clear()
        return data

    def window(self, stream_id: int) -> int:
        """How many DATA bytes the stream may send now (0 when it is closed)."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_ended:
            return 0
        return min(self.send_window, stream.send_window)

    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]],
                     end_stream: bool = False) -> bool:
        """HEADERS (and CONTINUATION past the peer's frame size); False if it is closed."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_ended:
            return False
        block = self.encoder.encode(headers)
        ending = END_STREAM if end_stream else 0
        limit = self.max_frame
        if len(block) <= limit:
            self._frame(HEADERS, END_HEADERS | ending, stream_id, block)
        else:
            self._frame(HEADERS, ending, stream_id, block[:limit])
            for at in range(limit, len(block), limit):
                last = at + limit >= len(block)
                self._frame(CONTINUATION, END_HEADERS if last else 0, stream_id,
                            block[at:at + limit])
        if end_stream:
            self._local_end(stream_id, stream)
        return True

    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> bool:
        """DATA within the windows (the caller sends no more than `window`); False if the
        stream is closed."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.local_ended:
            return False
        size = len(data)
        self.send_window -= size
        stream.send_window -= size
        limit = self.max_frame
        if size <= limit:
            self._frame(DATA, END_STREAM if end_stream else 0, stream_id, data)
        else:
            for at in range(0, size, limit):
                last = at + limit >= size
                self._frame(DATA, END_STREAM if last and end_stream else 0, stream_id,
                            data[at:at + limit])
        if end_stream:
            self._local_end(stream_id, stream)
        return True

    def _local_end(self, stream_id: int, stream: StreamState) -> None:
        stream.local_ended = True
        if stream.remote_ended:
            del self.streams[stream_id]

    def ack_data(self, stream_id: int, size: int) -> None:
        """Give back `size` received bytes of window: the connection's, and the stream's
        while the peer may still send on it. WINDOW_UPDATE goes out once a quarter of a
        window is owed, or half of it is used up (a peer at 0 gets it at once)."""
        if size <= 0:
            return
        self.recv_owed += size
        target = self.settings.connection_window
        if self.recv_owed >= target // 4 or self.recv_window <= target // 2:
            self._frame(WINDOW_UPDATE, 0, 0, U32.pack(self.recv_owed))
            self.recv_window += self.recv_owed
            self.recv_owed = 0
        stream = self.streams.get(stream_id) if stream_id else None
        if stream is None or stream.remote_ended:
            return
        stream.recv_owed += size
        target = self.settings.stream_window
        if stream.recv_owed >= target // 4 or stream.recv_window <= target // 2:
            self._frame(WINDOW_UPDATE, 0, stream_id, U32.pack(stream.recv_owed))
            stream.recv_window += stream.recv_owed
            stream.recv_owed = 0

    def reset_stream(self, stream_id: int, code: int) -> None:
        """RST_STREAM (if the stream is still known); it is then forgotten."""
        if self.streams.pop(stream_id, None) is not None:
            self._frame(RST_STREAM, 0, stream_id, U32.pack(code))
            self._remember_reset(stream_id)

    def _remember_reset(self, stream_id: int, by_peer: bool = False) -> None:
        reset = self.recently_reset
        reset[stream_id] = by_peer
        if len(reset) > RECENTLY_RESET:
            del reset[next(iter(reset))]

    def goaway(self, code: int, debug: bytes = b"", last_stream_id: int = -1) -> None:
        """GOAWAY: streams past `last_stream_id` (default: the last the peer opened) will
        not be processed."""
        last = self.last_stream_id if last_stream_id < 0 else last_stream_id
        self._frame(GOAWAY, 0, 0, U32.pack(last) + U32.pack(code) + debug)
        self.goaway_sent = True
