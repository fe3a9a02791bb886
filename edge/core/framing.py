"""HTTP/1.x head checks and rewrites: what to forward, what to reject.

Given a request head, decide whether it is acceptable and how it is framed,
and which headers go upstream; given a response head, how its body is framed
and which headers go to the client. The readers take headers one at a time,
straight from the parser (each header is looked at once, and a forwarded one
goes into the outgoing bytes as it arrives); `check_request` and
`check_response` do the same for a list. Rejections are values carrying an
error code (edge/errors.py maps codes to statuses): ambiguous framing (both
Content-Length and Transfer-Encoding, differing Content-Lengths, a final
coding other than chunked, Transfer-Encoding on HTTP/1.0), missing,
duplicate or conflicting Host, too large a declared body. Hop-by-hop headers
(Connection and those it names, Keep-Alive, Proxy-Connection, TE, Trailer,
Transfer-Encoding, Upgrade) and client-supplied internal `X-Thaw-*` headers
never go upstream; framing headers are re-made by the shell. It knows nothing
of sockets; header names and values are bytes as parsed.
"""

from __future__ import annotations

import functools
import http
from dataclasses import dataclass

BODY_NONE = 0
BODY_LENGTH = 1
BODY_CHUNKED = 2
BODY_UNTIL_CLOSE = 3  # responses only

HOP_BY_HOP = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
        b"transfer-encoding", b"upgrade", b"content-length",
    }
)
SET_BY_EDGE = frozenset(
    {b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"x-request-id", b"expect"}
)
INTERNAL_PREFIX = b"x-thaw-"
CRLF = b"\r\n"
HOLD_TIMEOUT_HEADER = b"x-thaw-hold-timeout-ms"


@dataclass(frozen=True)
class Rejection:
    code: str
    message: str


@dataclass(slots=True)
class RequestHead:
    """An accepted request head. `target` is origin-form; `host` lower-case, no port;
    `forward` the header lines to pass on as they are (`Name: value\r\n` each)."""

    host: str
    authority: bytes
    target: bytes
    body: int
    content_length: int
    expect_continue: bool
    request_id: bytes | None
    forwarded_for: bytes | None
    hold_timeout_s: float | None
    forward: bytes


@dataclass(slots=True)
class ResponseHead:
    """How the upstream framed its body, and the header lines to pass on (`Name: value\r\n`
    each; framing and hop-by-hop headers are left for the shell to make)."""

    body: int
    content_length: int
    close: bool
    forward: bytes


_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode())
                 for s in http.HTTPStatus}


def status_line(status: int) -> bytes:
    """The status line the edge sends for `status`: its standard reason phrase, whatever
    the machine wrote (as Envoy and Go's ReverseProxy do; HTTP/2 has no phrase at all).
    An unregistered code gets an empty phrase, which HTTP/1.1 allows."""
    line = _STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


@functools.lru_cache(maxsize=4096)
def host_name(authority: bytes) -> str:
    """`Example.COM:8080` -> `example.com`; `[::1]:80` -> `[::1]`. (Memoised: a few
    authorities carry nearly all traffic.)"""
    text = authority.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[: text.find("]") + 1] if "]" in text else text
    if text.count(":") != 1:
        return text.rstrip(".")
    return text.rsplit(":", 1)[0].rstrip(".")


def _tokens(value: bytes) -> list[bytes]:
    return [t.strip().lower() for t in value.split(b",") if t.strip()]


@functools.lru_cache(maxsize=1024)
def _connection_options(value: bytes) -> tuple[frozenset[bytes], bool]:
    """(headers a Connection header names beyond the hop-by-hop ones, whether it says
    close). Memoised: nearly every one is `keep-alive` or `close`."""
    tokens = _tokens(value)
    return frozenset(tokens) - HOP_BY_HOP, b"close" in tokens


def _content_length(values: list[bytes]) -> int | Rejection:
    first = values[0].strip()
    if len(values) > 1 and any(v.strip() != first for v in values):
        return Rejection("bad_framing", "differing Content-Length headers")
    if not first.isdigit():
        return Rejection("bad_framing", "Content-Length is not a number")
    return int(first)


