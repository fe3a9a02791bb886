"""HTTP/2's pure rules: frame budgets over frame headers, and well-formed request heads."""

from __future__ import annotations

import hyperframe.frame as hf
import pytest

from edge.core.framing import BODY_CHUNKED, BODY_LENGTH, BODY_NONE
from edge.core.h2budget import FrameBudget, Limits
from edge.core.h2head import REFUSED, malformed, request_head
from edge.core.headreader import RequestHeadReader

LIMITS = Limits(resets_per_s=10, settings_per_s=5, pings_per_s=5, priority_per_s=5,
                window_updates_per_s=5, continuations_per_block=3, header_block_bytes=100,
                empty_frames_in_a_row=2)


def feed(budget: FrameBudget, frames: list[hf.Frame], now: float = 0.0) -> str | None:
    """The first reason over the frames, read by their headers as the protocol does."""
    for frame in frames:
        raw = frame.serialize()
        reason = budget.frame(raw[3], raw[4], int.from_bytes(raw[:3], "big"), now)
        if reason is not None:
            return reason
    return None


def test_resets_within_the_burst_pass_and_past_it_give_a_reason() -> None:
    budget = FrameBudget(LIMITS)
    assert feed(budget, [hf.RstStreamFrame(i) for i in range(1, 40, 2)]) is None  # 20 = burst
    assert feed(budget, [hf.RstStreamFrame(41)]) == "too many stream resets per second"


def test_the_bucket_refills_with_time() -> None:
    budget = FrameBudget(LIMITS)
    assert feed(budget, [hf.RstStreamFrame(i) for i in range(1, 40, 2)], now=0.0) is None
    assert feed(budget, [hf.RstStreamFrame(i) for i in range(41, 60, 2)], now=1.0) is None


@pytest.mark.parametrize(("frame", "reason"), [
    (hf.SettingsFrame(0, settings={0x3: 100}), "too many SETTINGS frames per second"),
    (hf.PingFrame(0, opaque_data=b"12345678"), "too many PING frames per second"),
    (hf.PriorityFrame(1), "too many PRIORITY frames per second"),
    (hf.WindowUpdateFrame(0, window_increment=1), "too many WINDOW_UPDATE frames per second"),
])
def test_control_frame_floods_are_counted(frame: hf.Frame, reason: str) -> None:
    budget = FrameBudget(LIMITS)
    assert feed(budget, [frame] * 10) is None
    assert feed(budget, [frame]) == reason


def test_acks_do_not_count_against_the_settings_and_ping_budgets() -> None:
    budget = FrameBudget(LIMITS)
    ack = hf.SettingsFrame(0)
    ack.flags.add("ACK")
    pong = hf.PingFrame(0, opaque_data=b"12345678")
    pong.flags.add("ACK")
    assert feed(budget, [ack, pong] * 50) is None


def test_continuations_per_block_and_block_bytes_are_bounded() -> None:
    budget = FrameBudget(LIMITS)
    head = hf.HeadersFrame(1, data=b"x")
    assert feed(budget, [head, *(hf.ContinuationFrame(1, data=b"x") for _ in range(3))]) is None
    assert feed(budget, [hf.ContinuationFrame(1, data=b"x")]) == \
        "too many CONTINUATION frames in one header block"
    budget = FrameBudget(LIMITS)
    assert feed(budget, [hf.HeadersFrame(1, data=b"x" * 60),
                         hf.ContinuationFrame(1, data=b"x" * 60)]) == \
        "a header block over its size limit"


def test_a_block_that_ends_resets_the_continuation_count() -> None:
    budget = FrameBudget(LIMITS)
    for stream in (1, 3, 5):
        last = hf.ContinuationFrame(stream, data=b"x")
        last.flags.add("END_HEADERS")
        frames = [hf.HeadersFrame(stream, data=b"x"), hf.ContinuationFrame(stream, data=b"x"),
                  last]
        assert feed(budget, frames) is None


def test_the_last_continuation_counts_against_the_block_size() -> None:
    budget = FrameBudget(LIMITS)  # header_block_bytes=100
    assert feed(budget, [hf.HeadersFrame(1, data=b"x" * 60),
                         hf.ContinuationFrame(1, data=b"x" * 60, flags=["END_HEADERS"])]) == \
        "a header block over its size limit"


def test_stream_errors_spend_the_reset_budget() -> None:
    budget = FrameBudget(LIMITS)  # 10 resets/s, burst 20
    assert feed(budget, [hf.RstStreamFrame(i) for i in range(1, 20, 2)]) is None  # 10
    assert all(budget.stream_error(0.0) is None for _ in range(10))  # and 10 more
    assert budget.stream_error(0.0) == "too many stream resets per second (stream errors)"


def test_empty_data_frames_in_a_row_are_bounded_and_a_payload_resets_the_run() -> None:
    budget = FrameBudget(LIMITS)
    assert feed(budget, [hf.DataFrame(1, data=b""), hf.DataFrame(1, data=b""),
                         hf.DataFrame(1, data=b"x"), hf.DataFrame(1, data=b"")]) is None
    assert feed(budget, [hf.DataFrame(1, data=b"")] * 2) == "too many empty frames in a row"


