"""check_request / check_response: framing, Host and header rewrite decisions."""

from __future__ import annotations

import pytest

from edge.core.framing import (
    BODY_CHUNKED,
    BODY_LENGTH,
    BODY_NONE,
    BODY_UNTIL_CLOSE,
    Rejection,
    RequestHead,
    check_request,
    check_response,
    host_name,
)

H = [(b"Host", b"app.localhost")]


def accepted(headers: list[tuple[bytes, bytes]], version: str = "1.1",
             url: bytes = b"/") -> RequestHead:
    head = check_request(b"GET", version, url, headers, 1000)
    assert isinstance(head, RequestHead), head
    return head


def rejected(headers: list[tuple[bytes, bytes]], version: str = "1.1", url: bytes = b"/") -> str:
    head = check_request(b"POST", version, url, headers, 1000)
    assert isinstance(head, Rejection), head
    return head.code


@pytest.mark.parametrize(
    ("headers", "version", "url", "code"),
    [
        ([(b"Host", b"a"), (b"host", b"a")], "1.1", b"/", "duplicate_host"),
        ([], "1.1", b"/", "missing_host"),
        (H, "1.1", b"http://evil.test/x", "conflicting_host"),
        ([*H, (b"Content-Length", b"3"), (b"Transfer-Encoding", b"chunked")], "1.1", b"/",
         "bad_framing"),
        ([*H, (b"Content-Length", b"3"), (b"Content-Length", b"4")], "1.1", b"/", "bad_framing"),
        ([*H, (b"Transfer-Encoding", b"chunked, gzip")], "1.1", b"/", "bad_framing"),
        ([*H, (b"Transfer-Encoding", b"chunked")], "1.0", b"/", "bad_framing"),
        ([*H, (b"Content-Length", b"1001")], "1.1", b"/", "body_too_large"),
        ([*H, (b"Content-Length", b"-1")], "1.1", b"/", "bad_framing"),
    ],
)
def test_ambiguous_framing_and_host_problems_are_rejected(
    headers: list[tuple[bytes, bytes]], version: str, url: bytes, code: str
) -> None:
    assert rejected(headers, version, url) == code


def test_equal_repeated_content_lengths_are_one_length() -> None:
    head = accepted([*H, (b"Content-Length", b"3"), (b"Content-Length", b"3")])
    assert (head.body, head.content_length) == (BODY_LENGTH, 3)


def test_gzip_then_chunked_is_chunked_framing() -> None:
    assert accepted([*H, (b"Transfer-Encoding", b"gzip, chunked")]).body == BODY_CHUNKED


def test_http_1_0_without_host_is_accepted() -> None:
    assert accepted([], version="1.0").host == ""


def test_the_host_is_lowercased_and_its_port_dropped() -> None:
    assert accepted([(b"Host", b"App.LocalHost:8080")]).host == "app.localhost"
    assert host_name(b"[::1]:80") == "[::1]"


def test_an_absolute_form_target_becomes_origin_form_and_gives_the_authority() -> None:
    head = accepted(H, url=b"http://APP.localhost:80/p?q=1")
    assert head.target == b"/p?q=1" and head.authority == b"APP.localhost:80"


def test_hop_by_hop_internal_and_edge_set_headers_are_not_forwarded() -> None:
    head = accepted([
        *H,
        (b"Connection", b"keep-alive, X-Named"),
        (b"X-Named", b"1"),
        (b"Keep-Alive", b"5"),
        (b"TE", b"trailers"),
        (b"Upgrade", b"h2c"),
        (b"Proxy-Connection", b"x"),
        (b"X-Thaw-Machine", b"m1"),
        (b"X-Forwarded-Proto", b"https"),
        (b"Accept", b"*/*"),
    ])
    assert head.forward == [(b"Accept", b"*/*")]


def test_forwarded_for_and_request_id_and_hold_timeout_are_read() -> None:
    head = accepted([
        *H,
        (b"X-Forwarded-For", b"1.1.1.1"),
        (b"X-Forwarded-For", b"2.2.2.2"),
        (b"X-Request-Id", b"abc"),
        (b"X-Thaw-Hold-Timeout-Ms", b"1500"),
        (b"Expect", b"100-continue"),
    ])
    assert head.forwarded_for == b"1.1.1.1, 2.2.2.2" and head.request_id == b"abc"
    assert head.hold_timeout_s == 1.5 and head.expect_continue


def test_response_framing_follows_the_upstream_and_drops_hop_by_hop() -> None:
    response = check_response(200, [(b"Content-Length", b"5"), (b"Connection", b"X-A"),
                                    (b"X-A", b"1"), (b"X-B", b"2")], head_request=False)
    assert (response.body, response.content_length) == (BODY_LENGTH, 5)
    assert response.forward == [(b"X-B", b"2")]
    assert check_response(200, [(b"Transfer-Encoding", b"chunked")], False).body == BODY_CHUNKED
    assert check_response(200, [], False).body == BODY_UNTIL_CLOSE
    assert check_response(204, [], False).body == BODY_NONE


def test_a_head_response_keeps_its_content_length_but_has_no_body() -> None:
    response = check_response(200, [(b"Content-Length", b"11")], head_request=True)
    assert response.body == BODY_NONE
    assert response.forward == [(b"Content-Length", b"11")]
