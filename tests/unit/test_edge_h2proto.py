"""The HTTP/2 server state machine (edge/core/h2proto.py), driven by the h2 library's
client (or hand-made frames) with no sockets: frames in, events and frames out."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import hyperframe.frame as hf
import pytest

from edge.core.h2budget import FrameBudget, Limits
from edge.core.h2proto import H2Server
from edge.core.h2wire import (
    CANCEL,
    COMPRESSION_ERROR,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    NO_ERROR,
    PREFACE,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    STREAM_CLOSED,
    H2ConnectionError,
    Settings,
)
from tests.support.h2events import Recorder, frames

REQUEST = [(":method", "GET"), (":scheme", "http"), (":authority", "a.localhost"),
           (":path", "/")]
POST = [(":method", "POST"), (":scheme", "http"), (":authority", "a.localhost"),
        (":path", "/up")]


def server(**settings: Any) -> tuple[H2Server, Recorder]:
    events = Recorder()
    h2s = H2Server(events, Settings(**settings), FrameBudget(Limits(), 0.0))
    h2s.start()
    return h2s, events


def client() -> h2.connection.H2Connection:
    c = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    return c


def connected(**settings: Any) -> tuple[H2Server, Recorder, h2.connection.H2Connection]:
    """A server and an h2 client past the preface and both SETTINGS."""
    h2s, events = server(**settings)
    c = client()
    h2s.receive(c.data_to_send(), 0.0)
    c.receive_data(h2s.data_to_send())
    h2s.receive(c.data_to_send(), 0.0)  # the client's ACK
    events.calls.clear()
    return h2s, events, c


def raw(frame: hf.Frame) -> bytes:
    return bytes(frame.serialize())


def test_the_server_preface_is_settings_then_the_connection_window() -> None:
    h2s, _ = server(max_concurrent_streams=7, stream_window=100_000,
                    connection_window=1 << 20)
    sent = frames(h2s.data_to_send())
    assert isinstance(sent[0], hf.SettingsFrame)
    assert sent[0].settings[hf.SettingsFrame.MAX_CONCURRENT_STREAMS] == 7
    assert sent[0].settings[hf.SettingsFrame.INITIAL_WINDOW_SIZE] == 100_000
    assert sent[0].settings[hf.SettingsFrame.ENABLE_PUSH] == 0
    assert isinstance(sent[1], hf.WindowUpdateFrame) and sent[1].window_increment == \
        (1 << 20) - 65535


def test_a_request_and_its_answer_round_trip_with_the_h2_client() -> None:
    h2s, events, c = connected()
    c.send_headers(1, REQUEST, end_stream=True)
    h2s.receive(c.data_to_send(), 0.0)
    assert events.calls == [("request", 1, True, False)]
    assert h2s.send_headers(1, [(b":status", b"200"), (b"content-length", b"2")])
    assert h2s.send_data(1, b"ok", end_stream=True)
    got = c.receive_data(h2s.data_to_send())
    kinds = [type(e) for e in got]
    assert kinds == [h2.events.ResponseReceived, h2.events.DataReceived, h2.events.StreamEnded]
    assert got[1].data == b"ok"
    assert 1 not in h2s.streams  # closed both ways: forgotten


def test_the_preface_may_come_a_byte_at_a_time() -> None:
    h2s, events = server()
    c = client()
    c.send_headers(1, REQUEST, end_stream=True)
    for byte in c.data_to_send():
        h2s.receive(bytes((byte,)), 0.0)
    assert events.calls == [("request", 1, True, False)]


def test_body_trailers_and_end_are_reported_in_order() -> None:
    h2s, events, c = connected()
    c.send_headers(1, POST)
    c.send_data(1, b"abc")
    c.send_headers(1, [("x-sum", "1")], end_stream=True)
    h2s.receive(c.data_to_send(), 0.0)
    assert events.calls == [("request", 1, False, False), ("data", 1, b"abc", 3),
                            ("trailers", 1, [(b"x-sum", b"1")]), ("end", 1)]


def test_padding_counts_against_the_window_but_is_not_data() -> None:
    h2s, events, _ = connected()
    h2s.receive(raw(hf.HeadersFrame(1, data=_block(POST), flags=["END_HEADERS"])), 0.0)
    frame = hf.DataFrame(1, data=b"xy", flags=["PADDED", "END_STREAM"])
    frame.pad_length = 10
    h2s.receive(raw(frame), 0.0)
    assert events.calls[1:] == [("data", 1, b"xy", 13), ("end", 1)]


def make(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """A frame as bytes, whatever it says (hyperframe refuses to build invalid ones)."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) \
        + stream_id.to_bytes(4, "big") + payload