def _request_framing(
    version: str, lengths: list[bytes], codings: list[bytes], max_body_bytes: int
) -> tuple[int, int] | Rejection:
    if codings:
        if lengths:
            return Rejection("bad_framing", "both Content-Length and Transfer-Encoding")
        if version == "1.0":
            return Rejection("bad_framing", "Transfer-Encoding on HTTP/1.0")
        all_codings = [t for v in codings for t in _tokens(v)]
        if not all_codings or all_codings[-1] != b"chunked" or all_codings.count(b"chunked") > 1:
            return Rejection("bad_framing", "Transfer-Encoding must end in a single chunked")
        return BODY_CHUNKED, 0
    if lengths:
        length = _content_length(lengths)
        if isinstance(length, Rejection):
            return length
        if length > max_body_bytes:
            return Rejection("body_too_large", f"body over {max_body_bytes} bytes")
        return (BODY_LENGTH, length) if length else (BODY_NONE, 0)
    return BODY_NONE, 0


def _origin_form(url: bytes) -> tuple[bytes | None, bytes]:
    """(authority or None, origin-form target) of a request target."""
    lower = url[:8].lower()
    if not (lower.startswith(b"http://") or lower.startswith(b"https://")):
        return None, url
    rest = url.split(b"://", 1)[1]
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    path = rest[cut:] or b"/"
    if path.startswith(b"?"):
        path = b"/" + path
    return rest[:cut], path


def _authority(
    version: str, hosts: list[bytes], url: bytes
) -> tuple[bytes, bytes] | Rejection:
    if len(hosts) > 1:
        return Rejection("duplicate_host", "more than one Host header")
    absolute, target = (None, url) if url[:1] == b"/" else _origin_form(url)
    if not hosts and absolute is None:
        if version != "1.0":
            return Rejection("missing_host", "Host header required (HTTP/1.1)")
        return b"", target
    authority = hosts[0].strip() if hosts else b""
    if absolute is not None:
        if authority and host_name(absolute) != host_name(authority):
            return Rejection("conflicting_host", "request target authority differs from Host")
        authority = absolute
    if not authority:
        return Rejection("missing_host", "empty Host")
    return authority, target


class HeadTooLarge(Exception):
    """Raised from `on_header` to stop the parser; the reader's `rejection` says why."""


# What a header is to the edge, by lower-case name; absent: passed on as it is (_PASS).
(_PASS, _HOST, _LENGTH, _CODING, _CONNECTION, _REQUEST_ID, _FORWARDED_FOR, _EXPECT, _DROP,
 _INTERNAL, _HOLD_TIMEOUT) = range(11)
_REQUEST_ROLES: dict[bytes, int] = {
    **{name: _DROP for name in HOP_BY_HOP | SET_BY_EDGE},
    b"host": _HOST, b"content-length": _LENGTH, b"transfer-encoding": _CODING,
    b"connection": _CONNECTION, b"x-request-id": _REQUEST_ID,
    b"x-forwarded-for": _FORWARDED_FOR, b"expect": _EXPECT,
}
# Connection values that name no header and need no parsing: value -> says close.
_PLAIN_CONNECTION = {b"keep-alive": False, b"Keep-Alive": False, b"close": True, b"Close": True}
_RESPONSE_ROLES: dict[bytes, int] = {
    **{name: _DROP for name in HOP_BY_HOP},
    b"content-length": _LENGTH, b"transfer-encoding": _CODING, b"connection": _CONNECTION,
}


# Roles by the name as received (any case), filled as names are seen. Bounded: names are
# the client's to choose; past the bound a name is classified every time it is seen.
_ROLE_CACHE_MAX = 2048
_request_role_cache: dict[bytes, int] = {}
_response_role_cache: dict[bytes, int] = {}


def _request_role(name: bytes) -> int:
    lname = name.lower()
    role = _REQUEST_ROLES.get(lname)
    if role is None:
        if not lname.startswith(INTERNAL_PREFIX):
            role = _PASS
        else:
            role = _HOLD_TIMEOUT if lname == HOLD_TIMEOUT_HEADER else _INTERNAL
    if len(_request_role_cache) < _ROLE_CACHE_MAX:
        _request_role_cache[name] = role
    return role


