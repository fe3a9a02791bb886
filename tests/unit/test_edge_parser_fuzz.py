"""Property (fuzz) tests of the edge's three parsers, with hypothesis (issue 26).

- The HTTP/1 head: httptools' request parser driving a RequestHeadReader as edge/
  adapters/http1.py does, fed arbitrary bytes and mutated requests in random splits.
  Checked: the only outcomes are accepted heads, a Rejection, HeadTooLarge or an
  httptools.HttpParserError (each of which the connection answers and closes on), an
  upgrade, or waiting for more bytes; an exception from a callback that is not the
  reader's or the connection's own stop (httptools would turn any into a 400) fails; an
  accepted head forwards no header the edge reads, sets or drops, no CR, LF or NUL in
  a line, nothing it was not sent, and has a valid Host (or none, on HTTP/1.0); how the
  bytes are split does not change the decisions.
- HTTP/2 frames: H2Server.receive after a valid preface and SETTINGS, fed arbitrary
  frame sequences (raw and hyperframe-built) in random splits, with an events handler
  that answers, resets and acknowledges as the adapter does. Checked: only
  H2ConnectionError escapes; no event after it; the streams the events see are opened
  odd and increasing and hear nothing after their reset or end; every byte the server
  sends back parses as frames with hyperframe.
- HTTP/2 frames from a machine: H2Client.receive after it opened a few streams, fed the
  same frame sequences as a machine's answers (its HEADERS on the streams it opened).
  Checked: only H2ConnectionError escapes; events name only streams it opened and none
  after that stream's end or reset; every byte it sends parses as frames.
- HPACK: Decoder.decode on arbitrary blocks and on blocks the `hpack` package encoded.
  Checked: only CompressionError escapes; a list is within the header list size or is
  flagged `too_large` (and empty); an encoded list decodes to itself.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import hpack
import httptools
import hyperframe.frame as hf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edge.core.framing import (
    BODY_NONE,
    CRLF,
    HOP_BY_HOP,
    INTERNAL_PREFIX,
    NEVER_FORWARDED,
    SET_BY_EDGE,
    Rejection,
    RequestHead,
    host_name,
    tokens,
)
from edge.core.h2budget import FrameBudget, Limits
from edge.core.h2client import H2Client
from edge.core.h2proto import H2Server
from edge.core.h2wire import CANCEL, NO_ERROR, PREFACE, Events, H2ConnectionError
from edge.core.h2wire import Settings as H2Settings
from edge.core.headreader import HeadTooLarge, RequestHeadReader
from edge.core.hpack import ENTRY_OVERHEAD, CompressionError, Decoder
from edge.errors import STATUS, error_response

# Example counts keep the file near 10 s on 2 cores (health checks off: a busy machine).
_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]

# -- HTTP/1 ------------------------------------------------------------------------------


class _Stop(Exception):
    """The connection's own stop from a callback (http1.py's `_Stop`)."""


class Http1Driver:
    """What ClientConnection does with httptools and its RequestHeadReader, up to the
    decision on each head: no exchanges, no sockets. `outcome` stays None while more
    bytes may come; else "rejected" (then `code`, answered with `answer`), "tunnel" (a
    WebSocket upgrade) or "upgrade_body" (an ignored h2c upgrade with a body, which the
    connection reads with a made-up head: not followed here)."""

    def __init__(self, max_headers: int, max_header_bytes: int, max_body_bytes: int,
                 underscore_headers: str) -> None:
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self.reader = RequestHeadReader(max_headers, max_header_bytes,
                                        underscore_headers=underscore_headers)
        self.parser = self._new_parser()
        self.accepted: list[tuple[RequestHead, bytes, str, list[tuple[bytes, bytes]]]] = []
        self.received: list[tuple[bytes, bytes]] = []  # this head's headers as parsed
        self.outcome: str | None = None
        self.code = ""
        self.answer = b""
        self.reject: tuple[str, str] | None = None
        self.in_head = False
        self.raw_head_bytes = 0
        self.body_bytes = 0
        self.websocket = False
        self.last_body = BODY_NONE

    def _new_parser(self) -> httptools.HttpRequestParser:
        return httptools.HttpRequestParser(SimpleNamespace(
            on_message_begin=self.on_message_begin, on_url=self.reader.on_url,
            on_header=self.on_header, on_headers_complete=self.on_headers_complete,
            on_body=self.on_body,
        ))

    def feed(self, data: bytes) -> None:
        while self.outcome is None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade as upgrade:
                if self.websocket:
                    self.outcome = "tunnel"
                elif self.last_body != BODY_NONE:
                    self.outcome = "upgrade_body"
                else:  # an ignored h2c upgrade: what follows is the next request
                    data = data[int(upgrade.args[0]):]
                    self.parser = self._new_parser()
                    continue
                return
            except httptools.HttpParserError as exc:
                if isinstance(exc, httptools.HttpParserCallbackError):
                    # httptools makes any exception in a callback a parse error (a 400):
                    # only the reader's and the connection's own may be one
                    assert isinstance(exc.__context__, HeadTooLarge | _Stop), exc.__context__
                found = self.reader.rejection
                code, message = self.reject or (
                    (found.code, found.message) if found else ("bad_request", str(exc)))
                self._rejected(code, message)
                return
            if self.in_head:
                self.raw_head_bytes += len(data)
                if self.raw_head_bytes > self.max_header_bytes:
                    self._rejected("headers_too_large", "request head too large")
            return

    def _rejected(self, code: str, message: str) -> None:
        assert code in STATUS, code
        self.outcome = "rejected"
        self.code = code
        self.answer = error_response(code, message, keep_alive=False)

    def on_message_begin(self) -> None:
        self.in_head = True
        self.raw_head_bytes = 0
        self.body_bytes = 0
        self.received = []
        self.reader.reset()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.received.append((name, value))
        self.reader.on_header(name, value)

    def on_headers_complete(self) -> None:
        self.in_head = False
        parser = self.parser
        method = parser.get_method()
        version = parser.get_http_version()
        upgrade = parser.should_upgrade()
        self.websocket = False
        if upgrade:  # http1.py's _accept_upgrade
            if method != b"CONNECT" and version == "1.1":
                if self.reader.upgrades_to_websocket() and method == b"GET":
                    self.websocket = True
                elif not self.reader.upgrades_to_h2c_only():
                    self.reject = ("upgrade_not_supported", "not WebSocket")
                    raise _Stop
            else:
                self.reject = ("upgrade_not_supported", "not WebSocket")
                raise _Stop
        head = self.reader.finish_usual() if parser.should_keep_alive() else None
        if head is None:
            decided = self.reader.finish(method, version, self.max_body_bytes)
            if isinstance(decided, Rejection):
                self.reject = (decided.code, decided.message)
                raise _Stop
            head = decided
        self.last_body = head.body
        self.accepted.append((head, method, version, self.received))

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.max_body_bytes:
            self.reject = ("body_too_large", "body too large")
            raise _Stop


_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HOST = re.compile(r"[a-z0-9\-._~!$&'()*+,;=%]+|\[[0-9a-fv:.!$&'()*+,;=\-_~]+\]")
_NOT_FORWARDED = SET_BY_EDGE | HOP_BY_HOP | NEVER_FORWARDED | {b"host"}


def check_accepted(head: RequestHead, method: bytes, version: str,
                   received: list[tuple[bytes, bytes]], max_body_bytes: int) -> None:
    """What any head the edge accepts must be."""
    assert version in ("1.0", "1.1")
    forward = head.forward
    assert forward == b"" or forward.endswith(CRLF)
    sent = {name + b": " + value for name, value in received}
    named = {t for name, value in received if name.lower() == b"connection"
             for t in tokens(value)}
    for line in forward[:-2].split(CRLF) if forward else []:
        assert b"\r" not in line and b"\n" not in line and b"\0" not in line, line
        assert line in sent, line  # as received, nothing made up
        name = line.split(b": ", 1)[0]
        lname = name.lower()
        assert _TOKEN.fullmatch(name), line
        assert lname not in _NOT_FORWARDED, line
        assert b"_" not in name and not lname.startswith(INTERNAL_PREFIX), line
        assert lname not in named, line  # a header Connection named is hop-by-hop
    if head.host:
        assert _HOST.fullmatch(head.host), head.host
        assert host_name(head.authority) == head.host
    else:
        assert version == "1.0" and head.authority == b""
    assert head.target[:1] == b"/" or (head.target == b"*" and method == b"OPTIONS")
    assert 0 <= head.content_length <= max_body_bytes


def run_http1(data: bytes, cuts: list[int], max_headers: int = 100,
              max_header_bytes: int = 65536, max_body_bytes: int = 1 << 20,
              underscore_headers: str = "drop") -> Http1Driver:
    driver = Http1Driver(max_headers, max_header_bytes, max_body_bytes, underscore_headers)
    at = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut > at:
            driver.feed(data[at:cut])
            at = cut
    for head, method, version, received in driver.accepted:
        check_accepted(head, method, version, received, max_body_bytes)
    if driver.outcome == "rejected":
        assert driver.answer.startswith(b"HTTP/1.1 4") or driver.answer.startswith(b"HTTP/1.1 5")
        assert b"Connection: close" in driver.answer
    return driver


# headers the edge reads, with values it may accept or refuse (the first: the usual one)
_READ = {
    b"Host": [b"a.localhost", b"A.LOCALHOST.:8080", b"[::1]:80", b"b.localhost", b"", b" ",
              b"a.localhost:1@evil", b"a.localhost:65536", b"[::1", b"a b"],
    b"Content-Length": [b"3", b"0", b" 3 ", b"5", b"abc", b"-1", b"99999999999999999999"],
    b"Transfer-Encoding": [b"chunked", b"gzip, chunked", b"chunked, chunked", b"gzip"],
    b"Connection": [b"keep-alive", b"close", b"X-Named", b"upgrade, X-Named", b"Upgrade",
                    b"X-Named, close, Cookie"],
    b"Upgrade": [b"websocket", b"h2c", b"h2c, websocket"],
    b"Expect": [b"100-continue", b"x"],
    b"X-Request-Id": [b"r1", b"", b"x" * 300],
    b"X-Forwarded-For": [b"1.2.3.4", b"6.6.6.6, 7.7.7.7"],
    b"X-Thaw-Hold-Timeout-Ms": [b"500", b"x"],
}
# headers the edge sets or drops, and others: any value
_OTHER_NAMES = [
    b"X-Forwarded-Proto", b"X-Forwarded-Host", b"X-Real-IP", b"Forwarded", b"Keep-Alive",
    b"Proxy-Connection", b"TE", b"Trailer", b"HTTP2-Settings", b"Proxy-Authorization",
    b"X-Thaw-App", b"x-thaw-", b"X_Forwarded_For", b"Transfer_Encoding", b"Content_Length",
    b"_", b"Host_", b"X-Named", b"Accept", b"Cookie", b"Via",
]
_VALUES = [
    b"a.localhost", b"", b" ", b"5", b"chunked", b"close", b"keep-alive", b"1.2.3.4",
    b"\t x \t", b"a b", b"x" * 300, b'"q", (c)', b"~!@#$%^&*()",
]
# what llhttp may refuse: CR, LF, NUL, obs-fold, obs-text, a line injected
_WEIRD_VALUES = [
    b"evil\r\nX-Forwarded-For: 6.6.6.6", b"a\nb", b"a\rb", b"a\0b", b"a\r\n b", b"\xff\xfe",
    b"a.localhost\r\nHost: b.localhost", b"a\r\n\r\nGET / HTTP/1.1", b"\x7f",
]
_token_names = st.lists(st.sampled_from(list(b"!#$%&'*+-.^_`|~0123456789abcxyzABCXYZ")),
                        min_size=1, max_size=12).map(bytes)
_values = st.sampled_from(_VALUES) | st.text(st.characters(
    min_codepoint=0x20, max_codepoint=0x7E), max_size=12).map(str.encode)
_headers = (st.tuples(_token_names | st.sampled_from(_OTHER_NAMES), _values)
            | st.sampled_from([(name, values[0]) for name, values in _READ.items()
                               if name != b"Host"]))
_weird_headers = st.tuples(
    st.sampled_from([*_READ, *_OTHER_NAMES]) | _token_names | st.binary(max_size=8),
    st.sampled_from(_WEIRD_VALUES) | st.binary(max_size=24)
    | st.text(max_size=12).map(lambda s: s.encode("utf-8")))
_METHODS = ([b"GET", b"POST", b"OPTIONS", b"HEAD", b"PUT", b"DELETE"],
            [b"CONNECT", b"PRI", b"get", b"G\0T", b"GET\t"])  # (usual, odd)
_TARGETS = ([b"/", b"/p?q=1", b"/a/b%20c?d=e#f", b"http://a.localhost/x",
             b"HTTPS://A.localhost:443", b"http://[::1]:80/"],
            [b"*", b"a.localhost:443", b"ftp://a/", b"//x", b"/\x7f", b"/a b", b"", b"http:///x",
             b"http://b.localhost/", b"http://a.localhost:1@evil/"])
_VERSIONS = ([b"1.1", b"1.1", b"1.0"], [b"2.0", b"0.9", b"1.2", b"1.1 ", b"1"])
_MUTATIONS = [b"\r", b"\n", b"\r\n", b"\0", b" ", b"_", b":", b"\r\n ", b"\r\n\r\n", b"\xff"]


def _one_in(draw: st.DrawFn, n: int) -> bool:
    """True about once in `n` draws (hypothesis favours small integers: the top is rare)."""
    return draw(st.integers(1, n)) == n


@st.composite
def requests(draw: st.DrawFn) -> tuple[bytes, int, int, str]:
    """A request built from parts that are mostly valid, then perhaps mutated; and the
    reader's limits (some small, so that counts and sizes come near them)."""
    method, target, version = (draw(st.sampled_from(odd if _one_in(draw, 12) else usual))
                               for usual, odd in (_METHODS, _TARGETS, _VERSIONS))
    headers = draw(st.lists(_headers, max_size=8))
    if not _one_in(draw, 10):
        host = draw(st.sampled_from(_READ[b"Host"])) if _one_in(draw, 6) else b"a.localhost"
        headers.insert(draw(st.integers(0, len(headers))), (b"Host", host))
    if _one_in(draw, 3):  # more of the headers the edge reads, perhaps repeated
        for name in draw(st.lists(st.sampled_from([b"Host", b"Content-Length",
                                                   b"Transfer-Encoding", b"Connection",
                                                   b"Upgrade", b"Expect"]),
                                  min_size=1, max_size=2)):
            headers.append((name, draw(st.sampled_from(_READ[name]))))
    if _one_in(draw, 6):
        headers.insert(draw(st.integers(0, len(headers))), draw(_weird_headers))
    headers = [(name.lower() if _one_in(draw, 5) else name, value) for name, value in headers]
    max_headers, max_header_bytes = draw(st.sampled_from([(100, 65536), (12, 1024)]))
    if _one_in(draw, 5):  # near the count limit
        filler = max_headers + draw(st.integers(-2, 1))
        headers += [(b"X-Fill-%d" % i, b"f") for i in range(max(0, filler - len(headers)))]
    elif _one_in(draw, 4):  # near the byte limit
        size = len(b"".join(name + value for name, value in headers)) + 4 * len(headers)
        big = max_header_bytes - size - len(target) + draw(st.integers(-40, 40))
        headers.append((b"X-Big", b"b" * max(0, big)))
    data = b"%s %s HTTP/%s\r\n%s\r\n" % (
        method, target, version,
        b"".join(name + b": " + value + b"\r\n" for name, value in headers))
    data += draw(st.sampled_from([b"", b"abc", b"3\r\nabc\r\n0\r\n\r\n",
                                  b"GET / HTTP/1.1\r\nHost: b.localhost\r\n\r\n"]))
    for _ in range(draw(st.integers(1, 3)) if _one_in(draw, 3) else 0):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["cut", "insert", "overwrite"]))
        piece = draw(st.sampled_from(_MUTATIONS) | st.binary(min_size=1, max_size=4))
        if kind == "cut":
            data = data[:at] + data[at + len(piece):]
        elif kind == "insert":
            data = data[:at] + piece + data[at:]
        else:
            data = data[:at] + piece + data[at + len(piece):]
    return data, max_headers, max_header_bytes, draw(st.sampled_from(["drop", "reject"]))


