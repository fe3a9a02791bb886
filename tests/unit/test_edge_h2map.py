"""edge/core/h2map.py: an exchange's heads between HTTP/1.1 and HTTP/2 on the machine
side, and edge/core/holdqueue.py's reading of `grpc-timeout` (pure: no loop, no sockets)."""

from __future__ import annotations

import pytest

from edge.core.framing import BODY_CHUNKED, BODY_LENGTH, BODY_NONE
from edge.core.h2map import (
    request_fields,
    response_head,
    response_malformed,
    trailer_fields,
    trailer_lines,
)
from edge.core.holdqueue import grpc_timeout_s

HEAD = (b"POST /pkg.Svc/Call HTTP/1.1\r\nHost: rpc.example.com\r\n"
        b"content-type: application/grpc\r\nGrpc-Timeout: 5S\r\nX-Forwarded-For: 10.0.0.1\r\n"
        b"X-Request-Id: abc\r\nTransfer-Encoding: chunked\r\n\r\n")


def test_the_request_line_and_host_become_pseudo_fields_and_te_trailers_is_added() -> None:
    fields = request_fields(HEAD)
    assert fields[:4] == [(b":method", b"POST"), (b":scheme", b"http"),
                          (b":path", b"/pkg.Svc/Call"), (b":authority", b"rpc.example.com")]
    assert fields[4:] == [(b"content-type", b"application/grpc"), (b"grpc-timeout", b"5S"),
                          (b"x-forwarded-for", b"10.0.0.1"), (b"x-request-id", b"abc"),
                          (b"te", b"trailers")]  # names lower-case, no transfer-encoding


