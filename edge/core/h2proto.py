"""The server side of HTTP/2 (RFC 9113) as a pure state machine: bytes in, calls to an
`Events` handler and frames out (`data_to_send`). No IO and no clock: `receive` takes
`now` for the frame budgets.

What it keeps: the connection's and each stream's state (open, half-closed either
way, closed), the flow-control windows both ways, the peer's SETTINGS, HPACK (edge/
core/hpack.py), and the frame budgets (edge/core/h2budget.py) read per frame. What it
checks, as RFC 9113 asks: the preface and a first SETTINGS frame; frame sizes per
type; stream ids (odd, increasing; nothing on stream 0 that belongs to a stream, and
the reverse); CONTINUATION right after its HEADERS; padding; flow control (a DATA
frame past a window, a WINDOW_UPDATE of 0 or past 2^31-1); SETTINGS values; trailers
that end the stream. A connection error raises `H2ConnectionError` (the caller sends
GOAWAY and closes); a stream error sends RST_STREAM and calls `Events.on_reset`.

A request's header list is handed over as decoded (well-formedness is edge/core/
h2head.py's business, so that a malformed request is a stream error). A HEADERS frame
past SETTINGS_MAX_CONCURRENT_STREAMS is refused (RST_STREAM REFUSED_STREAM) after its
block is decoded, so the HPACK table stays in step and the handler never sees it.
"""

from __future__ import annotations

import struct

from edge.core.h2budget import FrameBudget
from edge.core.h2wire import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    ENABLE_CONNECT_PROTOCOL,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    Events,
    H2ConnectionError,
    Settings,
)
from edge.core.hpack import CompressionError, Decoder, Encoder

RECENTLY_RESET = 256  # stream ids we reset, remembered so frames already in flight are ignored

_HEAD = struct.Struct(">HBBBL")  # a frame header: length (24 bits as 16 + 8), type, flags, id
_SETTING = struct.Struct(">HL")
_U32 = struct.Struct(">L")


class _Stream:
    __slots__ = ("local_ended", "recv_owed", "recv_window", "remote_ended", "send_window")

    def __init__(self, send_window: int, recv_window: int, remote_ended: bool) -> None:
        self.send_window = send_window
        self.recv_window = recv_window
        self.recv_owed = 0  # acknowledged bytes not yet given back by a WINDOW_UPDATE
        self.remote_ended = remote_ended
        self.local_ended = False


