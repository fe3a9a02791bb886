"""The HTTP/2 client state machine (edge/core/h2client.py), driven against the h2
library's server (or hand-made frames) with no sockets: frames in, events and frames
out. What a machine may do to the edge's client: answer, stream, trail, refuse, go
away gracefully, send malformed blocks, push."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import h2.settings
import hyperframe.frame as hf
import pytest

from edge.core.h2budget import FrameBudget, Limits
from edge.core.h2client import H2Client
from edge.core.h2wire import (
    CANCEL,
    FRAME_SIZE_ERROR,
    NO_ERROR,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    STREAM_CLOSED,
    H2ConnectionError,
    Settings,
)
from tests.support.h2events import Recorder, frames

REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/svc/Say"),
           (b":authority", b"m"), (b"te", b"trailers")]


def connected(server_settings: dict[int, int] | None = None
              ) -> tuple[H2Client, Recorder, h2.connection.H2Connection]:
    """The edge's client and an h2 server past the preface and both SETTINGS."""
    events = Recorder()
    client = H2Client(events, Settings(max_concurrent_streams=0, stream_window=1 << 18,
                                       connection_window=1 << 24),
                      FrameBudget(Limits(), 0.0))
    client.start()
    server = h2.connection.H2Connection(config=h2.config.H2Configuration(
        client_side=False, header_encoding=None))
    server.initiate_connection()
    if server_settings:
        server.update_settings(server_settings)
    received = server.receive_data(client.data_to_send())
    assert any(isinstance(e, h2.events.RemoteSettingsChanged) for e in received)
    client.receive(server.data_to_send(), 0.0)
    server.receive_data(client.data_to_send())  # our ACK of its SETTINGS
    client.receive(server.data_to_send(), 0.0)
    events.calls.clear()
    return client, events, server


def headers_frame(stream_id: int, end_stream: bool = True, block: bytes = b"\x88") -> bytes:
    """A hand-made HEADERS frame (its block by default `:status: 200`, indexed)."""
    frame = hf.HeadersFrame(stream_id)
    frame.flags.add("END_HEADERS")
    if end_stream:
        frame.flags.add("END_STREAM")
    frame.data = block
    return bytes(frame.serialize())


def to_server(client: H2Client, server: h2.connection.H2Connection) -> list[h2.events.Event]:
    return server.receive_data(client.data_to_send())