def test_connection_headers_never_reach_a_machine_over_http2() -> None:
    head = (b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Keep-Alive: 5\r\nTE: gzip\r\n\r\n")
    names = [name for name, _ in request_fields(head)]
    assert names == [b":method", b":scheme", b":path", b":authority", b"te"]
    assert request_fields(head)[-1] == (b"te", b"trailers")


def test_a_response_with_a_length_keeps_it_and_one_without_is_chunked() -> None:
    status, head, trailers = response_head(
        [(b":status", b"200"), (b"content-length", b"5"), (b"x-a", b"1")], False, False)
    assert (status, head.body, head.content_length, head.forward, trailers) == (
        200, BODY_LENGTH, 5, b"x-a: 1\r\n", b"")
    _, head, _ = response_head([(b":status", b"200"), (b"content-type", b"text/plain")],
                               False, False)
    assert head.body == BODY_CHUNKED and head.forward == b"content-type: text/plain\r\n"


def test_a_response_that_ends_the_stream_has_no_body_but_a_heads_length_is_kept() -> None:
    _, head, trailers = response_head([(b":status", b"200")], True, False)
    assert (head.body, head.content_length, trailers) == (BODY_LENGTH, 0, b"")
    _, head, _ = response_head([(b":status", b"200"), (b"content-length", b"42")], True, True)
    assert (head.body, head.forward) == (BODY_NONE, b"content-length: 42\r\n")  # a HEAD's


@pytest.mark.parametrize("ended", [True, False])  # (a machine may end it with empty DATA)
def test_204_304_and_head_answers_have_no_body_however_the_machine_frames_them(
        ended: bool) -> None:
    for status, head_request in ((204, False), (304, False), (200, True)):
        _, head, _ = response_head([(b":status", b"%d" % status)], ended, head_request)
        assert head.body == BODY_NONE, (status, head_request)


def test_a_grpc_trailers_only_answer_keeps_its_content_type_and_trails_the_rest() -> None:
    status, head, trailers = response_head(
        [(b":status", b"200"), (b"content-type", b"application/grpc"),
         (b"grpc-status", b"3"), (b"grpc-message", b"bad input"), (b"x-detail", b"why")],
        True, False)
    assert status == 200 and head.body == BODY_CHUNKED
    assert head.forward == b"content-type: application/grpc\r\n"
    assert trailers == b"grpc-status: 3\r\ngrpc-message: bad input\r\nx-detail: why\r\n"


@pytest.mark.parametrize("value", [b"20", b"2000", b"abc", b""])
def test_a_status_that_is_not_three_digits_is_zero(value: bytes) -> None:
    assert response_head([(b":status", value)], True, False)[0] == 0


def test_trailers_both_ways_leave_pseudo_and_connection_fields_out() -> None:
    assert trailer_lines([(b"grpc-status", b"0"), (b":status", b"200"),
                          (b"connection", b"close"), (b"x-sum", b"9")]) == (
        b"grpc-status: 0\r\nx-sum: 9\r\n")
    assert trailer_fields(b"X-Checksum: abc\r\nTE: trailers\r\n") == [(b"x-checksum", b"abc")]


@pytest.mark.parametrize(("lines", "seconds"), [
    (b"grpc-timeout: 250m\r\n", 0.25),
    (b"x: 1\r\nGrpc-Timeout: 2M\r\n", 120.0),  # M: minutes, m: milliseconds
    (b"grpc-timeout: 1H\r\n", 3600.0),
    (b"grpc-timeout: 99999999n\r\n", 0.099999999),
    (b"grpc-timeout: 5u", 5e-06),
])
def test_grpc_timeout_is_read_in_its_units(lines: bytes, seconds: float) -> None:
    assert grpc_timeout_s(lines) == pytest.approx(seconds)


@pytest.mark.parametrize("lines", [
    b"grpc-timeout: 123456789S\r\n",  # nine digits: more than the format allows
    b"grpc-timeout: 5\r\n", b"grpc-timeout: 5x\r\n", b"grpc-timeout: S\r\n",
    b"x-grpc-timeout: 5S\r\n", b"grpc-timeout: 5 S\r\n", b"",
])
def test_a_grpc_timeout_that_is_not_one_is_ignored(lines: bytes) -> None:
    assert grpc_timeout_s(lines) is None


def test_the_edges_answers_to_grpc_calls_map_to_grpc_statuses_with_the_fixed_message() -> None:
    from edge.errors import grpc_error_trailers, is_grpc

    assert grpc_error_trailers("hold_timeout") == (
        (b"grpc-status", b"4"), (b"grpc-message", b"the app did not become ready in time"))
    assert grpc_error_trailers("unknown_app")[0] == (b"grpc-status", b"12")  # 404
    assert grpc_error_trailers("queue_full")[0] == (b"grpc-status", b"8")
    assert grpc_error_trailers("bad_gateway")[0] == (b"grpc-status", b"14")  # 502
    assert grpc_error_trailers("no-such-code")[0] == (b"grpc-status", b"2")  # 500: UNKNOWN
    assert is_grpc(b"content-type: application/grpc+proto\r\n")
    assert not is_grpc(b"content-type: application/json\r\n")


def test_a_grpc_message_is_percent_encoded() -> None:
    from edge.errors import MESSAGES, grpc_error_trailers

    MESSAGES["x-test-encoding"] = "50% façade"
    try:
        assert grpc_error_trailers("x-test-encoding")[1] == (
            b"grpc-message", b"50%25 fa%C3%A7ade")
    finally:
        del MESSAGES["x-test-encoding"]
        grpc_error_trailers.cache_clear()


@pytest.mark.parametrize(("fields", "why"), [
    ([(b":status", b"200"), (b"content-type", b"text/plain")], None),
    ([(b":status", b"200"), (b"host", b"m"), (b"te", b"trailers")], None),
    ([], "no :status first"),
    ([(b"content-type", b"text/plain"), (b":status", b"200")], "no :status first"),
    ([(b":status", b"20")], "a :status of b'20'"),
    ([(b":status", b"2x0")], "a :status of b'2x0'"),
    ([(b":status", b"200"), (b":path", b"/")], "pseudo-field b':path' after :status"),
    ([(b":status", b"200"), (b":status", b"204")], "pseudo-field b':status' after :status"),
    ([(b":status", b"200"), (b"X-Upper", b"1")], "a malformed field b'X-Upper'"),
    ([(b":status", b"200"), (b"bad name", b"1")], "a malformed field b'bad name'"),
    ([(b":status", b"200"), (b"", b"1")], "a malformed field b''"),
    ([(b":status", b"200"), (b"x-split", b"a\r\nset-cookie: s=1")],
     "a malformed field b'x-split'"),
    ([(b":status", b"200"), (b"x-nul", b"a\x00b")], "a malformed field b'x-nul'"),
    ([(b":status", b"200"), (b"x-space", b" a")], "a malformed field b'x-space'"),
    ([(b":status", b"200"), (b"x-tab", b"a\t")], "a malformed field b'x-tab'"),
    ([(b":status", b"200"), (b"transfer-encoding", b"chunked")],
     "connection-specific field transfer-encoding"),
    ([(b":status", b"200"), (b"connection", b"close")], "connection-specific field connection"),
])
def test_a_machines_malformed_response_fields_are_named(
        fields: list[tuple[bytes, bytes]], why: str | None) -> None:
    assert response_malformed(fields) == why


def test_a_machines_trailers_keep_only_well_formed_fields() -> None:
    lines = trailer_lines([(b"grpc-status", b"0"), (b"x-split", b"a\r\nx-evil: 1"),
                           (b"Upper", b"1"), (b"x-ok", b"")])
    assert lines == b"grpc-status: 0\r\nx-ok: \r\n"
