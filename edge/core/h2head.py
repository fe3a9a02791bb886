"""Whether an HTTP/2 request's header list is well-formed (RFC 9113, 8.2-8.3), before any
of it is trusted or forwarded to a machine in HTTP/1.1.

A malformed request is a stream error (RST_STREAM PROTOCOL_ERROR), never a connection
error: pseudo-headers other than :method, :scheme, :authority and :path, repeated, or
after a regular header; a missing :method, :scheme or :path (CONNECT aside); a name with
upper-case letters, separators or controls; a value holding CR, LF or NUL (which would
split the HTTP/1.1 head the machine reads); a connection-specific header; TE other than
"trailers"; a Host that names another authority than :authority.
"""

from __future__ import annotations

PSEUDO = frozenset({b":method", b":scheme", b":authority", b":path"})
CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection",
                                 b"transfer-encoding", b"upgrade"})
_NAME_OK = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")


def malformed(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why the request's header list is malformed, or None when it is well-formed."""
    pseudo: dict[bytes, bytes] = {}
    regular = False
    host: bytes | None = None
    for name, value in headers:
        if b"\r" in value or b"\n" in value or b"\0" in value:
            return f"a CR, LF or NUL in the value of {name[:40]!r}"
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
        if not name or not all(byte in _NAME_OK for byte in name):
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
    if method != b"CONNECT" and (not pseudo.get(b":scheme") or not pseudo.get(b":path")):
        return "no :scheme or :path"
    authority = pseudo.get(b":authority")
    if host is not None and authority is not None \
            and host.strip().lower() != authority.strip().lower():
        return "Host names another authority than :authority"
    return None
