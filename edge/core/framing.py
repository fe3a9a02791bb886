"""HTTP/1.x head checks and rewrites: what to forward, what to reject.

The rules by which a request head is accepted and framed and a response body
is framed, and the decisions' types; `headreader.py` applies them to heads
as the parser reads them. Rejections are values carrying an
error code (edge/errors.py maps codes to statuses): ambiguous framing (both
Content-Length and Transfer-Encoding, differing Content-Lengths, a final
coding other than chunked, Transfer-Encoding on HTTP/1.0), missing,
duplicate or conflicting Host (an HTTP/1.1 request needs a Host even with an
absolute-form target, RFC 9112 3.2), too large a declared body. Hop-by-hop
headers (Connection and those it names, Keep-Alive, Proxy-Connection, TE,
Trailer, Transfer-Encoding, Upgrade, HTTP2-Settings) and client-supplied
internal `X-Thaw-*` headers never go upstream; framing headers are re-made by
the shell. It knows nothing of sockets; header names and values are bytes as
parsed.
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
        b"transfer-encoding", b"upgrade", b"http2-settings", b"content-length",
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
        return BODY_CHUNKED, 0
    if lengths:
        length = content_length(lengths)
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


def request_authority(
    version: str, hosts: list[bytes], url: bytes
) -> tuple[bytes, bytes] | Rejection:
    if len(hosts) > 1:
        return Rejection("duplicate_host", "more than one Host header")
    absolute, target = (None, url) if url[:1] == b"/" else _origin_form(url)
    if not hosts:
        if version != "1.0":  # also with an absolute-form target (RFC 9112, 3.2)
            return Rejection("missing_host", "Host header required (HTTP/1.1)")
        if absolute is None:
            return b"", target
    authority = hosts[0].strip() if hosts else b""
    if absolute is not None:
        if authority and host_name(absolute) != host_name(authority):
            return Rejection("conflicting_host", "request target authority differs from Host")
        authority = absolute
    if not authority:
        return Rejection("missing_host", "empty Host")
    return authority, target
