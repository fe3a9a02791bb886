"""The client side of HTTP/2 (RFC 9113) as a pure state machine, for the edge's
connections to machines that speak HTTP/2 with prior knowledge (apps whose protocol is
"h2c": edge/adapters/h2upstream.py). Bytes in, calls to an `Events` handler
(`on_response`, `on_data`, `on_trailers`, `on_end`, `on_reset`, `on_window`,
`on_goaway`) and frames out (`data_to_send`); no IO and no clock.

What both sides share is edge/core/h2peer.py's (receive) and edge/core/h2send.py's
(send). The client's own:
- the preface and SETTINGS first (push off, our stream and connection windows);
- streams it opens (odd, increasing), as many as the machine's
  SETTINGS_MAX_CONCURRENT_STREAMS allow (`can_open`);
- a stream's header blocks: informational (1xx) heads skipped, the final head
  (`on_response`), then trailers, which must end the stream (else a stream error);
  a header block on a stream we reset is decoded (HPACK stays in step) and dropped;
- a GOAWAY: no new streams; those above its last id were never processed and are
  forgotten here (the handler hears `on_goaway` and may send them again); those at
  or below it go on to their end — a graceful shutdown loses nothing.

Whether a response's fields are well-formed is the handler's to judge (edge/core/
h2map.py): a malformed one is then reset with `reset_stream(id, PROTOCOL_ERROR)`, a
stream error, never the connection's.
"""

from __future__ import annotations

from edge.core.h2budget import FrameBudget
from edge.core.h2peer import H2Peer
from edge.core.h2send import StreamState
from edge.core.h2wire import (
    PREFACE,
    PROTOCOL_ERROR,
    STREAM_CLOSED,
    Events,
    H2ConnectionError,
    Settings,
)

LAST_STREAM_ID = (1 << 31) - 1


class H2Client(H2Peer):
    """One connection, client side."""

    def __init__(self, events: Events, settings: Settings, budget: FrameBudget) -> None:
        super().__init__(events, settings, budget)
        self.client = True
        self.next_stream_id = 1
        self.goaway_received = False
        self.goaway_last = LAST_STREAM_ID  # the last stream the peer's GOAWAY kept

    def start(self) -> None:
        """The preface, then our SETTINGS (`Settings.max_concurrent_streams` 0: no push)."""
        self.out.append(PREFACE)
        super().start()

    def receive(self, data: bytes, now: float) -> None:
        """Handle the server's bytes; raises `H2ConnectionError`."""
        self._frames(data, now, 0)

    @property
    def can_open(self) -> bool:
        """Room for a new stream: no GOAWAY, ids left, under the peer's concurrency."""
        return (not self.goaway_received and not self.goaway_sent
                and self.next_stream_id < LAST_STREAM_ID
                and len(self.streams) < self.peer_max_streams)

    def open_stream(self, headers: list[tuple[bytes, bytes]], end_stream: bool) -> int:
        """A new stream with its request head; its id (0 when no stream can be opened)."""
        if not self.can_open:
            return 0
        stream_id = self.next_stream_id
        self.next_stream_id += 2
        self.streams[stream_id] = StreamState(self.peer_stream_window,
                                              self.settings.stream_window, False)
        self.send_headers(stream_id, headers, end_stream)
        return stream_id

    def is_open(self, stream_id: int) -> bool:
        """We may still send on the stream."""
        stream = self.streams.get(stream_id)
        return stream is not None and not stream.local_ended

    def _idle(self, stream_id: int) -> bool:
        """Never opened: one we have not opened yet, or even (the peer pushes none)."""
        return stream_id >= self.next_stream_id or not stream_id & 1

    def _goaway(self, last_stream_id: int, code: int) -> None:
        self.goaway_received = True
        if last_stream_id < self.goaway_last:
            self.goaway_last = last_stream_id
        for stream_id in [sid for sid in self.streams if sid > last_stream_id]:
            del self.streams[stream_id]  # never processed: nothing more comes on it
        self.events.on_goaway(last_stream_id, code)

    def _block_done(self) -> None:
        stream_id, ended, headers, too_large = self._take_block()
        stream = self.streams.get(stream_id)
        if stream is None:
            if self._idle(stream_id):
                raise H2ConnectionError(PROTOCOL_ERROR, "HEADERS on a stream we did not open")
            if self.recently_reset.get(stream_id) is not False:  # (False: sent before it
                self.stream_error(stream_id, STREAM_CLOSED)       # heard of our reset)
            return
        if stream.remote_ended:
            self.stream_error(stream_id, STREAM_CLOSED)
        elif too_large or self.block_self_dependent:
            self.stream_error(stream_id, PROTOCOL_ERROR)
        elif not stream.headed:
            status = headers[0][1] if headers and headers[0][0] == b":status" else b""
            if len(status) == 3 and status[:1] == b"1" and status != b"101":
                if ended:  # an informational head cannot end the stream
                    self.stream_error(stream_id, PROTOCOL_ERROR)
                return  # 1xx: skipped (a machine's 103 or 100 is not the answer)
            stream.headed = True
            self.events.on_response(stream_id, headers, ended)
            if ended and self.streams.get(stream_id) is stream:
                self._remote_end(stream_id, stream)
        elif not ended:
            self.stream_error(stream_id, PROTOCOL_ERROR)  # trailers that do not end it
        else:
            self.events.on_trailers(stream_id, headers)
            self._remote_end(stream_id, stream)