def _response_role(name: bytes) -> int:
    role = _RESPONSE_ROLES.get(name.lower(), _PASS)
    if len(_response_role_cache) < _ROLE_CACHE_MAX:
        _response_role_cache[name] = role
    return role


def _without_named(parts: list[bytes], named: frozenset[bytes]) -> bytes:
    """The forward block without the headers a Connection header named. `parts` holds
    (name, ": ", value, CRLF) per header. Rare: most Connection headers name nothing
    but hop-by-hop options, which never reach `parts`."""
    kept: list[bytes] = []
    for i in range(0, len(parts), 4):
        if parts[i].lower() not in named:
            kept += parts[i:i + 4]
    return b"".join(kept)


class RequestHeadReader:
    """One request head at a time: `reset`, then `on_url` / `on_header` as the parser
    reads, then `finish`. Limits are on the count of headers and on the bytes of the
    target plus headers; past them `on_header` raises HeadTooLarge."""

    __slots__ = ("count", "forward", "max_header_bytes", "max_headers", "rejection", "size",
                 "special", "url")

    def __init__(self, max_headers: int, max_header_bytes: int) -> None:
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes
        self.rejection: Rejection | None = None
        self.reset()

    def reset(self) -> None:
        self.url = b""
        self.forward: list[bytes] = []  # (name, ": ", value, CRLF) per passed-on header
        self.special: list[tuple[int, bytes]] = []  # (role, value) of headers the edge reads
        self.count = 0
        self.size = 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.count += 1
        self.size += len(name) + len(value) + 4
        if self.count > self.max_headers or self.size > self.max_header_bytes:
            self.rejection = Rejection("headers_too_large",
                                       "too many or too large request headers")
            raise HeadTooLarge
        role = _request_role_cache.get(name)
        if role is None:
            role = _request_role(name)
        if role == _PASS:
            self.forward += (name, b": ", value, CRLF)
        else:
            self.special.append((role, value))

    def finish(self, version: str, max_body_bytes: int) -> RequestHead | Rejection:
        """Decide on the head read since `reset`; `version` as the parser read it ("1.1";
        HTTP/1 parsers also take "1.0", "0.9" and "2.0", and only 1.0 and 1.1 are served)."""
        if version != "1.1" and version != "1.0":
            return Rejection("version_not_supported", f"HTTP/{version} is not served")
        return self.finish_usual() or self._decide(version, max_body_bytes)

    def finish_usual(self) -> RequestHead | None:
        """The decision for the usual head — one Host, an origin-form target, nothing else
        the edge reads (so no body and no Connection header) — or None for any other.
        The same decision `_decide` makes for it, in any version, without its lists."""
        special = self.special
        url = self.url
        if len(special) == 1 and special[0][0] == _HOST and url[:1] == b"/":
            authority = special[0][1].strip()
            if authority:
                return RequestHead(host_name(authority), authority, url, BODY_NONE, 0, False,
                                   None, None, None, b"".join(self.forward))
        return None

    def _decide(self, version: str, max_body_bytes: int) -> RequestHead | Rejection:
        hosts: list[bytes] = []
        lengths: list[bytes] = []
        codings: list[bytes] = []
        named: frozenset[bytes] = frozenset()
        request_id = forwarded_for = None
        expect = False
        hold_timeout_s: float | None = None
        for role, value in self.special:
            if role == _HOST:
                hosts.append(value)
            elif role == _LENGTH:
                lengths.append(value)
            elif role == _CODING:
                codings.append(value)
            elif role == _CONNECTION:
                named = named | _connection_options(value)[0]
            elif role == _REQUEST_ID:
                request_id = value.strip()[:200] or None
            elif role == _FORWARDED_FOR:
                prior = b"" if forwarded_for is None else forwarded_for + b", "
                forwarded_for = prior + value.strip()
            elif role == _EXPECT:
                expect = value.strip().lower() == b"100-continue"
            elif role == _HOLD_TIMEOUT and value.strip().isdigit():
                hold_timeout_s = int(value.strip()) / 1000.0
        url = self.url
        authority: tuple[bytes, bytes] | Rejection
        if len(hosts) == 1 and url[:1] == b"/" and hosts[0].strip():
            authority = (hosts[0].strip(), url)  # the usual case, as _authority would decide
        else:
            authority = _authority(version, hosts, url)
        if isinstance(authority, Rejection):
            return authority
        if lengths or codings:
            framing = _request_framing(version, lengths, codings, max_body_bytes)
            if isinstance(framing, Rejection):
                return framing
        else:
            framing = (BODY_NONE, 0)
        forward = _without_named(self.forward, named) if named else b"".join(self.forward)
        return RequestHead(host_name(authority[0]), authority[0], authority[1], framing[0],
                           framing[1], expect, request_id, forwarded_for, hold_timeout_s,
                           forward)


