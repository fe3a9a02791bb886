"""HTTP/1.x head checks and rewrites: what to forward, what to reject.

The rules by which a request head is accepted and framed and a response body
is framed, and the decisions' types; `headreader.py` applies them to heads
as the parser reads them. Rejections are values carrying an
error code (edge/errors.py maps codes to statuses): ambiguous framing (both
Content-Length and Transfer-Encoding, differing Content-Lengths, a final
coding other than chunked, Transfer-Encoding on HTTP/1.0), a transfer coding
besides chunked (not implemented: re-chunked upstream, its label would be lost),
missing, duplicate, invalid or conflicting Host (an HTTP/1.1 request needs a
Host even with an absolute-form target, RFC 9112 3.2; an authority is a host
and perhaps a port, RFC 3986 3.2.2), a target that is not origin-form,
absolute http(s) or `*` for OPTIONS, too large a declared body. Hop-by-hop
headers (Connection and those it names, Keep-Alive, Proxy-Connection, TE,
Trailer, Transfer-Encoding, Upgrade, HTTP2-Settings) and client-supplied
internal `X-Thaw-*` headers never go upstream; framing headers are re-made by
the shell. It knows nothing of sockets; header names and values are bytes as
parsed.
"""

from __future__ import annotations

import functools
import http
import ipaddress
import re
from dataclasses import dataclass

BODY_NONE = 0
BODY_LENGTH = 1
BODY_CHUNKED = 2
BODY_UNTIL_CLOSE = 3  # responses only

HOP_BY_HOP = frozenset(
    {
        b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
        b"transfer-encoding", b"upgrade", b"http2-settings", b"content-length",
    }
)
SET_BY_EDGE = frozenset(
    {b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"x-request-id", b"expect",
     b"x-real-ip", b"forwarded"}
)
NEVER_FORWARDED = frozenset({b"proxy-authorization"})  # a proxy's credential, not the app's
INTERNAL_PREFIX = b"x-thaw-"
HSTS = b"strict-transport-security"
CRLF = b"\r\n"
CHUNK_END = b"0\r\n\r\n"


def last_chunk(trailers: bytes) -> bytes:
    """A chunked body's end, with its trailer fields (`Name: value\r\n` lines) if any."""
    return b"0\r\n" + trailers + CRLF if trailers else CHUNK_END
HOLD_TIMEOUT_HEADER = b"x-thaw-hold-timeout-ms"


@dataclass(frozen=True)
class Rejection:
    code: str
    message: str


class RequestHead:
    """An accepted request head. `target` is origin-form; `host` lower-case, no port;
    `forward` the header lines to pass on as they are (`Name: value\r\n` each).
    `forwarded_proto`/`forwarded_host`: what the client (a proxy, believed only when
    trusted) says of the request's own scheme and host: the right-most item of
    X-Forwarded-Proto / X-Forwarded-Host. (A plain class, not a dataclass: under mypyc a
    dataclass's `__init__` is still the interpreted one dataclasses generates, and one is
    made per request.)"""

    __slots__ = ("authority", "body", "content_length", "expect_continue", "forward",
                 "forwarded_for", "forwarded_host", "forwarded_proto", "hold_timeout_s",
                 "host", "request_id", "target")

    def __init__(self, host: str, authority: bytes, target: bytes, body: int,
                 content_length: int, expect_continue: bool, request_id: bytes | None,
                 forwarded_for: bytes | None, hold_timeout_s: float | None, forward: bytes,
                 forwarded_proto: bytes | None = None,
                 forwarded_host: bytes | None = None) -> None:
        self.host = host
        self.authority = authority
        self.target = target
        self.body = body
        self.content_length = content_length
        self.expect_continue = expect_continue
        self.request_id = request_id
        self.forwarded_for = forwarded_for
        self.hold_timeout_s = hold_timeout_s
        self.forward = forward
        self.forwarded_proto = forwarded_proto
        self.forwarded_host = forwarded_host

    def _fields(self) -> tuple[object, ...]:
        return (self.host, self.authority, self.target, self.body, self.content_length,
                self.expect_continue, self.request_id, self.forwarded_for,
                self.hold_timeout_s, self.forward, self.forwarded_proto, self.forwarded_host)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestHead):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # (mutable, as a dataclass with eq is)

    def __repr__(self) -> str:
        return f"RequestHead{self._fields()!r}"