class H2Server:
    """One connection, server side."""

    def __init__(self, events: Events, settings: Settings, budget: FrameBudget) -> None:
        self.events = events
        self.settings = settings
        self.budget = budget
        self.decoder = Decoder(max(settings.header_table, 4096), settings.max_header_list)
        self.encoder = Encoder()
        self.streams: dict[int, _Stream] = {}
        self.recently_reset: dict[int, None] = {}
        self.last_stream_id = 0  # the highest stream the client opened
        self.out: list[bytes] = []
        self.buffer = b""
        self.preface_left = len(PREFACE)
        self.seen_settings = False
        self.block: list[bytes] = []  # an open header block's fragments
        self.block_stream = 0  # its stream (0: no block open)
        self.block_flags = 0  # its HEADERS frame's flags
        self.block_self_dependent = False  # its priority names its own stream
        # the client's settings, as they bear on what we send
        self.send_window = DEFAULT_WINDOW  # the connection's
        self.peer_stream_window = DEFAULT_WINDOW
        self.max_frame = DEFAULT_FRAME
        # the connection's receive window
        self.recv_window = settings.connection_window
        self.recv_owed = 0
        self.goaway_sent = False
        self.now = 0.0  # the time of the bytes being handled (for the budgets)

    # -- start and receive ---------------------------------------------------------------

    def start(self) -> None:
        """Our SETTINGS (and the connection's window, when larger than the default)."""
        s = self.settings
        values = [(MAX_CONCURRENT_STREAMS, s.max_concurrent_streams),
                  (INITIAL_WINDOW_SIZE, s.stream_window),
                  (MAX_HEADER_LIST_SIZE, s.max_header_list),
                  (HEADER_TABLE_SIZE, s.header_table), (ENABLE_PUSH, 0)]
        if s.connect_protocol:
            values.append((ENABLE_CONNECT_PROTOCOL, 1))
        self._frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in values))
        if s.connection_window > DEFAULT_WINDOW:
            self._frame(WINDOW_UPDATE, 0, 0, _U32.pack(s.connection_window - DEFAULT_WINDOW))

    def receive(self, data: bytes, now: float) -> None:
        """Handle the client's bytes; raises `H2ConnectionError`."""
        self.now = now
        if self.preface_left:
            take = min(self.preface_left, len(data))
            at = len(PREFACE) - self.preface_left
            if data[:take] != PREFACE[at:at + take]:
                raise H2ConnectionError(PROTOCOL_ERROR, "not the HTTP/2 client preface")
            self.preface_left -= take
            data = data[take:]
        buffer = self.buffer + data if self.buffer else data
        at = 0
        end = len(buffer)
        budget = self.budget
        while end - at >= 9:
            high, low, kind, flags, stream_id = _HEAD.unpack_from(buffer, at)
            length = high << 8 | low
            if length > DEFAULT_FRAME:
                raise H2ConnectionError(FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            if end - at - 9 < length:
                break
            reason = budget.frame(kind, flags, length, now)
            if reason is not None:
                raise H2ConnectionError(ENHANCE_YOUR_CALM, reason)
            payload = buffer[at + 9:at + 9 + length]
            at += 9 + length
            self._receive_frame(kind, flags, stream_id & 0x7FFFFFFF, payload)
        self.buffer = buffer[at:] if at < end else b""

    def _receive_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if not self.seen_settings:
            if kind != SETTINGS or flags & ACK:
                raise H2ConnectionError(PROTOCOL_ERROR, "the preface's first frame is not SETTINGS")
            self.seen_settings = True
        if self.block_stream and kind != CONTINUATION:
            raise H2ConnectionError(PROTOCOL_ERROR, "a header block interrupted")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == PING:
            if stream_id:
                raise H2ConnectionError(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "PING not of 8 bytes")
            if not flags & ACK:
                self._frame(PING, ACK, 0, payload)
        elif kind == PRIORITY:
            if not stream_id:
                raise H2ConnectionError(PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                self._stream_error(stream_id, FRAME_SIZE_ERROR)
            elif _U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
                self._stream_error(stream_id, PROTOCOL_ERROR)  # depends on itself
        elif kind == GOAWAY:
            if stream_id:
                raise H2ConnectionError(PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "GOAWAY under 8 bytes")
            self.events.on_goaway()
        elif kind == PUSH_PROMISE:
            raise H2ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # other types are extensions: ignored (RFC 9113 5.5)

    # -- frames --------------------------------------------------------------------------

    def _unpad(self, flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "a padded frame with no pad length")
        pad = payload[0]
        if pad >= len(payload):
            raise H2ConnectionError(PROTOCOL_ERROR, "padding as long as the frame")
        return payload[1:len(payload) - pad]

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if size > self.recv_window:
            raise H2ConnectionError(FLOW_CONTROL_ERROR, "DATA past the connection's window")
        self.recv_window -= size
        body = self._unpad(flags, payload)
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_ended:
            if self._idle(stream_id):
                raise H2ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            self.ack_data(0, size)  # nobody takes it: the connection's window stays open
            if stream is not None or stream_id not in self.recently_reset:
                self._stream_error(stream_id, STREAM_CLOSED)
            return
        if size > stream.recv_window:
            self.ack_data(0, size)
            self._stream_error(stream_id, FLOW_CONTROL_ERROR)
            return
        stream.recv_window -= size
        if size:
            self.events.on_data(stream_id, body, size)
        if flags & END_STREAM and self.streams.get(stream_id) is stream:  # (not reset meanwhile)
            self._remote_end(stream_id, stream)

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError(PROTOCOL_ERROR, "HEADERS on stream 0")
        if not stream_id & 1:
            raise H2ConnectionError(PROTOCOL_ERROR, "HEADERS on an even stream")
        block = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            # depending on itself is a stream error, once the block kept HPACK in step
            self.block_self_dependent = _U32.unpack_from(block)[0] & 0x7FFFFFFF == stream_id
            block = block[5:]
        else:
            self.block_self_dependent = False
        self.block = [block]
        self.block_stream = stream_id
        self.block_flags = flags
        if flags & END_HEADERS:
            self._block_done()

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not self.block_stream or stream_id != self.block_stream:
            raise H2ConnectionError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self.block.append(payload)
        if flags & END_HEADERS:
            self._block_done()

    def _block_done(self) -> None:
        stream_id, flags = self.block_stream, self.block_flags
        block = self.block[0] if len(self.block) == 1 else b"".join(self.block)
        self.block = []
        self.block_stream = 0
        try:
            headers, too_large = self.decoder.decode(block)
        except CompressionError as exc:
            raise H2ConnectionError(COMPRESSION_ERROR, str(exc)) from None
        ended = bool(flags & END_STREAM)
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers
            if stream.remote_ended:
                self._stream_error(stream_id, STREAM_CLOSED)
            elif not ended:
                self._stream_error(stream_id, PROTOCOL_ERROR)  # trailers that do not end it
            else:
                self.events.on_trailers(stream_id, headers)
                self._remote_end(stream_id, stream)
            return
        if stream_id <= self.last_stream_id:
            if stream_id in self.recently_reset:
                return  # sent before it heard of our reset
            raise H2ConnectionError(STREAM_CLOSED, "HEADERS on a closed stream")
        self.last_stream_id = stream_id
        if self.block_self_dependent:
            self._stream_error(stream_id, PROTOCOL_ERROR)
            return
        if self.goaway_sent:
            self._remember_reset(stream_id)  # past our GOAWAY: not processed (nor its DATA)
            return
        if len(self.streams) >= self.settings.max_concurrent_streams:
            self._stream_error(stream_id, REFUSED_STREAM)
            return
        self.streams[stream_id] = _Stream(self.peer_stream_window, self.settings.stream_window,
                                          ended)
        self.events.on_request(stream_id, headers, ended, too_large)

    def _remote_end(self, stream_id: int, stream: _Stream) -> None:
        stream.remote_ended = True
        if stream.local_ended:
            self.streams.pop(stream_id, None)
        self.events.on_end(stream_id)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE not of 4 bytes")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise H2ConnectionError(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise H2ConnectionError(FLOW_CONTROL_ERROR, "the connection's window past 2^31-1")
            self.events.on_window(0)
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            if self._idle(stream_id):
                raise H2ConnectionError(PROTOCOL_ERROR, "WINDOW_UPDATE on an idle stream")
            return  # closed: ignored
        if not increment:
            self._stream_error(stream_id, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR)
            return
        self.events.on_window(stream_id)

    def _idle(self, stream_id: int) -> bool:
        """Never opened: past the last the client opened, or even (we push none)."""
        return stream_id > self.last_stream_id or not stream_id & 1

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM not of 4 bytes")
        if self._idle(stream_id) and stream_id not in self.streams:
            raise H2ConnectionError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        if self.streams.pop(stream_id, None) is not None:
            self._remember_reset(stream_id)
            self.events.on_reset(stream_id)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise H2ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "a SETTINGS ACK with a payload")
            self.decoder.limit(self.settings.header_table)  # now in force
            return
        if len(payload) % 6:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "SETTINGS not in 6-byte units")
        opened = False
        for at in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, at)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2ConnectionError(FLOW_CONTROL_ERROR, "an initial window past 2^31-1")
                delta = value - self.peer_stream_window
                opened = opened or delta > 0
                self.peer_stream_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise H2ConnectionError(FLOW_CONTROL_ERROR, "a window past 2^31-1")
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 0xFFFFFF:
                    raise H2ConnectionError(PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value}")
                self.max_frame = value
            elif key in (ENABLE_PUSH, ENABLE_CONNECT_PROTOCOL) and value > 1:
                raise H2ConnectionError(PROTOCOL_ERROR, f"setting {key} = {value}")
        self._frame(SETTINGS, ACK, 0, b"")
        if opened:
            self.events.on_window(0)  # a larger initial window may unblock streams

    # -- what we send --------------------------------------------------------------------

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        length = len(payload)
        self.out.append(_HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream_id))
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
        """HEADERS (and CONTINUATION past the client's frame size); False if it is closed."""
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

    def _local_end(self, stream_id: int, stream: _Stream) -> None:
        stream.local_ended = True
        if stream.remote_ended:
            del self.streams[stream_id]

    def ack_data(self, stream_id: int, size: int) -> None:
        """Give back `size` received bytes of window: the connection's, and the stream's
        while the client may still send on it. WINDOW_UPDATE goes out once a quarter of a
        window is owed, or half of it is used up (a client at 0 gets it at once)."""
        if size <= 0:
            return
        self.recv_owed += size
        target = self.settings.connection_window
        if self.recv_owed >= target // 4 or self.recv_window <= target // 2:
            self._frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_owed))
            self.recv_window += self.recv_owed
            self.recv_owed = 0
        stream = self.streams.get(stream_id) if stream_id else None
        if stream is None or stream.remote_ended:
            return
        stream.recv_owed += size
        target = self.settings.stream_window
        if stream.recv_owed >= target // 4 or stream.recv_window <= target // 2:
            self._frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(stream.recv_owed))
            stream.recv_window += stream.recv_owed
            stream.recv_owed = 0

    def reset_stream(self, stream_id: int, code: int) -> None:
        """RST_STREAM (if the stream is still known); it is then forgotten."""
        if self.streams.pop(stream_id, None) is not None:
            self._frame(RST_STREAM, 0, stream_id, _U32.pack(code))
            self._remember_reset(stream_id)

    def stream_error(self, stream_id: int, code: int) -> None:
        """Reset a stream for the client's fault (a malformed request, a body that does not
        match its length, …): the same as `_stream_error`, for the user of the core. Raises
        `H2ConnectionError` past the reset budget."""
        self._stream_error(stream_id, code)

    def _stream_error(self, stream_id: int, code: int) -> None:
        reason = self.budget.stream_error(self.now)
        if reason is not None:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, reason)
        known = stream_id in self.streams
        self.streams.pop(stream_id, None)
        self._frame(RST_STREAM, 0, stream_id, _U32.pack(code))
        self._remember_reset(stream_id)
        if known:
            self.events.on_reset(stream_id)

    def _remember_reset(self, stream_id: int) -> None:
        reset = self.recently_reset
        reset[stream_id] = None
        if len(reset) > RECENTLY_RESET:
            del reset[next(iter(reset))]

    def goaway(self, code: int, debug: bytes = b"", last_stream_id: int = -1) -> None:
        """GOAWAY: streams past `last_stream_id` (default: the last the client opened) will
        not be processed."""
        last = self.last_stream_id if last_stream_id < 0 else last_stream_id
        self._frame(GOAWAY, 0, 0, _U32.pack(last) + _U32.pack(code) + debug)
        self.goaway_sent = True
