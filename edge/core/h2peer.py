"""What both sides of an HTTP/2 connection receive alike (RFC 9113), pure: the frame loop
and every frame but a header block's meaning, which is each role's (a request to the
server, edge/core/h2proto.py; a response to the client, edge/core/h2client.py).

What it checks: a first SETTINGS frame; frame sizes per type; nothing on stream 0 that
belongs to a stream, and the reverse; HEADERS on an even stream (neither side here
pushes); CONTINUATION right after its HEADERS; padding; flow control (a DATA frame
past a window, a WINDOW_UPDATE of 0 or past 2^31-1); SETTINGS values; frames on
streams that were never opened (`_idle`, the role's). A connection error raises
`H2ConnectionError` (the caller sends GOAWAY and closes); a stream error sends
RST_STREAM and calls `Events.on_reset`. The frame budgets (edge/core/h2budget.py) are
read per frame.
"""

from __future__ import annotations

from edge.core.h2budget import FrameBudget
from edge.core.h2send import H2Sender, StreamState
from edge.core.h2wire import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    ENABLE_CONNECT_PROTOCOL,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_HEAD,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_WINDOW,
    PADDED,
    PING,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SETTING,
    SETTINGS,
    STREAM_CLOSED,
    U32,
    WINDOW_UPDATE,
    Events,
    H2ConnectionError,
    Settings,
)
from edge.core.hpack import CompressionError, Decoder