U32 = (1).to_bytes(4, "big")


@pytest.mark.parametrize("frame, code", [
    (make(0x0, 0, 0, b"x"), PROTOCOL_ERROR),  # DATA on stream 0
    (make(0x0, 0, 9, b"x"), PROTOCOL_ERROR),  # DATA on an idle stream
    (make(0x1, 0x4, 2, b"\x82"), PROTOCOL_ERROR),  # HEADERS on an even stream
    (make(0x1, 0x4, 0, b"\x82"), PROTOCOL_ERROR),
    (make(0x9, 0x4, 1, b"\x82"), PROTOCOL_ERROR),  # CONTINUATION with no HEADERS
    (make(0x3, 0, 0, U32), PROTOCOL_ERROR),
    (make(0x3, 0, 9, U32), PROTOCOL_ERROR),  # RST_STREAM on an idle stream
    (make(0x8, 0, 0, bytes(4)), PROTOCOL_ERROR),  # WINDOW_UPDATE of 0
    (make(0x8, 0, 0, ((1 << 31) - 1).to_bytes(4, "big")), FLOW_CONTROL_ERROR),
    (make(0x8, 0, 9, U32), PROTOCOL_ERROR),  # WINDOW_UPDATE on an idle stream
    (make(0x8, 0, 0, b"\x00\x01"), FRAME_SIZE_ERROR),
    (make(0x6, 0, 1, b"12345678"), PROTOCOL_ERROR),  # PING on a stream
    (make(0x4, 0, 1), PROTOCOL_ERROR),  # SETTINGS on a stream
    (make(0x4, 0, 0, b"\x00\x05\x00\x00\x00\x64"), PROTOCOL_ERROR),  # MAX_FRAME_SIZE 100
    (make(0x4, 0, 0, b"\x00\x02\x00\x00\x00\x02"), PROTOCOL_ERROR),  # ENABLE_PUSH 2
    (make(0x4, 0, 0, b"\x00\x04\x80\x00\x00\x00"), FLOW_CONTROL_ERROR),  # window 2^31
    (make(0x2, 0, 0, bytes(5)), PROTOCOL_ERROR),  # PRIORITY on stream 0
    (make(0x5, 0x4, 1, bytes(4) + b"\x82"), PROTOCOL_ERROR),  # PUSH_PROMISE from a client
    (make(0x7, 0, 1, bytes(8)), PROTOCOL_ERROR),  # GOAWAY on a stream
    (make(0x1, 0x4, 1, b"\x80"), COMPRESSION_ERROR),
    (make(0x1, 0xC, 1, b"\x05\x82"), PROTOCOL_ERROR),  # padding past the frame
])
def test_connection_errors(frame: bytes, code: int) -> None:
    h2s, _, _ = connected()
    with pytest.raises(H2ConnectionError) as caught:
        h2s.receive(frame, 0.0)
    assert caught.value.code == code


@pytest.mark.parametrize("payload, code", [
    (make(0x3, 0, 1, b"\x00"), FRAME_SIZE_ERROR),  # RST_STREAM of 1 byte
    (b"\x00\x00\x07\x06\x00\x00\x00\x00\x00" + b"1234567", FRAME_SIZE_ERROR),  # PING of 7
    (b"\x00\x00\x05\x04\x00\x00\x00\x00\x00" + b"12345", FRAME_SIZE_ERROR),  # SETTINGS of 5
    (b"\x00\x00\x00\x04\x01\x00\x00\x00\x00", None),  # a SETTINGS ACK: fine
    (b"\x00\x40\x01\x00\x00\x00\x00\x00\x01", FRAME_SIZE_ERROR),  # 16385 bytes announced
])
def test_frame_sizes(payload: bytes, code: int | None) -> None:
    h2s, _, _ = connected()
    if code is None:
        h2s.receive(payload, 0.0)
        return
    with pytest.raises(H2ConnectionError) as caught:
        h2s.receive(payload, 0.0)
    assert caught.value.code == code


def test_not_the_preface_or_not_settings_first_are_connection_errors() -> None:
    h2s, _ = server()
    with pytest.raises(H2ConnectionError):
        h2s.receive(b"GET / HTTP/1.1\r\n\r\n", 0.0)
    h2s, _ = server()
    with pytest.raises(H2ConnectionError):
        h2s.receive(PREFACE + raw(hf.PingFrame(0, opaque_data=b"12345678")), 0.0)