_cuts = st.lists(st.integers(0, 1 << 16), max_size=6)


@settings(max_examples=500, deadline=None, suppress_health_check=_SLOW)
@given(st.binary(max_size=300) | st.tuples(st.sampled_from(
    [b"GET / HTTP/1.1\r\n", b"POST http://a.localhost/ HTTP/1.0\r\n", b"PRI * HTTP/2.0\r\n"]),
    st.binary(max_size=200)).map(b"".join), _cuts)
def test_arbitrary_bytes_end_in_heads_a_rejection_or_a_wait_and_nothing_else_escapes(
    data: bytes, cuts: list[int]
) -> None:
    run_http1(data, cuts)


@settings(max_examples=500, deadline=None, suppress_health_check=_SLOW)
@given(requests(), _cuts)
@example((b"GET / HTTP/1.1\r\nHost: a.localhost\r\nX_Forwarded_For: 6.6.6.6\r\n"
          b"Connection: X-Named\r\nX-Named: 1\r\nX-Thaw-App: b\r\n\r\n", 100, 65536, "drop"),
         [])
@example((b"GET / HTTP/1.1\r\nHost: a.localhost\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
          b"GET / HTTP/1.1\r\nHost: b.localhost\r\nX-Forwarded-For: 1\r\n\r\n",
          100, 65536, "drop"), [5, 70])