class H2Peer(H2Sender):
    """One connection's receiving half, either role (what it sends: H2Sender)."""

    def __init__(self, events: Events, settings: Settings, budget: FrameBudget) -> None:
        super().__init__(settings)
        self.events = events
        self.budget = budget
        self.decoder = Decoder(max(settings.header_table, 4096), settings.max_header_list)
        self.buffer = b""
        self.seen_settings = False
        self.block: list[bytes] = []  # an open header block's fragments
        self.block_stream = 0  # its stream (0: no block open)
        self.block_flags = 0  # its HEADERS frame's flags
        self.block_self_dependent = False  # its priority names its own stream
        self.now = 0.0  # the time of the bytes being handled (for the budgets)
        self.opened = 0  # streams the peer opened in this `receive`
        self.client = False  # this side is the client (edge/core/h2client.py)

    # -- the role's ------------------------------------------------------------------------

    def _idle(self, stream_id: int) -> bool:
        """Never opened (a frame on it, other than what opens one, is the peer's error)."""
        raise NotImplementedError

    def _block_done(self) -> None:
        """A whole header block arrived (`_take_block` reads it)."""
        raise NotImplementedError

    def _take_block(self) -> tuple[int, bool, list[tuple[bytes, bytes]], bool]:
        """The header block just ended, decoded (HPACK kept in step whatever becomes of
        it): (its stream, whether it ends the stream, its fields, whether their list was
        over the limit and cut)."""
        stream_id, flags = self.block_stream, self.block_flags
        block = self.block[0] if len(self.block) == 1 else b"".join(self.block)
        self.block = []
        self.block_stream = 0
        try:
            headers, too_large = self.decoder.decode(block)
        except CompressionError as exc:
            raise H2ConnectionError(COMPRESSION_ERROR, str(exc)) from None
        return stream_id, bool(flags & END_STREAM), headers, too_large

    def _goaway(self, last_stream_id: int, code: int) -> None:
        self.events.on_goaway(last_stream_id, code)

    # -- receive ---------------------------------------------------------------------------

    def _frames(self, data: bytes, now: float, max_requests: int) -> bool:
        """Handle the peer's bytes (after any preface); with `max_requests`, stop once that
        many streams were opened: True when whole frames are left for later."""
        self.now = now
        self.opened = 0
        buffer = self.buffer + data if self.buffer else data
        at = 0
        end = len(buffer)
        budget = self.budget
        while end - at >= 9:
            high, low, kind, flags, stream_id = FRAME_HEAD.unpack_from(buffer, at)
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
            if max_requests and self.opened >= max_requests:
                self.buffer = buffer[at:] if at < end else b""
                return len(self.buffer) >= 9
        self.buffer = buffer[at:] if at < end else b""
        return False

    # (one branch per frame type of RFC 9113 6: complex by what it reads, C901 allowed)
    def _receive_frame(  # noqa: C901
            self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
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
                if self.client and self._idle(stream_id):  # (our RST_STREAM on a stream
                    raise H2ConnectionError(          # it never opened: its error)
                        FRAME_SIZE_ERROR, "PRIORITY not of 5 bytes on an idle stream")
                self.stream_error(stream_id, FRAME_SIZE_ERROR)
            elif U32.unpack_from(payload)[0] & 0x7FFFFFFF == stream_id:
                self.stream_error(stream_id, PROTOCOL_ERROR)  # depends on itself
        elif kind == GOAWAY:
            if stream_id:
                raise H2ConnectionError(PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise H2ConnectionError(FRAME_SIZE_ERROR, "GOAWAY under 8 bytes")
            self._goaway(U32.unpack_from(payload)[0] & 0x7FFFFFFF, U32.unpack_from(payload, 4)[0])
        elif kind == PUSH_PROMISE:
            raise H2ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE (push is off)")
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
            if stream is not None or self.recently_reset.get(stream_id, True):
                self.stream_error(stream_id, STREAM_CLOSED)  # not one we reset: its error
            return
        if size > stream.recv_window:
            self.ack_data(0, size)
            self.stream_error(stream_id, FLOW_CONTROL_ERROR)
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
            self.block_self_dependent = U32.unpack_from(block)[0] & 0x7FFFFFFF == stream_id
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

    def _remote_end(self, stream_id: int, stream: StreamState) -> None:
        stream.remote_ended = True
        if stream.local_ended:
            self.streams.pop(stream_id, None)
        self.events.on_end(stream_id)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE not of 4 bytes")
        increment = U32.unpack(payload)[0] & 0x7FFFFFFF
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
            self.stream_error(stream_id, PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            self.stream_error(stream_id, FLOW_CONTROL_ERROR)
            return
        self.events.on_window(stream_id)

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise H2ConnectionError(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise H2ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM not of 4 bytes")
        if self._idle(stream_id) and stream_id not in self.streams:
            raise H2ConnectionError(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        if self.streams.pop(stream_id, None) is not None:
            self._remember_reset(stream_id, by_peer=True)
            self.events.on_reset(stream_id, U32.unpack(payload)[0])

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
            key, value = SETTING.unpack_from(payload, at)
            if key == INITIAL_WINDOW_SIZE:
                opened = self._initial_window(value) or opened
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 0xFFFFFF:
                    raise H2ConnectionError(PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value}")
                self.max_frame = value
            elif key == MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif key in (ENABLE_PUSH, ENABLE_CONNECT_PROTOCOL) and value > 1:
                raise H2ConnectionError(PROTOCOL_ERROR, f"setting {key} = {value}")
            elif key == ENABLE_PUSH and value and self.client:  # (a server's, RFC 9113 6.5.2)
                raise H2ConnectionError(PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH from a server")
        self._frame(SETTINGS, ACK, 0, b"")
        if opened:
            self.events.on_window(0)  # a larger initial window may unblock streams

    def _initial_window(self, value: int) -> bool:
        """The peer's SETTINGS_INITIAL_WINDOW_SIZE: every stream's window moves by the
        change. Whether it grew (streams may send again)."""
        if value > MAX_WINDOW:
            raise H2ConnectionError(FLOW_CONTROL_ERROR, "an initial window past 2^31-1")
        delta = value - self.peer_stream_window
        self.peer_stream_window = value
        for stream in self.streams.values():
            stream.send_window += delta
            if stream.send_window > MAX_WINDOW:
                raise H2ConnectionError(FLOW_CONTROL_ERROR, "a window past 2^31-1")
        return delta > 0

    def stream_error(self, stream_id: int, code: int) -> None:
        """Reset a stream for the peer's fault (a malformed message, DATA after
        END_STREAM, …), counted against the reset budget: raises `H2ConnectionError`
        past it."""
        reason = self.budget.stream_error(self.now)
        if reason is not None:
            raise H2ConnectionError(ENHANCE_YOUR_CALM, reason)
        known = stream_id in self.streams
        self.streams.pop(stream_id, None)
        self._frame(RST_STREAM, 0, stream_id, U32.pack(code))
        self._remember_reset(stream_id)
        if known:
            self.events.on_reset(stream_id, code)
