"""Request and response heads read as the parser delivers them, decided by framing's rules.

The parser calls a reader's bound `on_header` itself (no shell frame between):
each header is classified once, by a role table memoised on the name as
received, and a header the edge passes on goes into the outgoing bytes as it
arrives. A request header whose name holds "_" is never passed on: CGI, WSGI
and many frameworks fold "_" and "-" to one name, so `X_Forwarded_For` or
`Transfer_Encoding` would reach the app as a header the edge set or framed
itself. Such a name has a role of its own (ordinary names cost nothing more),
and `finish` drops it or rejects the head, as the reader was built to.
`finish` decides the usual heads (one valid Host, an origin-form target, no
body; one plain Content-Length) in a straight line and any other through the
general rules of `framing.py`; property tests hold the two to one answer.
`check_request` and `check_response` do the same for a list of headers. It
knows nothing of sockets or parsers beyond the callbacks' signatures.
"""

from __future__ import annotations

from typing import Final

from edge.core.framing import (
    BODY_CHUNKED,
    BODY_LENGTH,
    BODY_NONE,
    BODY_UNTIL_CLOSE,
    CRLF,
    HOLD_TIMEOUT_HEADER,
    HOP_BY_HOP,
    INTERNAL_PREFIX,
    NEVER_FORWARDED,
    SET_BY_EDGE,
    Rejection,
    RequestHead,
    ResponseHead,
    connection_options,
    content_length,
    host_name,
    request_authority,
    request_framing,
    tokens,
)


class HeadTooLarge(Exception):
    """Raised from `on_header` to stop the parser; the reader's `rejection` says why."""


UNDERSCORE_HEADERS = ("drop", "reject")  # what a request header whose name holds "_" gets

# What a header is to the edge, by lower-case name; absent: passed on as it is (_PASS).
(_PASS, _HOST, _LENGTH, _CODING, _CONNECTION, _REQUEST_ID, _FORWARDED_FOR, _EXPECT, _DROP,
 _INTERNAL, _HOLD_TIMEOUT, _UPGRADE, _UNDERSCORE, _FORWARDED_PROTO, _FORWARDED_HOST) = range(15)
_REQUEST_ROLES: dict[bytes, int] = {
    **{name: _DROP for name in HOP_BY_HOP | SET_BY_EDGE | NEVER_FORWARDED},
    b"host": _HOST, b"content-length": _LENGTH, b"transfer-encoding": _CODING,
    b"connection": _CONNECTION, b"x-request-id": _REQUEST_ID,
    b"x-forwarded-for": _FORWARDED_FOR, b"expect": _EXPECT, b"upgrade": _UPGRADE,
    b"x-forwarded-proto": _FORWARDED_PROTO, b"x-forwarded-host": _FORWARDED_HOST,
}
_RESPONSE_ROLES: dict[bytes, int] = {
    **{name: _DROP for name in HOP_BY_HOP},
    b"content-length": _LENGTH, b"transfer-encoding": _CODING, b"connection": _CONNECTION,
}


# Roles by the name as received (any case), filled as names are seen. Bounded: names are
# the client's to choose; past the bound a name is classified every time it is seen.
_ROLE_CACHE_MAX = 2048
_UNDERSCORE_BYTE: Final = 95  # "_", a byte looked for by its value (see edge/core/h2map.py)
_request_role_cache: dict[bytes, int] = {}
_response_role_cache: dict[bytes, int] = {}


