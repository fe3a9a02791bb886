"""Whether an HTTP/2 request's header list is well-formed (RFC 9113, 8.2-8.3), before any
of it is trusted or forwarded to a machine in HTTP/1.1.

A malformed request is a stream error (RST_STREAM PROTOCOL_ERROR), never a connection
error: pseudo-headers other than :method, :scheme, :authority, :path and :protocol (RFC 8441),
repeated, or after a regular header; a missing :method, :scheme or :path (plain CONNECT
aside); a :protocol without CONNECT; a name with
upper-case letters, separators or controls; a value holding CR, LF or NUL (which would
split the HTTP/1.1 head the machine reads), or white space at either end of a value
(RFC 9113 8.2.1); a connection-specific header; TE other than
"trailers"; a Host that names another authority than :authority; a :method that is
not a token; a space or control byte in :path, :authority or :scheme (they make the
HTTP/1.1 request line).
"""

from __future__ import annotations

import re

from edge.core.framing import BODY_LENGTH, Rejection, RequestHead
from edge.core.headreader import HeadTooLarge, RequestHeadReader

PSEUDO = frozenset({b":method", b":scheme", b":authority", b":path", b":protocol"})
CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection",
                                 b"transfer-encoding", b"upgrade"})
_NOT_NAME = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9a-z]")  # a lower-case token's complement
_NOT_TOKEN = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9a-zA-Z]")
_CTL_OR_SPACE = re.compile(rb"[\x00-\x20\x7f]")
_BAD_VALUE = re.compile(rb"[\r\n\x00]|^[ \t]|[ \t]$")  # also: white space around a value


# fields that frame or route a message: never taken from trailers
_NOT_IN_TRAILERS = CONNECTION_SPECIFIC | {b"content-length", b"host", b"te", b"trailer",
                                          b"content-encoding", b"content-type"}


def trailer_lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A request's trailer fields as `Name: value\r\n` lines for a chunked body's end:
    only well-formed ones (a lower-case token name, no CR/LF/NUL in the value), and none
    that frames or routes a message (RFC 9110 6.5.1)."""
    lines = []
    for name, value in headers:
        if (name[:1] == b":" or not name or _NOT_NAME.search(name) or _BAD_VALUE.search(value)
                or name in _NOT_IN_TRAILERS):
            continue
        lines.append(name + b": " + value.strip() + b"\r\n")
    return b"".join(lines)


# (one branch per rule of RFC 9113 8.2-8.3: complex by what it checks, C901 allowed)
def malformed(headers: list[tuple[bytes, bytes]]) -> str | None:  # noqa: C901
    """Why the request's header list is malformed, or None when it is well-formed."""
    pseudo: dict[bytes, bytes] = {}
    regular = False
    host: bytes | None = None
    for name, value in headers:
        if _BAD_VALUE.search(value):
            return f"a CR, LF or NUL in, or white space around, the value of {name[:40]!r}"
        if name[:1] == b":":
            if regular:
                return "a pseudo-header after a regular header"
            if name not in PSEUDO:
                return f"unknown pseudo-header {name[:40]!r}"
            if name in pseudo:
                return f"repeated {name.decode()}"
            pseudo[name] = value
            continue
        regular = True
        if not name or _NOT_NAME.search(name):
            return f"a header name that is not a lower-case token: {name[:40]!r}"
        if name in CONNECTION_SPECIFIC:
            return f"connection-specific header {name.decode()}"
        if name == b"te" and value.strip().lower() != b"trailers":
            return 'TE other than "trailers"'
        if name == b"host":
            host = value
    method = pseudo.get(b":method")
    if not method:
        return "no :method"
    if _NOT_TOKEN.search(method):
        return "a :method that is not a token"
    protocol = pseudo.get(b":protocol")
    if protocol is not None and (method != b"CONNECT" or not pseudo.get(b":authority")):
        return ":protocol without CONNECT and :authority"  # RFC 8441 4
    if (method != b"CONNECT" or protocol is not None) \
            and (not pseudo.get(b":scheme") or not pseudo.get(b":path")):
        return "no :scheme or :path"
    for name in (b":path", b":authority", b":scheme"):
        if _CTL_OR_SPACE.search(pseudo.get(name, b"")):
            return f"a space or control byte in {name.decode()}"
    authority = pseudo.get(b":authority")
    if host is not None and authority is not None \
            and host.strip().lower() != authority.strip().lower():
        return "Host names another authority than :authority"
    return None


REFUSED = "refused"  # `request_head`'s answer for a stream to reset (PROTOCOL_ERROR)


def request_head(reader: RequestHeadReader, headers: list[tuple[bytes, bytes]], ended: bool,
                 max_body_bytes: int, websocket_key: bytes = b""
                 ) -> tuple[bytes, RequestHead, bool] | str:
    """(method, the head a machine is sent in HTTP/1.1, whether it opens a WebSocket) of a
    well-formed (`malformed`) request's header list, or the error code to answer it with
    (REFUSED: reset the stream). The head goes through the same reader as HTTP/1.1's:
    `:authority` as Host (the only routing source), cookies joined again, and a body of
    unknown length (no content-length, no END_STREAM on the headers) framed chunked.

    A WebSocket over HTTP/2 (RFC 8441: CONNECT with `:protocol: websocket`) becomes the
    HTTP/1.1 upgrade a machine understands (RFC 6455): a GET with no body and
    `Sec-WebSocket-Key: websocket_key` (the edge's, as an HTTP/2 client sends none);
    Upgrade and Connection are the shell's to add. Any other CONNECT is refused (501)."""
    pseudo: dict[bytes, bytes] = {}
    reader.reset()
    cookies: list[bytes] = []
    has_length = False
    try:
        for name, value in headers:
            if name[:1] == b":":
                pseudo[name] = value
            elif name == b"host":
                continue  # `malformed` checked it names :authority
            elif name == b"cookie":
                cookies.append(value)
            else:
                has_length = has_length or name == b"content-length"
                reader.on_header(name, value)
        authority = pseudo.get(b":authority")
        if not authority:
            return "missing_host"
        method = pseudo.get(b":method", b"GET")
        websocket = method == b"CONNECT" and pseudo.get(b":protocol") == b"websocket"
        if method == b"CONNECT":
            if not websocket or not websocket_key:
                return "upgrade_not_supported"
            method = b"GET"
            ended = True  # the stream's DATA is the tunnel's, not a body
            reader.on_header(b"sec-websocket-key", websocket_key)
        reader.on_header(b"host", authority)
        if cookies:
            reader.on_header(b"cookie", b"; ".join(cookies))
        if not ended and not has_length:
            reader.on_header(b"transfer-encoding", b"chunked")
        reader.on_url(pseudo.get(b":path", b"/"))
    except HeadTooLarge:
        return "headers_too_large"
    decided = reader.finish(method, "1.1", max_body_bytes)
    if isinstance(decided, Rejection):
        return decided.code
    if ended and decided.body == BODY_LENGTH:  # a declared body that cannot come
        return REFUSED
    return method, decided, websocket