def test_a_mutated_request_in_any_split_is_accepted_cleanly_or_answered_and_closed(
    request: tuple[bytes, int, int, str], cuts: list[int]
) -> None:
    data, max_headers, max_header_bytes, underscore_headers = request
    driver = run_http1(data, cuts, max_headers, max_header_bytes, 1000, underscore_headers)
    whole = run_http1(data, [], max_headers, max_header_bytes, 1000, underscore_headers)
    # the split does not change the decision (the raw byte count may only stop it sooner)
    if driver.code != "headers_too_large" and whole.code != "headers_too_large":
        assert [a[0] for a in driver.accepted] == [a[0] for a in whole.accepted]
        assert (driver.outcome, driver.code) == (whole.outcome, whole.code)


def test_of_a_request_with_a_header_of_each_kind_only_the_plain_ones_are_forwarded() -> None:
    data = (b"POST /x HTTP/1.1\r\nHost: A.localhost:8080\r\nContent-Length: 3\r\n"
            + b"".join(name + b": v\r\n" for name in [*_READ, *_OTHER_NAMES] if name.lower()
                       not in (b"host", b"content-length", b"transfer-encoding", b"upgrade",
                               b"connection"))
            + b"Accept: */*\r\n\r\nabc")
    driver = run_http1(data, [7, 40])
    assert driver.outcome is None and len(driver.accepted) == 1
    head = driver.accepted[0][0]
    assert head.forward == (b"X-Named: v\r\nAccept: v\r\nCookie: v\r\nVia: v\r\n"
                            b"Accept: */*\r\n")
    assert (head.host, head.content_length) == ("a.localhost", 3)