GOOD = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"a.localhost"),
        (b":path", b"/")]


def test_a_well_formed_head_passes() -> None:
    assert malformed(GOOD) is None
    assert malformed([*GOOD, (b"te", b"trailers"), (b"host", b"A.localhost")]) is None


@pytest.mark.parametrize(("headers", "why"), [
    ([*GOOD, (b"x-a", b"1\r\nInjected: yes")], "CR, LF or NUL"),
    ([*GOOD, (b"x-a", b" 1")], "white space around"),
    ([*GOOD, (b"x-a", b"1\t")], "white space around"),
    ([*GOOD, (b"X-Upper", b"1")], "lower-case token"),
    ([*GOOD, (b"connection", b"close")], "connection-specific"),
    ([*GOOD, (b"transfer-encoding", b"chunked")], "connection-specific"),
    ([*GOOD, (b"te", b"gzip")], "TE"),
    ([*GOOD, (b"host", b"other.localhost")], "another authority"),
    ([(b"x-a", b"1"), *GOOD], "after a regular header"),
    ([*GOOD, (b"x-a", b"1"), (b":path", b"/x")], "pseudo-header after"),
    ([(b":method", b"GET"), (b":method", b"GET"), *GOOD[1:]], "repeated"),
    ([(b":status", b"200"), *GOOD], "unknown pseudo-header"),
    (GOOD[1:], "no :method"),
    ([GOOD[0], GOOD[2]], "no :scheme or :path"),
    ([*GOOD, (b"bad name", b"1")], "lower-case token"),
])
def test_malformed_heads_say_why(headers: list[tuple[bytes, bytes]], why: str) -> None:
    found = malformed(headers)
    assert found is not None and why in found


def reader() -> RequestHeadReader:
    return RequestHeadReader(100, 65536)


def test_a_head_becomes_the_http11_head_a_machine_is_sent() -> None:
    decided = request_head(reader(), [*GOOD, (b"cookie", b"a=1"), (b"cookie", b"b=2"),
                                      (b"x-a", b"1")], True, 1 << 20)
    assert not isinstance(decided, str)
    method, head, websocket = decided
    assert method == b"GET" and not websocket and head.host == "a.localhost" and head.target == b"/"
    assert b"cookie: a=1; b=2\r\n" in head.forward and b"x-a: 1\r\n" in head.forward
    assert head.body == BODY_NONE


def test_an_extended_connect_becomes_a_websocket_upgrade_with_the_edges_key() -> None:
    connect = [(b":method", b"CONNECT"), (b":protocol", b"websocket"), (b":scheme", b"http"),
               (b":authority", b"a.localhost"), (b":path", b"/ws"),
               (b"sec-websocket-version", b"13")]
    assert malformed(connect) is None
    decided = request_head(reader(), connect, False, 1 << 20, websocket_key=b"k==")
    assert not isinstance(decided, str)
    method, head, websocket = decided
    assert method == b"GET" and websocket and head.target == b"/ws" and head.body == BODY_NONE
    assert b"sec-websocket-key: k==\r\n" in head.forward
    assert b"sec-websocket-version: 13\r\n" in head.forward
    assert request_head(reader(), connect, False, 1 << 20) == "upgrade_not_supported"
    other = [(n, b"connect-udp" if n == b":protocol" else v) for n, v in connect]
    assert request_head(reader(), other, False, 1 << 20, b"k==") == "upgrade_not_supported"
    assert malformed([(b":method", b"GET"), *connect[1:]]) is not None  # :protocol, no CONNECT
    assert malformed([h for h in connect if h[0] != b":path"]) is not None


def test_a_body_of_unknown_length_goes_chunked_and_a_declared_one_keeps_its_length() -> None:
    decided = request_head(reader(), GOOD, False, 1 << 20)
    assert not isinstance(decided, str) and decided[1].body == BODY_CHUNKED
    decided = request_head(reader(), [*GOOD, (b"content-length", b"5")], False, 1 << 20)
    assert not isinstance(decided, str) and decided[1].body == BODY_LENGTH


@pytest.mark.parametrize(("headers", "ended", "code"), [
    ([h for h in GOOD if h[0] != b":authority"], True, "missing_host"),
    ([(b":method", b"CONNECT"), (b":authority", b"a.localhost")], True,
     "upgrade_not_supported"),
    ([*GOOD, (b"content-length", b"5")], True, REFUSED),  # a body declared that cannot come
    ([*GOOD, (b"content-length", b"9" * 20)], False, "body_too_large"),
    ([*GOOD, *((b"x-%d" % i, b"v") for i in range(200))], True, "headers_too_large"),
])
def test_heads_that_cannot_go_to_a_machine_say_their_code(
    headers: list[tuple[bytes, bytes]], ended: bool, code: str,
) -> None:
    assert request_head(reader(), headers, ended, 1 << 20) == code