class ResponseHead:
    """How the upstream framed its body, and the header lines to pass on (`Name: value\r\n`
    each; framing and hop-by-hop headers are left for the shell to make). (A plain class:
    see RequestHead.)"""

    __slots__ = ("body", "close", "content_length", "forward")

    def __init__(self, body: int, content_length: int, close: bool, forward: bytes) -> None:
        self.body = body
        self.content_length = content_length
        self.close = close
        self.forward = forward

    def _fields(self) -> tuple[object, ...]:
        return (self.body, self.content_length, self.close, self.forward)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResponseHead):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ResponseHead{self._fields()!r}"


_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode())
                 for s in http.HTTPStatus}


def status_line(status: int) -> bytes:
    """The status line the edge sends for `status`: its standard reason phrase, whatever
    the machine wrote (as Envoy and Go's ReverseProxy do; HTTP/2 has no phrase at all).
    An unregistered code gets an empty phrase, which HTTP/1.1 allows."""
    line = _STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


# RFC 3986 3.2.2: reg-name = *( unreserved / pct-encoded / sub-delims ), so no "@", ":",
# "/", whitespace or non-ASCII; IPvFuture = "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" ).
_REG_NAME = re.compile(rb"(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+")
_IP_FUTURE = re.compile(rb"[vV][0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+")
_IPV6_CHARS = frozenset(b"0123456789abcdefABCDEF:.")


def _ip_literal(literal: bytes) -> bool:
    """Whether `literal` (between the brackets) is an IPv6 address or an IPvFuture."""
    if _IP_FUTURE.fullmatch(literal):
        return True
    if not literal or not all(c in _IPV6_CHARS for c in literal):
        return False  # also keeps out zone ids, which ipaddress would take
    try:
        ipaddress.IPv6Address(literal.decode("ascii"))
    except ValueError:
        return False
    return True


def _port(rest: bytes) -> bool:
    """Whether what follows the host is nothing or ":" and a port of 1-5 digits."""
    if not rest:
        return True
    digits = rest[1:]
    return (rest[:1] == b":" and 0 < len(digits) <= 5 and digits.isdigit()
            and int(digits) <= 65535)


@functools.lru_cache(maxsize=4096)
def host_name(authority: bytes) -> str | None:
    """The host an authority names, lower case, without port or trailing dot
    (`Example.COM.:8080` -> `example.com`, `[::1]:80` -> `[::1]`), or None when it is
    no host and port (RFC 9110 7.2, RFC 3986 3.2.2): userinfo, whitespace, a port that
    is not 1-5 digits up to 65535, a character a reg-name cannot hold, an empty host.
    Memoised, the check with it: a few authorities carry nearly all traffic."""
    if authority[:1] == b"[":
        end = authority.find(b"]")
        if end < 0 or not _ip_literal(authority[1:end]) or not _port(authority[end + 1:]):
            return None
        return authority[:end + 1].decode("ascii").lower()
    host, colon, port = authority.partition(b":")
    if not _REG_NAME.fullmatch(host) or not _port(colon + port):
        return None
    return host.decode("ascii").lower().rstrip(".") or None


def tokens(value: bytes) -> list[bytes]:
    return [t.strip().lower() for t in value.split(b",") if t.strip()]


# Connection options that name no header to drop: hop-by-hop ones are dropped anyway,
# and `close` is an option of the connection, not a field name (RFC 9110, 7.6.1).
_NAMES_NO_HEADER = HOP_BY_HOP | {b"close"}


@functools.lru_cache(maxsize=1024)
def connection_options(value: bytes) -> tuple[frozenset[bytes], bool]:
    """(headers a Connection header names beyond the hop-by-hop ones, whether it says
    close). Memoised: nearly every one is `keep-alive` or `close`."""
    options = tokens(value)
    return frozenset(options) - _NAMES_NO_HEADER, b"close" in options


