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
             url: bytes = b"/", method: bytes = b"GET") -> RequestHead:
    head = check_request(method, version, url, headers, 1000)
    assert isinstance(head, RequestHead), head
    return head


def rejected(headers: list[tuple[bytes, bytes]], version: str = "1.1", url: bytes = b"/",
             method: bytes = b"POST") -> str:
    head = check_request(method, version, url, headers, 1000)
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
        ([*H, (b"Transfer-Encoding", b"gzip")], "1.1", b"/", "bad_framing"),
        ([*H, (b"Transfer-Encoding", b"chunked, chunked")], "1.1", b"/", "bad_framing"),
        ([*H, (b"Transfer-Encoding", b"chunked"), (b"Transfer-Encoding", b"chunked")], "1.1",
         b"/", "bad_framing"),
        ([*H, (b"Transfer-Encoding", b"gzip, chunked"), (b"Content-Length", b"3")], "1.1",
         b"/", "bad_framing"),
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


@pytest.mark.parametrize(
    "codings",
    [[b"gzip, chunked"], [b"gzip", b"chunked"], [b"deflate,Chunked"], [b"identity, chunked"]],
)
def test_a_transfer_coding_besides_a_single_chunked_is_not_implemented(
    codings: list[bytes],
) -> None:
    # Re-chunked upstream, the other coding's label would be lost while the body keeps it.
    assert rejected([*H, *((b"Transfer-Encoding", c) for c in codings)]) \
        == "transfer_coding_not_supported"


@pytest.mark.parametrize("coding", [b"chunked", b"Chunked", b"CHUNKED", b" chunked "])
def test_chunked_alone_in_any_case_is_chunked_framing(coding: bytes) -> None:
    assert accepted([*H, (b"Transfer-Encoding", coding)]).body == BODY_CHUNKED


def test_http_1_0_without_host_is_accepted() -> None:
    assert accepted([], version="1.0").host == ""


def test_an_absolute_form_target_without_host_is_missing_host_on_http_1_1_only() -> None:
    assert rejected([], "1.1", b"http://app.localhost/x") == "missing_host"
    head = accepted([], version="1.0", url=b"http://app.localhost/x")
    assert (head.host, head.target) == ("app.localhost", b"/x")


def test_the_host_is_lowercased_and_its_port_dropped() -> None:
    assert accepted([(b"Host", b"App.LocalHost:8080")]).host == "app.localhost"
    assert host_name(b"[::1]:80") == "[::1]"


@pytest.mark.parametrize(
    ("authority", "host"),
    [
        (b"app.localhost", "app.localhost"),
        (b"App.LocalHost.:65535", "app.localhost"),
        (b"app.localhost:0", "app.localhost"),
        (b"127.0.0.1:8080", "127.0.0.1"),
        (b"[::1]", "[::1]"),
        (b"[2001:DB8::7]:443", "[2001:db8::7]"),
        (b"[::ffff:192.0.2.1]:80", "[::ffff:192.0.2.1]"),
        (b"[v1.fe80::a+en1]:80", "[v1.fe80::a+en1]"),
        (b"my_app-1~x.localhost", "my_app-1~x.localhost"),
        (b"a!$&'()*+,;=b.localhost", "a!$&'()*+,;=b.localhost"),
        (b"%41pp.localhost", "%41pp.localhost"),
    ],
)
def test_a_valid_authority_names_its_host_lower_case_without_port_or_trailing_dot(
    authority: bytes, host: str
) -> None:
    assert host_name(authority) == host
    assert accepted([(b"Host", authority)]).host == host


# RFC 9110 7.2 / RFC 3986 3.2.2: a reg-name (unreserved, pct-encoded, sub-delims) or an IP
# literal in brackets, then perhaps ":" and a port of 1-5 digits; no userinfo, no whitespace.
BAD_AUTHORITIES = [
    b"app.localhost:1@evil.example", b"app.localhost:<script>", b"app.localhost:80 evil.example",
    b"user@app.localhost", b"app.localhost:", b"app.localhost:65536", b"app.localhost:123456",
    b"app.localhost:80:80", b"app.localhost:8o", b"app.local host", b"app.localhost\t:80",
    b"app.localhost/x", b"app.localhost?x", b"app.localhost#x", b"app.lo%zzcalhost",
    b"app.lo%4", b"\xc3\xa9.localhost", b"app.localhost:\xd9\xa1", b":80", b"...", b"[::1",
    b"[::1]x", b"[::1]:80x", b"[app.localhost]", b"[::1%25eth0]", b"[::g]", b"[v1.]", b"[]",
    b"app\x00.localhost", b"app.localhost:+80",
]


@pytest.mark.parametrize("authority", BAD_AUTHORITIES)
def test_a_host_that_is_not_a_host_and_port_is_bad_host(authority: bytes) -> None:
    assert host_name(authority) is None
    assert rejected([(b"Host", authority)], method=b"GET") == "bad_host"
    assert rejected([(b"Host", authority)], version="1.0", method=b"GET") == "bad_host"