# -- HTTP/2 ------------------------------------------------------------------------------


class FuzzEvents(Events):
    """Checks what H2Server reports as it reports it, and reacts as the adapter may, to
    each request in turn (`reactions`): an answer (with a head past the frame size, for
    CONTINUATION), a head alone, a reset, a GOAWAY (then no new stream is reported), or
    nothing; DATA is acknowledged."""

    def __init__(self, reactions: list[str]) -> None:
        self.h2: H2Server | None = None
        self.reactions = reactions
        self.closed = False
        self.last_request = 0
        self.open: set[int] = set()  # streams reported and not reset
        self.ended: set[int] = set()  # streams the client ended
        self.requests = 0
        self.going_away = False

    def _stream(self, stream_id: int) -> None:
        assert not self.closed
        assert stream_id in self.open, stream_id

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool,
                   too_large: bool) -> None:
        assert not self.closed
        assert stream_id & 1 and stream_id > self.last_request, (stream_id, self.last_request)
        assert not self.going_away
        assert not too_large or headers == []
        self.last_request = stream_id
        self.open.add(stream_id)
        if ended:
            self.ended.add(stream_id)
        h2 = self.h2
        assert h2 is not None
        reaction = self.reactions[self.requests % len(self.reactions)] if self.reactions else ""
        self.requests += 1
        if reaction in ("answer", "big"):
            value = b"y" * (40000 if reaction == "big" else 100)
            assert h2.send_headers(stream_id, [(b":status", b"200"), (b"x", value)])
            size = min(h2.window(stream_id), 40000)
            assert h2.send_data(stream_id, b"d" * size, end_stream=True)
        elif reaction == "headers":
            h2.send_headers(stream_id, [(b":status", b"204")], end_stream=False)
        elif reaction == "reset":
            h2.reset_stream(stream_id, CANCEL)
            self.open.discard(stream_id)
        elif reaction == "goaway":
            h2.goaway(NO_ERROR, last_stream_id=stream_id)
            self.going_away = True

    def on_data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        self._stream(stream_id)
        assert stream_id not in self.ended
        assert len(data) <= flow_length
        assert self.h2 is not None
        self.h2.ack_data(stream_id, flow_length)

    def on_trailers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._stream(stream_id)
        assert stream_id not in self.ended

    def on_end(self, stream_id: int) -> None:
        self._stream(stream_id)
        assert stream_id not in self.ended
        self.ended.add(stream_id)

    def on_reset(self, stream_id: int, code: int) -> None:
        self._stream(stream_id)
        self.open.discard(stream_id)

    def on_window(self, stream_id: int) -> None:
        assert not self.closed
        if stream_id:
            self._stream(stream_id)

    def on_goaway(self, last_stream_id: int, code: int) -> None:
        assert not self.closed