def content_length(values: list[bytes]) -> int | Rejection:
    first = values[0].strip()
    if len(values) > 1 and any(v.strip() != first for v in values):
        return Rejection("bad_framing", "differing Content-Length headers")
    if not first.isdigit():
        return Rejection("bad_framing", "Content-Length is not a number")
    return int(first)


def request_framing(
    version: str, lengths: list[bytes], codings: list[bytes], max_body_bytes: int
) -> tuple[int, int] | Rejection:
    if codings:
        if lengths:
            return Rejection("bad_framing", "both Content-Length and Transfer-Encoding")
        if version == "1.0":
            return Rejection("bad_framing", "Transfer-Encoding on HTTP/1.0")
        all_codings = [t for v in codings for t in tokens(v)]
        if not all_codings or all_codings[-1] != b"chunked" or all_codings.count(b"chunked") > 1:
            return Rejection("bad_framing", "Transfer-Encoding must end in a single chunked")
        if len(all_codings) > 1:  # the body is re-chunked upstream: the others would be lost
            return Rejection("transfer_coding_not_supported",
                             "a transfer coding besides chunked")
        return BODY_CHUNKED, 0
    if lengths:
        length = content_length(lengths)
        if isinstance(length, Rejection):
            return length
        if length > max_body_bytes:
            return Rejection("body_too_large", f"body over {max_body_bytes} bytes")
        return (BODY_LENGTH, length) if length else (BODY_NONE, 0)
    return BODY_NONE, 0


def request_target(method: bytes, url: bytes) -> tuple[bytes | None, bytes] | Rejection:
    """(authority of an absolute-form target or None, the target to forward: origin-form
    or `*`) of a request target (RFC 9112 3.2): origin-form, absolute-form with an http or
    https scheme, or `*` for OPTIONS. (Authority-form, CONNECT's, is refused before.)"""
    if url[:1] == b"/":
        return None, url
    if url == b"*":
        if method == b"OPTIONS":
            return None, url
        return Rejection("bad_target", "the target * is for OPTIONS only")
    lower = url[:8].lower()
    if not (lower.startswith(b"http://") or lower.startswith(b"https://")):
        return Rejection("bad_target", "the target is neither a path nor an http(s) URL")
    rest = url.split(b"://", 1)[1]
    cut = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
    path = rest[cut:] or b"/"
    if path.startswith(b"?"):
        path = b"/" + path
    return rest[:cut], path


def request_authority(
    method: bytes, version: str, hosts: list[bytes], url: bytes
) -> tuple[str, bytes, bytes] | Rejection:
    """(host name, authority, target to forward) of a request, from its Host headers and
    its target; the host name is "" for an HTTP/1.0 request that names none."""
    if len(hosts) > 1:
        return Rejection("duplicate_host", "more than one Host header")
    form = request_target(method, url)
    if isinstance(form, Rejection):
        return form
    absolute, target = form
    if not hosts and version != "1.0":  # also with an absolute-form target (RFC 9112, 3.2)
        return Rejection("missing_host", "Host header required (HTTP/1.1)")
    authority = hosts[0].strip() if hosts else b""
    host = host_name(authority) if authority else ""
    if host is None:
        return Rejection("bad_host", "Host is not a host and port")
    if absolute is not None:
        absolute_host = host_name(absolute)
        if absolute_host is None:
            return Rejection("bad_host", "the target's authority is not a host and port")
        if authority and absolute_host != host:
            return Rejection("conflicting_host", "request target authority differs from Host")
        return absolute_host, absolute, target
    if not authority and hosts:
        return Rejection("missing_host", "empty Host")
    return host, authority, target


def hsts_value(max_age_s: int) -> bytes:
    """The Strict-Transport-Security value answers over TLS get when the edge was given
    a max-age (`TlsConfig.hsts_max_age_s`), else b"" (none). Made once, by the shell."""
    return b"max-age=%d" % max_age_s if max_age_s > 0 else b""


_HSTS_LINE = re.compile(rb"(?:^|\n)strict-transport-security:", re.IGNORECASE)


def sets_hsts(forward: bytes) -> bool:
    """Whether a response's header lines carry their own Strict-Transport-Security (no
    lowered copy of the head is made)."""
    return _HSTS_LINE.search(forward) is not None