def test_a_header_block_interrupted_by_another_frame_is_a_connection_error() -> None:
    h2s, _, _ = connected()
    with pytest.raises(H2ConnectionError):
        h2s.receive(raw(hf.HeadersFrame(1, data=b"\x82")) + raw(hf.PingFrame(0)), 0.0)


def test_continuations_complete_a_block() -> None:
    h2s, events, _ = connected()
    block = _block(REQUEST)
    h2s.receive(raw(hf.HeadersFrame(1, data=block[:3], flags=["END_STREAM"]))
                + raw(hf.ContinuationFrame(1, data=block[3:6]))
                + raw(hf.ContinuationFrame(1, data=block[6:], flags=["END_HEADERS"])), 0.0)
    assert events.calls == [("request", 1, True, False)]


def test_stream_ids_must_increase_and_a_closed_stream_takes_no_headers() -> None:
    h2s, _events, c = connected()
    c.send_headers(3, REQUEST, end_stream=True)
    h2s.receive(c.data_to_send(), 0.0)
    h2s.send_headers(3, [(b":status", b"204")], end_stream=True)  # stream 3 closed
    with pytest.raises(H2ConnectionError) as caught:
        h2s.receive(raw(hf.HeadersFrame(1, data=b"\x82\x86\x84", flags=["END_HEADERS"])), 0.0)
    assert caught.value.code == STREAM_CLOSED


def test_data_after_end_stream_is_a_stream_error() -> None:
    h2s, events, c = connected()
    c.send_headers(1, REQUEST, end_stream=True)
    h2s.receive(c.data_to_send(), 0.0)
    h2s.receive(raw(hf.DataFrame(1, data=b"late")), 0.0)
    assert events.calls[-1] == ("reset", 1, STREAM_CLOSED)
    sent = frames(h2s.data_to_send())
    assert any(isinstance(f, hf.RstStreamFrame) and f.error_code == STREAM_CLOSED for f in sent)
    assert any(isinstance(f, hf.WindowUpdateFrame) and f.stream_id == 0 for f in sent) or \
        h2s.recv_owed == 4  # the connection's window is given back


def test_frames_in_flight_after_our_reset_are_ignored() -> None:
    h2s, events, c = connected()
    c.send_headers(1, POST)
    h2s.receive(c.data_to_send(), 0.0)
    h2s.reset_stream(1, CANCEL)
    h2s.data_to_send()
    h2s.receive(raw(hf.DataFrame(1, data=b"x" * 100))
                + raw(hf.HeadersFrame(1, data=b"\x40\x01a\x01b",
                                      flags=["END_HEADERS", "END_STREAM"])), 0.0)
    assert not [f for f in frames(h2s.data_to_send()) if isinstance(f, hf.RstStreamFrame)]
    assert events.calls == [("request", 1, False, False)]
    assert h2s.decoder.table[0] == (b"a", b"b")  # HPACK kept in step


def test_trailers_without_end_stream_are_a_stream_error() -> None:
    h2s, events, c = connected()
    c.send_headers(1, POST)
    h2s.receive(c.data_to_send(), 0.0)
    h2s.receive(raw(hf.HeadersFrame(1, data=b"\x40\x01a\x01b", flags=["END_HEADERS"])), 0.0)
    assert events.calls[-1] == ("reset", 1, PROTOCOL_ERROR)


def test_streams_past_the_limit_are_refused_and_never_reported() -> None:
    h2s, events, _ = connected(max_concurrent_streams=2)
    for sid in (1, 3, 5):
        h2s.receive(make(0x1, 0x5, sid, _block(REQUEST)), 0.0)
    assert [call[1] for call in events.calls] == [1, 3]
    refused = [f for f in frames(h2s.data_to_send()) if isinstance(f, hf.RstStreamFrame)]
    assert [(f.stream_id, f.error_code) for f in refused] == [(5, REFUSED_STREAM)]
    h2s.send_headers(1, [(b":status", b"204")], end_stream=True)  # one ends: room again
    h2s.receive(make(0x1, 0x5, 7, _block(REQUEST)), 0.0)
    assert events.calls[-1] == ("request", 7, True, False)


def test_a_stream_depending_on_itself_is_a_stream_error() -> None:
    h2s, events, _ = connected()
    h2s.receive(make(0x1, 0x24, 1, U32 + b"\x10" + _block(REQUEST)), 0.0)
    assert events.calls == []
    assert [type(f) for f in frames(h2s.data_to_send())] == [hf.RstStreamFrame]


