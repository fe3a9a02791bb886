"""The server side of HTTP/2 (RFC 9113) as a pure state machine: bytes in, calls to an
`Events` handler and frames out (`data_to_send`). No IO and no clock: `receive` takes
`now` for the frame budgets.

What both sides receive alike — frames, windows, SETTINGS, the budgets — is edge/core/
h2peer.py's; what both send, edge/core/h2send.py's. The server's own: the client
preface, stream ids the client opens (odd, increasing), a header block as a request
or its trailers (trailers must end the stream), SETTINGS_MAX_CONCURRENT_STREAMS.

A request's header list is handed over as decoded (well-formedness is edge/core/
h2head.py's business, so that a malformed request is a stream error). A HEADERS frame
past SETTINGS_MAX_CONCURRENT_STREAMS is refused (RST_STREAM REFUSED_STREAM) after its
block is decoded, so the HPACK table stays in step and the handler never sees it.
"""

from __future__ import annotations

from edge.core.h2budget import FrameBudget
from edge.core.h2peer import H2Peer
from edge.core.h2send import StreamState
from edge.core.h2wire import (
    PREFACE,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    STREAM_CLOSED,
    Events,
    H2ConnectionError,
    Settings,
)


class H2Server(H2Peer):
    """One connection, server side."""

    def __init__(self, events: Events, settings: Settings, budget: FrameBudget) -> None:
        super().__init__(events, settings, budget)
        self.preface_left = len(PREFACE)

    def receive(self, data: bytes, now: float, max_requests: int = 0) -> bool:
        """Handle the client's bytes; raises `H2ConnectionError`. With `max_requests`, stop
        once that many streams were opened (Envoy's `max_requests_per_io_cycle`): True when
        whole frames are left for a later `receive(b"", ...)`."""
        if self.preface_left:
            take = min(self.preface_left, len(data))
            at = len(PREFACE) - self.preface_left
            if data[:take] != PREFACE[at:at + take]:
                raise H2ConnectionError(PROTOCOL_ERROR, "not the HTTP/2 client preface")
            self.preface_left -= take
            data = data[take:]
        return self._frames(data, now, max_requests)

    def _idle(self, stream_id: int) -> bool:
        """Never opened: past the last the client opened, or even (we push none)."""
        return stream_id > self.last_stream_id or not stream_id & 1

    def _block_done(self) -> None:
        stream_id, ended, headers, too_large = self._take_block()
        stream = self.streams.get(stream_id)
        if stream is not None:  # trailers
            if stream.remote_ended:
                self.stream_error(stream_id, STREAM_CLOSED)
            elif not ended:
                self.stream_error(stream_id, PROTOCOL_ERROR)  # trailers that do not end it
            else:
                self.events.on_trailers(stream_id, headers)
                self._remote_end(stream_id, stream)
            return
        if stream_id <= self.last_stream_id:
            if self.recently_reset.get(stream_id) is False:
                return  # sent before it heard of our reset
            raise H2ConnectionError(STREAM_CLOSED, "HEADERS on a closed stream")
        self.last_stream_id = stream_id
        self.opened += 1
        if self.block_self_dependent:
            self.stream_error(stream_id, PROTOCOL_ERROR)
            return
        if self.goaway_sent:
            self._remember_reset(stream_id)  # past our GOAWAY: not processed (nor its DATA)
            return
        if len(self.streams) >= self.settings.max_concurrent_streams:
            self.stream_error(stream_id, REFUSED_STREAM)
            return
        self.streams[stream_id] = StreamState(self.peer_stream_window, self.settings.stream_window,
                                              ended)
        self.events.on_request(stream_id, headers, ended, too_large)