class ResponseHeadReader:
    """One response head at a time: `on_header` as the parser reads, then `finish`, which
    also makes the reader ready for the next head (so the parser needs no message-begin
    callback). `reset` drops a head that will not be finished (a 1xx)."""

    __slots__ = ("forward", "special")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.forward: list[bytes] = []
        self.special: list[tuple[int, bytes]] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        role = _response_role_cache.get(name)
        if role is None:
            role = _response_role(name)
        if role == _PASS:
            self.forward += (name, b": ", value, CRLF)
        elif role != _DROP:
            self.special.append((role, value))

    def finish(self, status: int, head_request: bool) -> ResponseHead:
        """How the body of the response just read is framed (`head_request`: it answers
        a HEAD, so it has none whatever it says)."""
        decision: ResponseHead | None = None
        if not head_request and status >= 200 and status != 204 and status != 304:
            # The usual response: one plain Content-Length and perhaps a plain Connection.
            # What `_decide` answers for it, without building its sets and lists.
            length = -1
            close = False
            for role, value in self.special:
                if role == _LENGTH and length < 0 and value.isdigit():
                    length = int(value)
                elif role == _CONNECTION and value in _PLAIN_CONNECTION:
                    close = close or _PLAIN_CONNECTION[value]
                else:
                    break  # anything else: the general decision
            else:
                if length >= 0:
                    decision = ResponseHead(BODY_LENGTH, length, close, b"".join(self.forward))
        if decision is None:
            decision = self._decide(status, head_request)
        self.forward = []
        self.special = []
        return decision

    def _decide(self, status: int, head_request: bool) -> ResponseHead:
        named: frozenset[bytes] = frozenset()
        lengths: list[bytes] = []
        chunked = close = False
        for role, value in self.special:
            if role == _LENGTH:
                lengths.append(value)
            elif role == _CODING:
                chunked = chunked or b"chunked" in _tokens(value)
            else:
                options, says_close = _connection_options(value)
                named = named | options
                close = close or says_close
        forward = _without_named(self.forward, named) if named else b"".join(self.forward)
        if head_request or status in (204, 304) or 100 <= status < 200:
            length = _content_length(lengths) if lengths else -1
            if head_request and isinstance(length, int) and length >= 0:
                forward += b"Content-Length: %d\r\n" % length
            return ResponseHead(BODY_NONE, 0, close, forward)
        if chunked:
            return ResponseHead(BODY_CHUNKED, 0, close, forward)
        if lengths:
            value = lengths[0]
            length = int(value) if len(lengths) == 1 and value.isdigit() else (
                _content_length(lengths))
            if isinstance(length, int):
                return ResponseHead(BODY_LENGTH, length, close, forward)
        return ResponseHead(BODY_UNTIL_CLOSE, 0, True, forward)


def check_request(
    method: bytes,
    version: str,
    url: bytes,
    headers: list[tuple[bytes, bytes]],
    max_body_bytes: int,
) -> RequestHead | Rejection:
    """Decide on one request head; `headers` as received, names in any case. (`method`
    does not change the decision: any method may carry a body.)"""
    reader = RequestHeadReader(max_headers=len(headers), max_header_bytes=1 << 62)
    reader.on_url(url)
    for name, value in headers:
        reader.on_header(name, value)
    return reader.finish(version, max_body_bytes)


def check_response(
    status: int, headers: list[tuple[bytes, bytes]], head_request: bool
) -> ResponseHead:
    """Filter an upstream response head; framing says how to read its body."""
    reader = ResponseHeadReader()
    for name, value in headers:
        reader.on_header(name, value)
    return reader.finish(status, head_request)