def parse_frames(data: bytes) -> list[hf.Frame]:
    """Every byte as hyperframe frames (it raises on anything else)."""
    frames = []
    view = memoryview(data)
    at = 0
    while at < len(data):
        assert len(data) - at >= 9, data[at:]
        frame, length = hf.Frame.parse_frame_header(view[at:at + 9])
        assert len(data) - at - 9 >= length
        frame.parse_body(view[at + 9:at + 9 + length])
        frames.append(frame)
        at += 9 + length
    return frames


_stream_ids = st.sampled_from([0, 1, 2, 3, 4, 5, 101, 0x7FFFFFFF, 0x80000001]) | \
    st.integers(0, (1 << 32) - 1)
_header_lists = st.lists(st.tuples(
    st.sampled_from([b":method", b":path", b":scheme", b":authority", b":status", b"host",
                     b"content-length", b"te", b"x-a", b"cookie", b"Upper", b""])
    | st.binary(max_size=6),
    st.sampled_from([b"GET", b"/", b"http", b"a.localhost", b"trailers", b"5", b""])
    | st.binary(max_size=30)), max_size=8)
_SETTING_KEYS = [1, 2, 3, 4, 5, 6, 8, 0, 9, 0xFFFF]
_setting_values = st.sampled_from([0, 1, 2, 16383, 16384, 65535, 65536, (1 << 24) - 1,
                                   1 << 24, (1 << 31) - 1, 1 << 31, (1 << 32) - 1])
_KINDS = (["headers"] * 6 + ["data"] * 5 + ["window"] * 3 + ["settings", "ping"] * 2
          + ["rst"] * 2 + ["priority", "goaway", "raw", "continuation", "push"])


def _padded(draw: st.DrawFn, frame: hf.Frame) -> hf.Frame:
    if _one_in(draw, 4):
        frame.flags.add("PADDED")
        frame.pad_length = draw(st.integers(0, 20))
    return frame


def _frame_spec(draw: st.DrawFn, kind: str, sid: int) -> tuple[str, object]:
    """("raw", a frame's bytes) or ("headers", (HEADERS frame, header list or None, how
    many CONTINUATIONs carry the list)): the list is HPACK-encoded at run time, by the
    example's own encoder, so that the client's table and the server's stay in step."""
    if kind == "raw":
        payload = draw(st.binary(max_size=48))
        length = draw(st.sampled_from([len(payload)] * 6 + [0, 8, 16385, (1 << 24) - 1]))
        head = bytes([length >> 16 & 0xFF, length >> 8 & 0xFF, length & 0xFF,
                      draw(st.integers(0, 12) | st.integers(0, 255)), draw(st.integers(0, 255))])
        return "raw", head + draw(_stream_ids).to_bytes(4, "big") + payload
    sid = sid & 0x7FFFFFFF or 1
    if kind == "headers":
        frame = hf.HeadersFrame(sid)
        if _one_in(draw, 2):
            frame.flags.add("END_STREAM")
        if not _one_in(draw, 8):
            frame.flags.add("END_HEADERS")
        if _one_in(draw, 4):
            frame.flags.add("PRIORITY")
            frame.depends_on = draw(_stream_ids) & 0x7FFFFFFF
            frame.stream_weight = draw(st.integers(0, 255))
            frame.exclusive = draw(st.booleans())
        _padded(draw, frame)
        if _one_in(draw, 6):  # random bytes for a block
            frame.data = draw(st.binary(max_size=40))
            return "headers", (frame, None, 0)
        block = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", b"a.localhost"),
                 (b":path", b"/"), *draw(_header_lists)]
        return "headers", (frame, block, draw(st.integers(1, 2)) if _one_in(draw, 4) else 0)
    if kind == "data":
        frame = _padded(draw, hf.DataFrame(sid, draw(st.binary(max_size=64)
                                                     | st.just(b"x" * 16000))))
        if _one_in(draw, 2):
            frame.flags.add("END_STREAM")
    elif kind == "continuation":
        frame = hf.ContinuationFrame(sid, draw(st.binary(max_size=40)))
        if draw(st.booleans()):
            frame.flags.add("END_HEADERS")
    elif kind == "settings":
        frame = hf.SettingsFrame(0)
        if _one_in(draw, 3):
            frame.flags.add("ACK")
        else:
            frame.settings = draw(st.dictionaries(st.sampled_from(_SETTING_KEYS),
                                                  _setting_values, max_size=3))
    elif kind == "window":
        frame = hf.WindowUpdateFrame(draw(st.sampled_from([0, sid])), draw(
            st.sampled_from([1, 100, 65535, 0, (1 << 31) - 1]) | st.integers(0, (1 << 31) - 1)))
    elif kind == "rst":
        frame = hf.RstStreamFrame(sid, draw(st.integers(0, 15)))
    elif kind == "ping":
        frame = hf.PingFrame(0, draw(st.binary(min_size=8, max_size=8)))
        if draw(st.booleans()):
            frame.flags.add("ACK")
    elif kind == "priority":
        frame = hf.PriorityFrame(sid, draw(_stream_ids) & 0x7FFFFFFF,
                                 draw(st.integers(0, 255)), draw(st.booleans()))
    elif kind == "goaway":
        frame = hf.GoAwayFrame(0, draw(_stream_ids) & 0x7FFFFFFF, draw(st.integers(0, 15)),
                               draw(st.binary(max_size=8)))
    else:
        frame = hf.PushPromiseFrame(sid, draw(st.integers(2, 8)), draw(st.binary(max_size=8)))
        frame.flags.add("END_HEADERS")
    return "raw", bytes(frame.serialize())


