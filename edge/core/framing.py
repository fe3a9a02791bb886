"""HTTP/1.x head checks and rewrites: what to forward, what to reject.

Given a parsed request head, decide whether it is acceptable and how it is
framed, and which headers go upstream. Rejections are values carrying an
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
HOLD_TIMEOUT_HEADER = b"x-thaw-hold-timeout-ms"


@dataclass(frozen=True)
class Rejection:
    code: str
    message: str


@dataclass(slots=True)
class RequestHead:
    """An accepted request head. `target` is origin-form; `host` lower-case, no port."""

    host: str
    authority: bytes
    target: bytes
    body: int
    content_length: int
    expect_continue: bool
    request_id: bytes | None
    forwarded_for: bytes | None
    hold_timeout_s: float | None
    forward: list[tuple[bytes, bytes]]


@dataclass(slots=True)
class ResponseHead:
    """Upstream response headers to pass on, and how the upstream framed its body."""

    body: int
    content_length: int
    close: bool
    forward: list[tuple[bytes, bytes]]


def host_name(authority: bytes) -> str:
    """`Example.COM:8080` -> `example.com`; `[::1]:80` -> `[::1]`."""
    text = authority.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[: text.find("]") + 1] if "]" in text else text
    if text.count(":") != 1:
        return text.rstrip(".")
    return text.rsplit(":", 1)[0].rstrip(".")


def _tokens(value: bytes) -> list[bytes]:
    return [t.strip().lower() for t in value.split(b",") if t.strip()]


def _content_length(values: list[bytes]) -> int | Rejection:
    distinct = {v.strip() for v in values}
    if len(distinct) != 1:
        return Rejection("bad_framing", "differing Content-Length headers")
    text = distinct.pop()
    if not text.isdigit():
        return Rejection("bad_framing", "Content-Length is not a number")
    return int(text)


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
    absolute, target = _origin_form(url)
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


def check_request(
    method: bytes,
    version: str,
    url: bytes,
    headers: list[tuple[bytes, bytes]],
    max_body_bytes: int,
) -> RequestHead | Rejection:
    """Decide on one request head; `headers` as received, names in any case."""
    hosts: list[bytes] = []
    lengths: list[bytes] = []
    codings: list[bytes] = []
    named: set[bytes] = set()
    kept: list[tuple[bytes, bytes, bytes]] = []
    request_id = forwarded_for = None
    expect = False
    hold_timeout_s: float | None = None
    for name, value in headers:
        lname = name.lower()
        if lname == b"host":
            hosts.append(value)
        elif lname == b"content-length":
            lengths.append(value)
        elif lname == b"transfer-encoding":
            codings.append(value)
        elif lname == b"connection":
            named.update(_tokens(value))
        elif lname == b"x-request-id":
            request_id = value.strip()[:200] or None
        elif lname == b"x-forwarded-for":
            prior = b"" if forwarded_for is None else forwarded_for + b", "
            forwarded_for = prior + value.strip()
        elif lname == b"expect":
            expect = value.strip().lower() == b"100-continue"
        elif lname.startswith(INTERNAL_PREFIX):
            if lname == HOLD_TIMEOUT_HEADER and value.strip().isdigit():
                hold_timeout_s = int(value.strip()) / 1000.0
        elif lname not in HOP_BY_HOP and lname not in SET_BY_EDGE:
            kept.append((lname, name, value))
    authority = _authority(version, hosts, url)
    if isinstance(authority, Rejection):
        return authority
    framing = _request_framing(version, lengths, codings, max_body_bytes)
    if isinstance(framing, Rejection):
        return framing
    forward = [(name, value) for lname, name, value in kept if lname not in named]
    return RequestHead(
        host=host_name(authority[0]), authority=authority[0], target=authority[1],
        body=framing[0], content_length=framing[1], expect_continue=expect,
        request_id=request_id, forwarded_for=forwarded_for, hold_timeout_s=hold_timeout_s,
        forward=forward,
    )


def check_response(
    status: int, headers: list[tuple[bytes, bytes]], head_request: bool
) -> ResponseHead:
    """Filter an upstream response head; framing says how to read its body."""
    named: set[bytes] = set()
    lengths: list[bytes] = []
    chunked = close = False
    kept: list[tuple[bytes, bytes, bytes]] = []
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-length":
            lengths.append(value)
        elif lname == b"transfer-encoding":
            chunked = chunked or b"chunked" in _tokens(value)
        elif lname == b"connection":
            tokens = _tokens(value)
            named.update(tokens)
            close = close or b"close" in tokens
        elif lname not in HOP_BY_HOP:
            kept.append((lname, name, value))
    forward = [(name, value) for lname, name, value in kept if lname not in named]
    if head_request or status in (204, 304) or 100 <= status < 200:
        length = _content_length(lengths) if lengths else 0
        keep_length = length if isinstance(length, int) and head_request else -1
        if keep_length >= 0 and lengths:
            forward.append((b"Content-Length", str(keep_length).encode()))
        return ResponseHead(BODY_NONE, 0, close, forward)
    if chunked:
        return ResponseHead(BODY_CHUNKED, 0, close, forward)
    if lengths:
        length = _content_length(lengths)
        if isinstance(length, int):
            return ResponseHead(BODY_LENGTH, length, close, forward)
    return ResponseHead(BODY_UNTIL_CLOSE, 0, True, forward)