@pytest.mark.parametrize("authority", [a for a in BAD_AUTHORITIES
                                       if b"/" not in a and b"?" not in a])  # they end it
def test_an_absolute_form_target_whose_authority_is_not_a_host_and_port_is_bad_host(
    authority: bytes,
) -> None:
    url = b"http://" + authority + b"/x"
    assert rejected(H, url=url) == "bad_host"
    assert rejected([], version="1.0", url=url) == "bad_host"


def test_an_absolute_form_target_with_no_authority_is_bad_host() -> None:
    assert rejected(H, url=b"http:///x") == "bad_host"
    assert rejected([], version="1.0", url=b"http://") == "bad_host"


def test_the_fast_path_leaves_a_bad_host_to_the_general_rules() -> None:
    reader = RequestHeadReader(max_headers=10, max_header_bytes=1000)
    reader.on_url(b"/")
    reader.on_header(b"Host", b"app.localhost:1@evil.example")
    assert reader.finish_usual() is None
    decided = reader.finish(b"GET", "1.1", 1000)
    assert isinstance(decided, Rejection) and decided.code == "bad_host"


@pytest.mark.parametrize(
    ("method", "url"),
    [(b"GET", b"ftp://app.localhost/abs"), (b"GET", b"x"), (b"GET", b"x://app.localhost/"),
     (b"GET", b"app.localhost:80"), (b"GET", b"*"), (b"POST", b"*"), (b"options", b"*"),
     (b"OPTIONS", b"**"), (b"GET", b"http:/x"), (b"GET", b""), (b"GET", b"?q=1")],
)
def test_a_target_neither_a_path_nor_an_http_url_nor_star_for_options_is_bad_target(
    method: bytes, url: bytes
) -> None:
    assert rejected(H, url=url, method=method) == "bad_target"


def test_options_star_is_accepted_and_forwarded_as_star() -> None:
    head = accepted(H, url=b"*", method=b"OPTIONS")
    assert (head.host, head.target) == ("app.localhost", b"*")


def test_https_and_any_case_scheme_absolute_form_targets_are_accepted() -> None:
    assert accepted(H, url=b"HTTPS://app.localhost:443?q=1").target == b"/?q=1"
    assert accepted(H, url=b"hTTp://APP.localhost").target == b"/"


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
    first = reader.finish(b"GET", "1.1", 100)
    reader.reset()
    reader.on_url(b"/two")
    reader.on_header(b"Host", b"b.localhost")
    second = reader.finish(b"GET", "1.1", 100)
    assert isinstance(first, RequestHead) and isinstance(second, RequestHead)
    assert (first.target, first.body) == (b"/one", BODY_LENGTH)
    assert (second.target, second.host, second.body) == (b"/two", "b.localhost", BODY_NONE)


_REQUEST_NAMES = [b"Host", b"host", b"Content-Length", b"Transfer-Encoding", b"Connection",
                  b"X-Request-Id", b"Accept", b"X-Thaw-Hold-Timeout-Ms", b"Expect",
                  b"X-Forwarded-For", b"Keep-Alive", b"X-Drop", b"Upgrade", b"X_Drop",
                  b"Transfer_Encoding"]
_VALUES = [b"a.localhost", b"", b" ", b" 5", b"5", b"chunked", b"keep-alive", b"Close",
           b"X-Drop", b"100-continue", b"1.2.3.4", b"x", b"gzip, chunked", b"gzip",
           b"A.localhost.:8080", b"[::1]:80", b"a.localhost:1@evil.example",
           b"a.localhost:<script>", b"a.localhost:80 evil.example", b"a.localhost:",
           b"a.localhost:65536", b"[::1"]
_TARGETS = [b"/", b"/p?q=1", b"http://a.localhost/x", b"*", b"https://A.localhost:443",
            b"http://a.localhost:1@evil.example/x", b"http://[::1]:80/", b"http:///x",
            b"ftp://a.localhost/x"]


@given(st.lists(st.tuples(st.sampled_from(_REQUEST_NAMES), st.sampled_from(_VALUES)),
                max_size=6),
       st.sampled_from(_TARGETS), st.sampled_from([b"GET", b"OPTIONS", b"POST"]),
       st.sampled_from(["1.0", "1.1"]), st.sampled_from(["drop", "reject"]))
def test_the_request_fast_path_decides_as_the_general_rules_do(
    headers: list[tuple[bytes, bytes]], url: bytes, method: bytes, version: str,
    underscore_headers: str,
) -> None:
    reader = RequestHeadReader(max_headers=100, max_header_bytes=65536,
                               underscore_headers=underscore_headers)
    reader.on_url(url)
    for name, value in headers:
        reader.on_header(name, value)
    assert reader.finish(method, version, 1000) == reader._decide(method, version, 1000)


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