def test_data_past_a_streams_window_is_a_stream_error() -> None:
    h2s, events, _ = connected(stream_window=65535, connection_window=1 << 20)
    h2s.receive(raw(hf.HeadersFrame(1, data=_block(POST), flags=["END_HEADERS"])), 0.0)
    chunk = b"x" * 16384
    h2s.receive(b"".join(raw(hf.DataFrame(1, data=chunk)) for _ in range(4)), 0.0)
    assert events.calls[-1] == ("reset", 1, FLOW_CONTROL_ERROR)


def test_send_data_respects_the_windows_and_the_clients_frame_size() -> None:
    h2s, _, c = connected()
    c.update_settings({hf.SettingsFrame.INITIAL_WINDOW_SIZE: 100})
    c.send_headers(1, REQUEST, end_stream=True)
    h2s.receive(c.data_to_send(), 0.0)
    assert h2s.window(1) == 100
    h2s.send_headers(1, [(b":status", b"200")])
    h2s.send_data(1, b"x" * 100)
    assert h2s.window(1) == 0
    c.receive_data(h2s.data_to_send())  # the client accepts it: within its window
    c.update_settings({hf.SettingsFrame.INITIAL_WINDOW_SIZE: 60000,
                       hf.SettingsFrame.MAX_FRAME_SIZE: 20000})
    h2s.receive(c.data_to_send(), 0.0)
    assert h2s.window(1) == 59900  # the new initial window, less what was sent
    h2s.send_data(1, b"y" * 59900, end_stream=True)
    sizes = [len(f.data) for f in frames(h2s.data_to_send()) if isinstance(f, hf.DataFrame)]
    assert max(sizes) <= 20000 and sum(sizes) == 59900
    assert h2s.window(1) == 0 and 1 not in h2s.streams


def test_a_shrinking_initial_window_may_make_a_window_negative_and_recover() -> None:
    h2s, events, c = connected()
    c.send_headers(1, REQUEST, end_stream=True)
    h2s.receive(c.data_to_send(), 0.0)
    h2s.send_data(1, b"x" * 1000)
    h2s.receive(raw(hf.SettingsFrame(0, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: 0})),
                0.0)
    assert h2s.streams[1].send_window == -1000 and h2s.window(1) < 0
    h2s.receive(raw(hf.WindowUpdateFrame(1, window_increment=1500)), 0.0)
    assert h2s.window(1) == 500 and events.calls[-1] == ("window", 1)


def test_acknowledged_data_reopens_the_clients_windows() -> None:
    h2s, _events, c = connected(stream_window=65535, connection_window=1 << 20)
    c.send_headers(1, POST)
    c.send_data(1, b"x" * 16384)
    c.send_data(1, b"x" * 16384)
    h2s.receive(c.data_to_send(), 0.0)
    h2s.ack_data(1, 32768)
    updates = {f.stream_id: f.window_increment for f in frames(h2s.data_to_send())
               if isinstance(f, hf.WindowUpdateFrame)}
    assert updates.get(1) == 32768  # half of the stream's window was used: all given back
    assert 0 not in updates  # the connection's is far from half used


def test_ping_is_answered_and_settings_acknowledged() -> None:
    h2s, _, _ = connected()
    h2s.receive(raw(hf.PingFrame(0, opaque_data=b"abcdefgh"))
                + raw(hf.SettingsFrame(0, settings={hf.SettingsFrame.HEADER_TABLE_SIZE: 0})),
                0.0)
    sent = frames(h2s.data_to_send())
    assert isinstance(sent[0], hf.PingFrame) and "ACK" in sent[0].flags \
        and sent[0].opaque_data == b"abcdefgh"
    assert isinstance(sent[1], hf.SettingsFrame) and "ACK" in sent[1].flags


def test_goaway_from_us_stops_new_streams_and_from_the_client_is_reported() -> None:
    h2s, events, c = connected()
    c.send_headers(1, REQUEST, end_stream=True)
    h2s.receive(c.data_to_send(), 0.0)
    h2s.goaway(0)
    goaway = frames(h2s.data_to_send())[0]
    assert isinstance(goaway, hf.GoAwayFrame) and goaway.last_stream_id == 1
    c.send_headers(3, REQUEST, end_stream=True)
    h2s.receive(c.data_to_send(), 0.0)
    h2s.receive(raw(hf.GoAwayFrame(0, last_stream_id=0)), 0.0)
    assert events.calls == [("request", 1, True, False), ("goaway", 0, NO_ERROR)]