@st.composite
def conversations(draw: st.DrawFn) -> list[tuple[str, object]]:
    """Frames of a client: HEADERS mostly open the next streams, other frames are mostly
    on streams opened before; any frame, on any stream, now and then."""
    specs = []
    opened: list[int] = []
    next_id = 1
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(_KINDS))
        if not opened and not _one_in(draw, 6):
            kind = "headers"
        if kind == "headers" and not _one_in(draw, 10):
            sid = next_id
            next_id += 2 * draw(st.integers(1, 2))
            opened.append(sid)
        elif opened and not _one_in(draw, 10):
            sid = draw(st.sampled_from(opened))
        else:
            sid = draw(_stream_ids)
        specs.append(_frame_spec(draw, kind, sid))
    return specs


_h2_settings = st.builds(
    H2Settings, max_concurrent_streams=st.sampled_from([100, 2]),
    stream_window=st.sampled_from([65535, 100, 1 << 20]),
    connection_window=st.sampled_from([65535, 1 << 20]),
    max_header_list=st.sampled_from([65536, 200]), header_table=st.sampled_from([4096, 64, 0]),
    connect_protocol=st.booleans())


def run_h2(specs: list[tuple[str, object]], cuts: list[int], reactions: list[str],
           server_settings: H2Settings, client_settings: dict[int, int], steps: list[float],
           ack_ours: bool) -> FuzzEvents:
    events = FuzzEvents(reactions)
    h2s = H2Server(events, server_settings, FrameBudget(Limits(), 0.0))
    events.h2 = h2s
    h2s.start()
    encoder = hpack.Encoder()
    data = PREFACE + bytes(hf.SettingsFrame(0, settings=client_settings).serialize())
    if ack_ours:
        data += bytes(hf.SettingsFrame(0, flags=["ACK"]).serialize())
        if server_settings.header_table < 4096:  # the size update a client then owes
            encoder.header_table_size = server_settings.header_table
    for kind, spec in specs:
        if kind == "raw":
            data += spec  # type: ignore[operator]
            continue
        frame, block, continuations = spec  # type: ignore[misc]
        if block is None:
            data += bytes(frame.serialize())
            continue
        encoded = encoder.encode(block, huffman=len(block) % 2 == 0)
        if not continuations:
            frame.data = encoded
            data += bytes(frame.serialize())
            continue
        frame.flags.discard("END_HEADERS")
        step = len(encoded) // (continuations + 1) + 1
        frame.data = encoded[:step]
        data += bytes(frame.serialize())
        for at in range(step, step * (continuations + 1), step):
            last = at + step >= step * (continuations + 1)
            data += bytes(hf.ContinuationFrame(frame.stream_id, encoded[at:at + step],
                                               flags=["END_HEADERS"] if last else []).serialize())
    sent = [h2s.data_to_send()]
    now = 0.0
    at = 0
    for i, cut in enumerate([*sorted(c % (len(data) + 1) for c in cuts), len(data)]):
        if cut <= at:
            continue
        now += steps[i % len(steps)] if steps else 0.0
        try:
            h2s.receive(data[at:cut], now)
        except H2ConnectionError as exc:  # the adapter: GOAWAY, then close
            events.closed = True
            h2s.goaway(exc.code, exc.reason.encode()[:100])
            sent.append(h2s.data_to_send())
            frames = parse_frames(b"".join(sent))
            assert isinstance(frames[-1], hf.GoAwayFrame)
            assert frames[-1].error_code == exc.code
            return events
        at = cut
        sent.append(h2s.data_to_send())
    parse_frames(b"".join(sent))
    return events


@settings(max_examples=500, deadline=None, suppress_health_check=_SLOW)
@given(conversations(), _cuts,
       st.lists(st.sampled_from(["answer", "headers", "reset", "", "big", "goaway"]),
                max_size=3),
       _h2_settings,
       st.dictionaries(st.sampled_from([1, 2, 3, 4, 5, 6]), st.sampled_from(
           [0, 1, 100, 16384, 65535, 1 << 20]), max_size=3),
       st.lists(st.sampled_from([0.0, 0.001, 1.0]), max_size=3), st.booleans())