def test_the_preface_then_settings_with_push_off_and_the_connection_window() -> None:
    client = H2Client(Recorder(), Settings(max_concurrent_streams=0, stream_window=1 << 18,
                                           connection_window=1 << 24),
                      FrameBudget(Limits(), 0.0))
    client.start()
    data = client.data_to_send()
    assert data.startswith(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    sent = frames(data[24:])
    assert isinstance(sent[0], hf.SettingsFrame)
    assert sent[0].settings[hf.SettingsFrame.ENABLE_PUSH] == 0
    assert sent[0].settings[hf.SettingsFrame.INITIAL_WINDOW_SIZE] == 1 << 18
    assert isinstance(sent[1], hf.WindowUpdateFrame)
    assert sent[1].window_increment == (1 << 24) - 65535


def test_a_call_round_trips_head_body_and_trailers_with_the_h2_server() -> None:
    client, events, server = connected()
    sid = client.open_stream(REQUEST, end_stream=False)
    assert sid == 1
    assert client.send_data(sid, b"\x00\x00\x00\x00\x02hi", end_stream=True)
    got = to_server(client, server)
    assert isinstance(got[0], h2.events.RequestReceived)
    assert got[0].headers == REQUEST
    assert [e.data for e in got if isinstance(e, h2.events.DataReceived)] == \
        [b"\x00\x00\x00\x00\x02hi"]
    server.send_headers(1, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    server.send_data(1, b"\x00\x00\x00\x00\x02ok")
    server.send_headers(1, [(b"grpc-status", b"0")], end_stream=True)
    client.receive(server.data_to_send(), 0.0)
    assert events.calls == [
        ("response", 1, [(b":status", b"200"), (b"content-type", b"application/grpc")], False),
        ("data", 1, b"\x00\x00\x00\x00\x02ok", 7),
        ("trailers", 1, [(b"grpc-status", b"0")]),
        ("end", 1),
    ]
    assert not client.streams  # both sides ended: forgotten
    assert client.open_stream(REQUEST, end_stream=True) == 3


def test_informational_heads_are_skipped_and_the_final_one_is_the_answer() -> None:
    client, events, server = connected()
    client.open_stream(REQUEST, end_stream=True)
    to_server(client, server)
    server.send_headers(1, [(b":status", b"103"), (b"link", b"</a>")])
    server.send_headers(1, [(b":status", b"200")], end_stream=True)
    client.receive(server.data_to_send(), 0.0)
    assert events.calls == [("response", 1, [(b":status", b"200")], True), ("end", 1)]


def test_a_body_waits_for_the_machines_windows_and_goes_on_when_they_open() -> None:
    client, events, server = connected()
    sid = client.open_stream(REQUEST, end_stream=False)
    assert client.window(sid) == 65535  # the server's initial stream window
    client.send_data(sid, b"x" * 65535)
    assert client.window(sid) == 0
    got = to_server(client, server)
    server.acknowledge_received_data(65535, sid)
    client.receive(server.data_to_send(), 0.0)
    assert ("window", sid) in events.calls and ("window", 0) in events.calls
    assert client.window(sid) == 65535
    assert sum(e.flow_controlled_length for e in got
               if isinstance(e, h2.events.DataReceived)) == 65535


def test_received_data_is_given_back_as_it_is_acknowledged() -> None:
    client, _events, server = connected()
    sid = client.open_stream(REQUEST, end_stream=True)
    to_server(client, server)
    server.send_headers(sid, [(b":status", b"200")])
    server.send_data(sid, b"y" * 16384)
    server.send_data(sid, b"y" * 16384)
    server.send_data(sid, b"y" * 16384)
    server.send_data(sid, b"y" * 16384)
    client.receive(server.data_to_send(), 0.0)
    assert client.streams[sid].recv_window == (1 << 18) - 65536
    client.ack_data(sid, 65536)  # a quarter of the stream's window: a WINDOW_UPDATE
    updates = [f for f in frames(client.data_to_send()) if isinstance(f, hf.WindowUpdateFrame)]
    # the stream's quarter is owed; the connection's 16 MiB window waits for its own
    assert [(f.stream_id, f.window_increment) for f in updates] == [(sid, 65536)]


def test_the_machines_concurrency_bounds_the_streams_opened() -> None:
    client, _events, server = connected({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 2})
    assert client.peer_max_streams == 2
    assert client.open_stream(REQUEST, True) == 1
    assert client.open_stream(REQUEST, True) == 3
    assert not client.can_open
    assert client.open_stream(REQUEST, True) == 0
    to_server(client, server)
    server.send_headers(1, [(b":status", b"200")], end_stream=True)
    client.receive(server.data_to_send(), 0.0)
    assert client.can_open


def test_a_graceful_goaway_lets_the_streams_it_kept_finish() -> None:
    client, events, server = connected()
    for _ in range(3):
        client.open_stream(REQUEST, end_stream=True)
    to_server(client, server)
    server.close_connection(last_stream_id=3)  # streams 1 and 3 go on, 5 never ran
    client.receive(server.data_to_send(), 0.0)
    assert events.calls == [("goaway", 3, NO_ERROR)]
    assert sorted(client.streams) == [1, 3]
    assert not client.can_open
    # the h2 library closes its own state at its GOAWAY: hand-made frames answer for it
    client.receive(headers_frame(1) + headers_frame(3), 0.0)
    assert events.calls[1:] == [("response", 1, [(b":status", b"200")], True), ("end", 1),
                                ("response", 3, [(b":status", b"200")], True), ("end", 3)]
    assert not client.streams


def test_a_refused_stream_is_reported_with_its_code() -> None:
    client, events, server = connected()
    client.open_stream(REQUEST, end_stream=True)
    to_server(client, server)
    server.reset_stream(1, REFUSED_STREAM)
    client.receive(server.data_to_send(), 0.0)
    assert events.calls == [("reset", 1, REFUSED_STREAM)]
    assert not client.streams


def test_trailers_that_do_not_end_the_stream_reset_it_alone() -> None:
    client, events, server = connected()
    client.open_stream(REQUEST, end_stream=True)
    client.open_stream(REQUEST, end_stream=True)
    to_server(client, server)
    client.receive(headers_frame(1, end_stream=False) + headers_frame(1, end_stream=False),
                   0.0)  # a head, then trailers that do not end the stream
    assert events.calls[-1] == ("reset", 1, PROTOCOL_ERROR)
    sent = frames(client.data_to_send())
    assert [(f.stream_id, f.error_code) for f in sent if isinstance(f, hf.RstStreamFrame)] == \
        [(1, PROTOCOL_ERROR)]
    assert 3 in client.streams  # the connection and its other stream go on


def test_frames_for_a_stream_we_reset_are_dropped_and_its_window_given_back() -> None:
    client, events, server = connected()
    sid = client.open_stream(REQUEST, end_stream=True)
    to_server(client, server)
    server.send_headers(sid, [(b":status", b"200")])
    server.send_data(sid, b"z" * 16384)
    in_flight = server.data_to_send()
    client.reset_stream(sid, CANCEL)  # the client went away meanwhile
    client.data_to_send()
    client.receive(in_flight, 0.0)
    assert events.calls == []
    assert client.recv_owed == 16384  # the connection's share, owed back
    assert not [f for f in frames(client.data_to_send()) if isinstance(f, hf.RstStreamFrame)]


@pytest.mark.parametrize(("frame", "why"), [
    (hf.HeadersFrame(5), "HEADERS on a stream we did not open"),
    (hf.HeadersFrame(2), "HEADERS on an even stream"),
    (hf.PushPromiseFrame(1), "PUSH_PROMISE (push is off)"),
    (hf.DataFrame(7), "DATA on an idle stream"),
])
def test_what_a_machine_may_not_send_ends_the_connection(frame: hf.Frame, why: str) -> None:
    client, _events, server = connected()
    client.open_stream(REQUEST, end_stream=True)
    to_server(client, server)
    if isinstance(frame, hf.HeadersFrame | hf.PushPromiseFrame):
        frame.flags.add("END_HEADERS")
        if isinstance(frame, hf.PushPromiseFrame):
            frame.promised_stream_id = 2
        frame.data = b"\x88"
    elif isinstance(frame, hf.DataFrame):
        frame.data = b"x"
    with pytest.raises(H2ConnectionError) as raised:
        client.receive(bytes(frame.serialize()), 0.0)
    assert raised.value.reason == why


def test_a_header_block_after_the_stream_ended_is_a_stream_error() -> None:
    client, events, server = connected()
    client.open_stream(REQUEST, end_stream=False)  # our side stays open
    to_server(client, server)
    server.send_headers(1, [(b":status", b"200")], end_stream=True)
    client.receive(server.data_to_send(), 0.0)
    client.receive(headers_frame(1), 0.0)
    assert events.calls[-1] == ("reset", 1, STREAM_CLOSED)


def test_pings_are_answered() -> None:
    client, _events, server = connected()
    server.ping(b"12345678")
    client.receive(server.data_to_send(), 0.0)
    got = to_server(client, server)
    assert any(isinstance(e, h2.events.PingAckReceived) and e.ping_data == b"12345678"
               for e in got)


def test_a_server_that_says_it_may_push_breaks_the_connection() -> None:
    client, _events, _server = connected()
    settings = hf.SettingsFrame(0, settings={hf.SettingsFrame.ENABLE_PUSH: 1})
    with pytest.raises(H2ConnectionError) as raised:
        client.receive(bytes(settings.serialize()), 0.0)
    assert raised.value.code == PROTOCOL_ERROR


def test_a_malformed_priority_on_a_stream_we_never_opened_is_not_answered_with_a_reset(
) -> None:
    client, _events, _server = connected()
    bad = hf.Frame.parse_frame_header(memoryview(b"\x00\x00\x04\x02\x00\x00\x00\x00\x03"))[0]
    assert isinstance(bad, hf.PriorityFrame)
    with pytest.raises(H2ConnectionError) as raised:  # (a reset there would be its error)
        client.receive(b"\x00\x00\x04\x02\x00\x00\x00\x00\x03" + b"\x00" * 4, 0.0)
    assert raised.value.code == FRAME_SIZE_ERROR
    assert not client.data_to_send()