def test_a_budget_over_its_limit_is_enhance_your_calm() -> None:
    events = Recorder()
    h2s = H2Server(events, Settings(), FrameBudget(Limits(pings_per_s=2), 0.0))
    pings = b"".join(raw(hf.PingFrame(0, opaque_data=b"12345678")) for _ in range(10))
    with pytest.raises(H2ConnectionError) as caught:
        h2s.receive(PREFACE + raw(hf.SettingsFrame(0)) + pings, 0.0)
    assert caught.value.code == ENHANCE_YOUR_CALM


def test_frames_split_at_every_byte_read_alike() -> None:
    h2s, events, c = connected()
    c.send_headers(1, POST)
    c.send_data(1, b"hello")
    c.send_headers(1, [("x-t", "1")], end_stream=True)
    for byte in c.data_to_send():
        h2s.receive(bytes((byte,)), 0.0)
    assert events.calls == [("request", 1, False, False), ("data", 1, b"hello", 5),
                            ("trailers", 1, [(b"x-t", b"1")]), ("end", 1)]


def test_an_oversized_header_list_is_reported_cut() -> None:
    h2s, events, c = connected(max_header_list=200)
    c.send_headers(1, [*REQUEST, ("x-big", "v" * 300)], end_stream=True)
    h2s.receive(c.data_to_send(), 0.0)
    assert events.calls == [("request", 1, True, True)]


def _block(headers: list[tuple[str, str]]) -> bytes:
    import hpack

    return bytes(hpack.Encoder().encode(headers))


@pytest.mark.parametrize("frame", [
    make(0x0, 0, 2, b"x"),  # DATA on an even stream, never opened (we push none)
    make(0x3, 0, 2, U32),
    make(0x8, 0, 2, U32),
])
def test_frames_on_even_streams_are_on_idle_streams(frame: bytes) -> None:
    h2s, _, _ = connected()
    h2s.receive(make(0x1, 0x5, 5, _block(REQUEST)), 0.0)
    with pytest.raises(H2ConnectionError) as caught:
        h2s.receive(frame, 0.0)
    assert caught.value.code == PROTOCOL_ERROR


def test_stream_errors_the_client_causes_spend_the_reset_budget() -> None:
    """MadeYouReset (CVE-2025-8671): streams opened and then made to fail by a frame the
    server must reset for count as resets, or the rapid-reset budget is bypassed."""
    events = Recorder()
    h2s = H2Server(events, Settings(), FrameBudget(Limits(resets_per_s=5), 0.0))
    h2s.receive(PREFACE + raw(hf.SettingsFrame(0)), 0.0)
    with pytest.raises(H2ConnectionError) as caught:
        for sid in range(1, 200, 2):  # open, then a WINDOW_UPDATE of 0: a stream error each
            h2s.receive(make(0x1, 0x5, sid, _block(REQUEST)) + make(0x8, 0, sid, bytes(4)),
                        0.0)
    assert caught.value.code == ENHANCE_YOUR_CALM
    assert len([c for c in events.calls if c[0] == "request"]) <= 11  # burst 10, then GOAWAY


def test_a_lowered_table_size_must_be_taken_up_by_the_client() -> None:
    h2s, _, _ = connected(header_table=1024)  # acknowledged by the client in `connected`
    with pytest.raises(H2ConnectionError) as caught:
        h2s.receive(make(0x1, 0x5, 1, b"\x82\x86\x84"), 0.0)  # no size update first
    assert caught.value.code == COMPRESSION_ERROR
    h2s, events, _ = connected(header_table=1024)
    h2s.receive(make(0x1, 0x5, 1, b"\x3f\xe1\x07" + _block(REQUEST)), 0.0)  # 1024, then fields
    assert events.calls == [("request", 1, True, False)]


def test_a_read_of_many_requests_is_taken_in_slices_with_nothing_lost_or_reordered() -> None:
    """`max_requests`: at most that many streams opened per `receive`; the rest of the
    bytes (frames after the last stream opened, a reset of it included) wait for a
    `receive(b"")`, in order, however the frames fall."""
    h2s, events, c = connected()
    for sid in range(1, 40, 2):  # 20 requests, each reset right after it opened
        c.send_headers(sid, REQUEST, end_stream=True)
        c.reset_stream(sid)
    data = c.data_to_send()
    turns = [h2s.receive(data, 0.0, max_requests=8)]
    while turns[-1]:
        turns.append(h2s.receive(b"", 0.0, max_requests=8))
    assert turns == [True, True, False]  # 8, 8, then the last 4 and their resets
    opened = [call[1] for call in events.calls if call[0] == "request"]
    reset = [call[1] for call in events.calls if call[0] == "reset"]
    assert opened == list(range(1, 40, 2)) and reset == opened  # each once, in order
    assert h2s.buffer == b""