def test_any_frames_after_a_valid_opening_raise_only_a_connection_error_and_send_frames(
    specs: list[tuple[str, object]], cuts: list[int], reactions: list[str],
    server_settings: H2Settings, client_settings: dict[int, int], steps: list[float],
    ack_ours: bool,
) -> None:
    client_settings = {k: (min(v, 1) if k == 2 else max(v, 16384) if k == 5 else v)
                       for k, v in client_settings.items()}
    run_h2(specs, cuts, reactions, server_settings, client_settings, steps, ack_ours)


class ClientFuzzEvents(Events):
    """Checks what H2Client reports of a machine's frames, and reacts as the upstream
    adapter may: DATA acknowledged, now and then a stream cancelled on its answer. A
    stream the machine ended may still be reset while our side of it is open."""

    def __init__(self, opened: set[int], sending: set[int], cancel_on_answer: bool) -> None:
        self.h2: H2Client | None = None
        self.open = set(opened)  # streams we opened, not yet closed both ways nor reset
        self.sending = set(sending)  # of those, the ones we have not ended
        self.remote_ended: set[int] = set()
        self.answered: set[int] = set()
        self.cancel_on_answer = cancel_on_answer
        self.closed = False

    def _stream(self, stream_id: int, frames: bool = True) -> None:
        assert not self.closed
        assert stream_id in self.open, stream_id
        assert not frames or stream_id not in self.remote_ended, stream_id

    def _gone(self, stream_id: int) -> None:
        self.open.discard(stream_id)
        self.sending.discard(stream_id)

    def on_response(self, stream_id: int, headers: list[tuple[bytes, bytes]],
                    ended: bool) -> None:
        self._stream(stream_id)
        assert stream_id not in self.answered  # one final head a stream
        self.answered.add(stream_id)
        if self.cancel_on_answer and not ended and self.h2 is not None:
            self.h2.reset_stream(stream_id, CANCEL)
            self._gone(stream_id)

    def on_data(self, stream_id: int, data: bytes, flow_length: int) -> None:
        self._stream(stream_id)
        assert len(data) <= flow_length
        assert self.h2 is not None
        self.h2.ack_data(stream_id, flow_length)

    def on_trailers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._stream(stream_id)
        assert stream_id in self.answered

    def on_end(self, stream_id: int) -> None:
        self._stream(stream_id)
        self.remote_ended.add(stream_id)
        if stream_id not in self.sending:
            self._gone(stream_id)  # closed both ways: nothing more on it

    def on_reset(self, stream_id: int, code: int) -> None:
        self._stream(stream_id, frames=False)
        self._gone(stream_id)

    def on_window(self, stream_id: int) -> None:
        assert not self.closed
        if stream_id:
            self._stream(stream_id, frames=False)

    def on_goaway(self, last_stream_id: int, code: int) -> None:
        assert not self.closed
        for stream_id in [sid for sid in self.open if sid > last_stream_id]:
            self._gone(stream_id)


@settings(max_examples=400, deadline=None, suppress_health_check=_SLOW)
@given(conversations(), _cuts, st.integers(0, 4), st.booleans(),
       st.dictionaries(st.sampled_from([1, 3, 4, 5, 6]), st.sampled_from(
           [0, 1, 100, 16384, 65535, 1 << 20]), max_size=3))
def test_any_frames_from_a_machine_raise_only_a_connection_error_in_the_client(
    specs: list[tuple[str, object]], cuts: list[int], streams: int, cancel: bool,
    machine_settings: dict[int, int],
) -> None:
    machine_settings = {k: max(v, 16384) if k == 5 else v for k, v in machine_settings.items()}
    client = H2Client(Events(), H2Settings(max_concurrent_streams=0, stream_window=1 << 18,
                                           connection_window=1 << 24),
                      FrameBudget(Limits(), 0.0))
    client.start()
    opened, sending = set(), set()
    for i in range(streams):
        sid = client.open_stream([(b":method", b"POST"), (b":path", b"/")], i % 2 == 0)
        if sid:
            opened.add(sid)
            if i % 2:
                sending.add(sid)
                client.send_data(sid, b"q" * min(100, client.window(sid)))
    events = ClientFuzzEvents(opened, sending, cancel)
    events.h2 = client
    client.events = events
    encoder = hpack.Encoder()
    data = bytes(hf.SettingsFrame(0, settings=machine_settings).serialize())
    for kind, spec in specs:
        if kind == "raw":
            data += spec  # type: ignore[operator]
            continue
        frame, block, _ = spec  # type: ignore[misc]
        if block is not None:  # a machine's head in place of the conversation's request
            frame.data = encoder.encode([(b":status", b"200"), *block[4:]])
        data += bytes(frame.serialize())
    sent = [client.data_to_send()]
    at = 0
    for cut in [*sorted(c % (len(data) + 1) for c in cuts), len(data)]:
        if cut <= at:
            continue
        try:
            client.receive(data[at:cut], 0.0)
        except H2ConnectionError as exc:  # the adapter: GOAWAY, then close
            events.closed = True
            client.goaway(exc.code)
            sent.append(client.data_to_send())
            break
        at = cut
        sent.append(client.data_to_send())
    parse_frames(b"".join(sent)[len(PREFACE):])


