"""For the unit tests of the edge's HTTP/2 cores, both roles (edge/core/h2proto.py,
h2client.py): an `Events` handler that records each call as a tuple, and the frames a
core sent, parsed."""

from __future__ import annotations

from typing import Any

import hyperframe.frame as hf

from edge.core.h2wire import Events


def frames(data: bytes) -> list[hf.Frame]:
    out = []
    while data:
        frame, length = hf.Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9:9 + length]))
        out.append(frame)
        data = data[9 + length:]
    return out


class Recorder(Events):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool,
                   too_large: bool) -> None:
        self.calls.append(("request", stream_id, ended, too_large))

    def on_response(self, stream_id: int, headers: list[tuple[bytes, bytes]],
                    ended: bool) -> None:
        self.calls.append(("response", stream_id, headers, ended))

    def on_data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        self.calls.append(("data", stream_id, data, flow_length))

    def on_trailers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.calls.append(("trailers", stream_id, headers))

    def on_end(self, stream_id: int) -> None:
        self.calls.append(("end", stream_id))

    def on_reset(self, stream_id: int, code: int) -> None:
        self.calls.append(("reset", stream_id, code))

    def on_window(self, stream_id: int) -> None:
        self.calls.append(("window", stream_id))

    def on_goaway(self, last_stream_id: int, code: int) -> None:
        self.calls.append(("goaway", last_stream_id, code))