def _request_role(name: bytes) -> int:
    lname = name.lower()
    role = _UNDERSCORE if _UNDERSCORE_BYTE in lname else _REQUEST_ROLES.get(lname)
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
    target plus headers; past them `on_header` raises HeadTooLarge. `underscore_headers`
    (one of UNDERSCORE_HEADERS): a header whose name holds "_" is dropped (as nginx's
    default `underscores_in_headers off` does), or the head is rejected, `bad_header`."""

    __slots__ = ("count", "forward", "max_header_bytes", "max_headers", "reject_underscore",
                 "rejection", "size", "special", "url")

    def __init__(self, max_headers: int, max_header_bytes: int, *,
                 underscore_headers: str = "drop") -> None:
        if underscore_headers not in UNDERSCORE_HEADERS:
            raise ValueError(f"underscore_headers must be one of {UNDERSCORE_HEADERS}")
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes
        self.reject_underscore = underscore_headers == "reject"
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

    def finish(self, method: bytes, version: str, max_body_bytes: int
               ) -> RequestHead | Rejection:
        """Decide on the head read since `reset`; `version` as the parser read it ("1.1";
        HTTP/1 parsers also take "1.0", "0.9" and "2.0", and only 1.0 and 1.1 are served).
        `method` matters only to a target of `*` (OPTIONS only)."""
        if version != "1.1" and version != "1.0":
            return Rejection("version_not_supported", f"HTTP/{version} is not served")
        return self.finish_usual() or self._decide(method, version, max_body_bytes)

    def finish_usual(self) -> RequestHead | None:
        """The decision for the usual head — one valid Host, an origin-form target, nothing
        else the edge reads (so no body and no Connection header) — or None for any other.
        The same decision `_decide` makes for it, in any version and method, without its
        lists. (The Host's check rides `host_name`'s memo: None leaves it to `_decide`.)"""
        special = self.special
        url = self.url
        if len(special) == 1 and special[0][0] == _HOST and url[:1] == b"/":
            authority = special[0][1].strip()
            host = host_name(authority)
            if host is not None:
                return RequestHead(host, authority, url, BODY_NONE, 0, False,
                                   None, None, None, b"".join(self.forward))
        return None

    # (one branch per framing rule of RFC 9112 6-7: complex by what it checks, C901 allowed)
    def _decide(self, method: bytes, version: str, max_body_bytes: int  # noqa: C901
                ) -> RequestHead | Rejection:
        hosts: list[bytes] = []
        lengths: list[bytes] = []
        codings: list[bytes] = []
        named: frozenset[bytes] = frozenset()
        request_id = forwarded_for = forwarded_proto = forwarded_host = None
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
                named = named | connection_options(value)[0]
            elif role == _REQUEST_ID:
                request_id = value.strip()[:200] or None
            elif role == _FORWARDED_FOR:
                prior = b"" if forwarded_for is None else forwarded_for + b", "
                forwarded_for = prior + value.strip()
            elif role == _FORWARDED_PROTO:
                forwarded_proto = value.rpartition(b",")[2].strip()
            elif role == _FORWARDED_HOST:
                forwarded_host = value.rpartition(b",")[2].strip()
            elif role == _EXPECT:
                expect = value.strip().lower() == b"100-continue"
            elif role == _HOLD_TIMEOUT and value.strip().isdigit():
                hold_timeout_s = int(value.strip()) / 1000.0
            elif role == _UNDERSCORE and self.reject_underscore:
                return Rejection("bad_header", 'a header name holds "_"')
        routing = request_authority(method, version, hosts, self.url)
        if isinstance(routing, Rejection):
            return routing
        if lengths or codings:
            framing = request_framing(version, lengths, codings, max_body_bytes)
            if isinstance(framing, Rejection):
                return framing
        else:
            framing = (BODY_NONE, 0)
        forward = _without_named(self.forward, named) if named else b"".join(self.forward)
        return RequestHead(routing[0], routing[1], routing[2], framing[0], framing[1], expect,
                           request_id, forwarded_for, hold_timeout_s, forward, forwarded_proto,
                           forwarded_host)

    def upgrades_to_websocket(self) -> bool:
        """Whether the head read asks to upgrade to WebSocket (RFC 6455) and to nothing
        else, with `Connection: upgrade`: the upgrade the edge tunnels."""
        offered = [t for role, value in self.special if role == _UPGRADE for t in tokens(value)]
        options = [t for role, value in self.special if role == _CONNECTION
                   for t in tokens(value)]
        return offered == [b"websocket"] and b"upgrade" in options

    def upgrades_to_h2c_only(self) -> bool:
        """Whether the head read asks to upgrade to h2c and to nothing else (what `curl
        --http2` sends to an http:// URL): the one upgrade the edge may ignore."""
        offered = [t for role, value in self.special if role == _UPGRADE for t in tokens(value)]
        return offered == [b"h2c"]


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
            # The usual response: one plain Content-Length and perhaps a Connection that
            # names no header. What `_decide` answers for it, without its sets and lists.
            length = -1
            close = False
            for role, value in self.special:
                if role == _LENGTH and length < 0 and value.isdigit():
                    length = int(value)
                    continue
                if role == _CONNECTION:
                    options, says_close = connection_options(value)
                    if not options:
                        close = close or says_close
                        continue
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
                chunked = chunked or b"chunked" in tokens(value)
            else:
                options, says_close = connection_options(value)
                named = named | options
                close = close or says_close
        forward = _without_named(self.forward, named) if named else b"".join(self.forward)
        if head_request or status in (204, 304) or 100 <= status < 200:
            length = content_length(lengths) if lengths else -1
            if head_request and isinstance(length, int) and length >= 0:
                forward += b"Content-Length: %d\r\n" % length
            return ResponseHead(BODY_NONE, 0, close, forward)
        if chunked:
            return ResponseHead(BODY_CHUNKED, 0, close, forward)
        if lengths:
            length = content_length(lengths)
            if isinstance(length, int):
                return ResponseHead(BODY_LENGTH, length, close, forward)
        return ResponseHead(BODY_UNTIL_CLOSE, 0, True, forward)


def check_request(
    method: bytes,
    version: str,
    url: bytes,
    headers: list[tuple[bytes, bytes]],
    max_body_bytes: int,
    underscore_headers: str = "drop",
) -> RequestHead | Rejection:
    """Decide on one request head; `headers` as received, names in any case. (`method`
    matters only to a target of `*`, which is for OPTIONS: any method may carry a body.)"""
    reader = RequestHeadReader(max_headers=len(headers), max_header_bytes=1 << 62,
                               underscore_headers=underscore_headers)
    reader.on_url(url)
    for name, value in headers:
        reader.on_header(name, value)
    return reader.finish(method, version, max_body_bytes)


def check_response(
    status: int, headers: list[tuple[bytes, bytes]], head_request: bool
) -> ResponseHead:
    """Filter an upstream response head; framing says how to read its body."""
    reader = ResponseHeadReader()
    for name, value in headers:
        reader.on_header(name, value)
    return reader.finish(status, head_request)
