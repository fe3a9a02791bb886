"""check_request / check_response: framing, Host and header rewrite decisions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.config import EdgeConfig
from edge.core.framing import (
    BODY_CHUNKED,
    BODY_LENGTH,
    BODY_NONE,
    BODY_UNTIL_CLOSE,
    Rejection,
    RequestHead,
    ResponseHead,
    host_name,
    status_line,
)
from edge.core.headreader import (
    HeadTooLarge,
    RequestHeadReader,
    ResponseHeadReader,
    check_request,
    check_response,
)
from tests.support.credentials import RING

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


def test_an_absolute_form_target_without_host_is_missing_host_on_http_1_1_only() -> None:
    assert rejected([], "1.1", b"http://app.localhost/x") == "missing_host"
    head = accepted([], version="1.0", url=b"http://app.localhost/x")
    assert (head.host, head.target) == ("app.localhost", b"/x")


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
    assert head.forward == b"Accept: */*\r\n"


def test_header_names_with_an_underscore_are_dropped_by_default() -> None:
    head = accepted([*H, (b"X_Api_Key", b"k"), (b"Transfer_Encoding", b"chunked"),
                     (b"X_Forwarded_For", b"6.6.6.6"), (b"Content_Length", b"5"),
                     (b"x_thaw_hold_timeout_ms", b"1"), (b"Accept", b"*/*")])
    assert head.forward == b"Accept: */*\r\n"
    assert (head.body, head.forwarded_for, head.hold_timeout_s) == (BODY_NONE, None, None)


@pytest.mark.parametrize("name", [b"X_Api_Key", b"Transfer_Encoding", b"_", b"HOST_"])
def test_a_header_name_with_an_underscore_rejects_the_head_when_so_configured(
    name: bytes,
) -> None:
    head = check_request(b"GET", "1.1", b"/", [*H, (name, b"v")], 1000, "reject")
    assert isinstance(head, Rejection) and head.code == "bad_header"
    assert check_request(b"GET", "1.1", b"/", [*H, (b"X-Api-Key", b"v")], 1000, "reject") \
        == check_request(b"GET", "1.1", b"/", [*H, (b"X-Api-Key", b"v")], 1000)


def test_response_header_names_with_an_underscore_are_passed_on() -> None:
    response = check_response(200, [(b"Content-Length", b"0"), (b"X_Trace", b"1")], False)
    assert response.forward == b"X_Trace: 1\r\n"


def test_the_underscore_setting_is_drop_or_reject_and_nothing_else() -> None:
    with pytest.raises(ValueError):
        RequestHeadReader(10, 1000, underscore_headers="allow")
    with pytest.raises(ValueError):
        EdgeConfig(placement_url="http://127.0.0.1:1", underscore_headers="allow",
                   cluster_keys=RING)
    assert EdgeConfig(placement_url="http://127.0.0.1:1",
                      cluster_keys=RING).underscore_headers == "drop"


@pytest.mark.parametrize(
    ("upgrades", "ignorable"),
    [
        ([b"h2c"], True),
        ([b" H2C "], True),
        ([], False),
        ([b"websocket"], False),
        ([b"h2c, websocket"], False),
        ([b"h2c", b"websocket"], False),
        ([b"h2c", b"h2c"], False),
        ([b"h2"], False),
    ],
)
def test_only_an_upgrade_to_h2c_alone_may_be_ignored(upgrades: list[bytes],
                                                      ignorable: bool) -> None:
    reader = RequestHeadReader(max_headers=10, max_header_bytes=1000)
    reader.on_url(b"/")
    for name, value in [*H, (b"Connection", b"Upgrade"), *((b"Upgrade", u) for u in upgrades)]:
        reader.on_header(name, value)
    assert reader.upgrades_to_h2c_only() is ignorable


def test_upgrade_and_http2_settings_are_not_forwarded_whatever_connection_names() -> None:
    for connection in (b"Upgrade, HTTP2-Settings", b"Upgrade"):
        head = accepted([*H, (b"Connection", connection), (b"Upgrade", b"h2c"),
                         (b"HTTP2-Settings", b"AAMAAABkAAQCAAAAAAIAAAAA"), (b"Accept", b"*/*")])
        assert head.forward == b"Accept: */*\r\n"


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
    assert response.forward == b"X-B: 2\r\n"
    assert check_response(200, [(b"Transfer-Encoding", b"chunked")], False).body == BODY_CHUNKED
    assert check_response(200, [], False).body == BODY_UNTIL_CLOSE
    assert check_response(204, [], False).body == BODY_NONE


def test_a_head_response_keeps_its_content_length_but_has_no_body() -> None:
    response = check_response(200, [(b"Content-Length", b"11")], head_request=True)
    assert response.body == BODY_NONE
    assert response.forward == b"Content-Length: 11\r\n"


def test_an_empty_or_blank_host_is_missing_even_on_the_fast_path() -> None:
    assert rejected([(b"Host", b"")]) == "missing_host"
    assert rejected([(b"Host", b"   ")]) == "missing_host"
    assert accepted([(b"Host", b"  app.localhost ")]).authority == b"app.localhost"


def test_connection_close_and_named_headers_on_a_request() -> None:
    head = accepted([*H, (b"Connection", b"close, X-Drop"), (b"X-Drop", b"1"), (b"X-Keep", b"2"),
                     (b"Connection", b"x-also"), (b"X-Also", b"3")])
    assert head.forward == b"X-Keep: 2\r\n"


def test_a_response_saying_close_is_marked_close_and_keep_alive_is_not() -> None:
    assert check_response(200, [(b"Content-Length", b"0"), (b"Connection", b"close")],
                          False).close
    kept = check_response(200, [(b"Content-Length", b"0"), (b"Connection", b"Keep-Alive"),
                                (b"Keep-Alive", b"timeout=5"), (b"X-A", b"1")], False)
    assert not kept.close and kept.forward == b"X-A: 1\r\n"


def test_response_content_length_with_spaces_or_repeats_is_read_and_junk_is_until_close() -> None:
    assert check_response(200, [(b"Content-Length", b" 7 ")], False).content_length == 7
    assert check_response(200, [(b"Content-Length", b"7"), (b"Content-Length", b"7")],
                          False).content_length == 7
    assert check_response(200, [(b"Content-Length", b"x")], False).body == BODY_UNTIL_CLOSE
    assert check_response(200, [(b"Content-Length", b"7"), (b"Content-Length", b"8")],
                          False).body == BODY_UNTIL_CLOSE


def test_the_reader_stops_the_parser_past_its_header_count_or_byte_limits() -> None:
    reader = RequestHeadReader(max_headers=2, max_header_bytes=1000)
    reader.on_url(b"/")
    reader.on_header(b"Host", b"a")
    reader.on_header(b"A", b"1")
    with pytest.raises(HeadTooLarge):
        reader.on_header(b"B", b"2")
    assert reader.rejection is not None and reader.rejection.code == "headers_too_large"
    big = RequestHeadReader(max_headers=100, max_header_bytes=64)
    big.on_url(b"/" + b"p" * 40)
    with pytest.raises(HeadTooLarge):
        big.on_header(b"Host", b"h" * 30)


def test_a_reset_reader_decides_the_next_head_afresh() -> None:
    reader = RequestHeadReader(max_headers=10, max_header_bytes=1000)
    reader.on_url(b"/one")
    reader.on_header(b"Host", b"a.localhost")
    reader.on_header(b"Content-Length", b"5")
    first = reader.finish("1.1", 100)
    reader.reset()
    reader.on_url(b"/two")
    reader.on_header(b"Host", b"b.localhost")
    second = reader.finish("1.1", 100)
    assert isinstance(first, RequestHead) and isinstance(second, RequestHead)
    assert (first.target, first.body) == (b"/one", BODY_LENGTH)
    assert (second.target, second.host, second.body) == (b"/two", "b.localhost", BODY_NONE)


_REQUEST_NAMES = [b"Host", b"host", b"Content-Length", b"Transfer-Encoding", b"Connection",
                  b"X-Request-Id", b"Accept", b"X-Thaw-Hold-Timeout-Ms", b"Expect",
                  b"X-Forwarded-For", b"Keep-Alive", b"X-Drop", b"Upgrade", b"X_Drop",
                  b"Transfer_Encoding"]
_VALUES = [b"a.localhost", b"", b" ", b" 5", b"5", b"chunked", b"keep-alive", b"Close",
           b"X-Drop", b"100-continue", b"1.2.3.4", b"x"]


@given(st.lists(st.tuples(st.sampled_from(_REQUEST_NAMES), st.sampled_from(_VALUES)),
                max_size=6),
       st.sampled_from([b"/", b"/p?q=1", b"http://a.localhost/x", b"*"]),
       st.sampled_from(["1.0", "1.1"]), st.sampled_from(["drop", "reject"]))
def test_the_request_fast_path_decides_as_the_general_rules_do(
    headers: list[tuple[bytes, bytes]], url: bytes, version: str, underscore_headers: str
) -> None:
    reader = RequestHeadReader(max_headers=100, max_header_bytes=65536,
                               underscore_headers=underscore_headers)
    reader.on_url(url)
    for name, value in headers:
        reader.on_header(name, value)
    assert reader.finish(version, 1000) == reader._decide(version, 1000)


_RESPONSE_NAMES = [b"Content-Length", b"content-length", b"Connection", b"Transfer-Encoding",
                   b"Keep-Alive", b"X-A", b"X-Drop", b"Server"]


@given(st.lists(st.tuples(st.sampled_from(_RESPONSE_NAMES), st.sampled_from(_VALUES)),
                max_size=6),
       st.sampled_from([101, 200, 204, 304, 404, 503]), st.booleans())
def test_the_response_fast_path_decides_as_the_general_rules_do(
    headers: list[tuple[bytes, bytes]], status: int, head_request: bool
) -> None:
    fast, general = ResponseHeadReader(), ResponseHeadReader()
    for name, value in headers:
        fast.on_header(name, value)
        general.on_header(name, value)
    assert fast.finish(status, head_request) == general._decide(status, head_request)


def test_finish_readies_the_reader_for_the_next_head() -> None:
    reader = ResponseHeadReader()
    for name, value in [(b"Server", b"x"), (b"Content-Length", b"3"),
                        (b"Connection", b"keep-alive")]:
        reader.on_header(name, value)
    assert reader.finish(200, False) == ResponseHead(BODY_LENGTH, 3, False, b"Server: x\r\n")
    reader.on_header(b"Transfer-Encoding", b"chunked")
    assert reader.finish(200, False) == ResponseHead(BODY_CHUNKED, 0, False, b"")


def test_the_status_line_carries_the_standard_reason_phrase() -> None:
    assert status_line(200) == b"HTTP/1.1 200 OK\r\n"
    assert status_line(404) == b"HTTP/1.1 404 Not Found\r\n"
    assert status_line(299) == b"HTTP/1.1 299 \r\n"


@pytest.mark.parametrize("version", ["0.9", "2.0"])
def test_only_http_1_0_and_1_1_heads_are_served(version: str) -> None:
    head = check_request(b"GET", version, b"/", H, 1000)
    assert isinstance(head, Rejection) and head.code == "version_not_supported"