@settings(max_examples=500, deadline=None, suppress_health_check=_SLOW)
@given(st.binary(max_size=400), _cuts)
def test_arbitrary_bytes_after_the_preface_raise_only_a_connection_error(
    data: bytes, cuts: list[int]
) -> None:
    run_h2([("raw", bytes(hf.SettingsFrame(0).serialize()) + data)], cuts, ["answer"],
           H2Settings(), {}, [], False)


def test_a_well_formed_conversation_reaches_its_events_and_answers() -> None:
    frame = hf.HeadersFrame(1, flags=["END_HEADERS"])
    post = hf.HeadersFrame(3, flags=["END_HEADERS"])
    specs: list[tuple[str, object]] = [
        ("headers", (frame, [(b":method", b"GET"), (b":path", b"/")], 0)),
        ("headers", (post, [(b":method", b"POST"), (b":path", b"/up")], 1)),
        ("raw", bytes(hf.DataFrame(3, b"abc", flags=["END_STREAM"]).serialize())),
    ]
    events = run_h2(specs, [30, 31, 100], ["answer"], H2Settings(), {}, [], True)
    assert (events.last_request, events.open, events.ended) == (3, {1, 3}, {3})


# -- HPACK -------------------------------------------------------------------------------


def _list_bytes(fields: list[tuple[bytes, bytes]]) -> int:
    return sum(len(name) + len(value) + ENTRY_OVERHEAD for name, value in fields)


_hpack_names = st.sampled_from([b":method", b":path", b":authority", b"cookie", b"x-a",
                                b"content-length", b"user-agent"]) | \
    st.binary(min_size=1, max_size=10).map(bytes.lower)
_hpack_headers = st.lists(st.tuples(_hpack_names, st.binary(max_size=40) | st.just(b"v" * 300),
                                    st.booleans()), max_size=10)


@st.composite
def mutated_blocks(draw: st.DrawFn) -> bytes:
    """A block the `hpack` package encoded (by a fresh encoder), a few bytes changed, and
    perhaps cut short."""
    headers = draw(_hpack_headers)
    block = bytearray(hpack.Encoder().encode([(n, v) for n, v, _ in headers],
                                             huffman=draw(st.booleans())))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(block)))
        block[at:at + draw(st.integers(0, 2))] = draw(st.binary(max_size=2))
    if draw(st.booleans()):
        del block[draw(st.integers(0, len(block))):]
    return bytes(block)


_ODD_BLOCKS = [b"\x3f\xe1\x1f", b"\x20", b"\x3f\xff\xff\xff\xff\x7f", b"\xff\xff\xff\xff\xff\xff",
               b"\x40\x81\xff\x81\xff", b"\x00\x8a" + b"\xff" * 10, b"\xbe", b"\x80", b"\x3f\x00",
               b"\xff", b"\x7f\x80", b"\x0f", b"\x1f\xff", b"\x40", b"\x40\x01", b"\x00\x7f\x81"]


@settings(max_examples=400, deadline=None, suppress_health_check=_SLOW)
@given(st.lists(st.binary(max_size=60) | st.sampled_from(_ODD_BLOCKS) | mutated_blocks(),
                max_size=4),
       st.sampled_from([4096, 64, 0]), st.sampled_from([65536, 100, 0]))
def test_any_block_decodes_within_the_list_size_or_raises_only_compression_error(
    blocks: list[bytes], table: int, max_list: int
) -> None:
    decoder = Decoder(table, max_list)
    reference = hpack.Decoder(max_header_list_size=1 << 30)  # (its table starts at 4096)
    for block in blocks:
        try:
            fields, too_large = decoder.decode(block)
        except CompressionError:
            return  # the connection ends (GOAWAY COMPRESSION_ERROR)
        if too_large:
            assert fields == []
        else:
            assert _list_bytes(fields) <= max_list
        assert decoder.size <= decoder.table_bytes <= table
        if table == 4096:  # where the `hpack` package decodes it too, the same list
            try:
                theirs = reference.decode(block, raw=True)
            except hpack.HPACKError:
                return
            if not too_large:
                assert fields == theirs


@settings(max_examples=300, deadline=None, suppress_health_check=_SLOW)
@given(st.lists(st.tuples(_hpack_headers, st.booleans(), st.none() | st.sampled_from(
    [0, 100, 4096])), min_size=1, max_size=4), st.sampled_from([65536, 0, -1, 1]))
def test_blocks_the_hpack_package_encodes_decode_to_their_headers(
    blocks: list[tuple[list[tuple[bytes, bytes, bool]], bool, int | None]], limit: int
) -> None:
    # the list size limit: far, or at the first list's size (-1, 0, +1 byte)
    max_list = limit if limit > 1 else max(0, _list_bytes([h[:2] for h in blocks[0][0]]) + limit)
    encoder = hpack.Encoder()
    decoder = Decoder(4096, max_list)
    for headers, huffman, table_size in blocks:
        if table_size is not None:
            encoder.header_table_size = table_size
        block = encoder.encode([(hpack.NeverIndexedHeaderTuple(name, value) if sensitive
                                 else (name, value)) for name, value, sensitive in headers],
                               huffman=huffman)
        fields, too_large = decoder.decode(block)
        expected = [(name, value) for name, value, _ in headers]
        if _list_bytes(expected) > max_list:
            assert (fields, too_large) == ([], True)
        else:
            assert (fields, too_large) == (expected, False)
