"""An exchange's heads between HTTP/1.1 and HTTP/2 on the machine side (apps whose
`protocol` is "h2c": the edge speaks HTTP/2 with prior knowledge to their machines).

The shell builds one HTTP/1.1 request head for every machine (edge/service.py); for an
h2c machine it is read back here into HTTP/2 fields — its own output, so well-formed —
with `te: trailers` added (gRPC servers require it; hop-by-hop headers never reach the
head). A machine's response fields become the `ResponseHead` both client sides know.
A gRPC "trailers-only" answer (its status and trailing metadata in the HEADERS that
end the stream) becomes a head with its content-type and trailers with the rest, so a
client gets them where gRPC reads them however the edge frames the answer.
"""

from __future__ import annotations

from typing import Final

from edge.core.framing import BODY_CHUNKED, BODY_LENGTH, BODY_NONE, CRLF, ResponseHead

Fields = list[tuple[bytes, bytes]]

# never sent to a machine over HTTP/2 (RFC 9113 8.2.2), nor taken from one's answer
CONNECTION_FIELDS = frozenset({b"connection", b"keep-alive", b"proxy-connection",
                               b"transfer-encoding", b"upgrade", b"te", b"host"})
TE_TRAILERS = (b"te", b"trailers")
_TOKEN_LOWER = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
# A byte is looked for by its value: `b"\r" in value` costs CPython a TypeError raised
# and cleared inside (it tries the operand as an integer first), ten times the search.
_CR: Final = 13
_LF: Final = 10
_NUL: Final = 0
_SPACES: Final = (32, 9)


def request_fields(upstream_head: bytes) -> Fields:
    """The HTTP/2 request fields of the HTTP/1.1 head the shell built: pseudo-fields from
    its request line and Host, every other line lower-cased, and `te: trailers`."""
    lines = upstream_head.split(CRLF)
    method, _, rest = lines[0].partition(b" ")
    target = rest.rpartition(b" ")[0]
    authority = b""
    fields: Fields = []
    for line in lines[1:]:
        if not line:
            break
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        value = value.strip()
        if name == b"host":
            authority = value
        elif name not in CONNECTION_FIELDS:
            fields.append((name, value))
    return [(b":method", method), (b":scheme", b"http"), (b":path", target),
            (b":authority", authority), *fields, TE_TRAILERS]


def response_head(fields: Fields, ended: bool, head_request: bool
                  ) -> tuple[int, ResponseHead, bytes]:
    """(status, head, trailers) of a machine's response fields. `ended`: they ended the
    stream — no body follows (`trailers` then holds a gRPC answer's status fields)."""
    status = 0
    length = -1
    kept: list[bytes] = []
    trailers: list[bytes] = []
    grpc = False
    for name, value in fields:
        if name == b":status":
            status = int(value) if value.isdigit() and len(value) == 3 else 0
        elif name[:1] == b":" or name in CONNECTION_FIELDS:
            continue
        elif name == b"content-length":
            length = int(value) if value.isdigit() and len(value) <= 18 else -1
        else:
            grpc = grpc or (name == b"content-type" and value.startswith(b"application/grpc"))
            kept.append(b"%s: %s\r\n" % (name, value))
    if ended and grpc:  # trailers-only: all but its content-type is trailing metadata
        trailers = [line for line in kept if not line.startswith(b"content-type:")]
        kept = [line for line in kept if line.startswith(b"content-type:")]
    if head_request or status in (204, 304):  # no body, whatever the frames (RFC 9110),
        if head_request and length >= 0:     # as edge/core/headreader.py decides it
            kept.append(b"content-length: %d\r\n" % length)
        body, size = BODY_NONE, 0
    elif ended and not trailers:
        body, size = BODY_LENGTH, 0
    elif length >= 0 and not ended:
        body, size = BODY_LENGTH, length
    else:
        body, size = BODY_CHUNKED, 0
    return status, ResponseHead(body, size, False, b"".join(kept)), b"".join(trailers)


def bad_field(name: bytes, value: bytes) -> bool:
    """A regular field a machine may not send (RFC 9113 8.2.1): a name that is not a
    lower-case token, or a value with CR, LF or NUL (which would split the HTTP/1.1
    head a client reads) or white space at either end."""
    return (not name or bool(name.translate(None, _TOKEN_LOWER))
            or _CR in value or _LF in value or _NUL in value  # (bytes by value: cheaper)
            or (value != b"" and (value[0] in _SPACES or value[-1] in _SPACES)))


def response_malformed(fields: Fields) -> str | None:
    """Why a machine's response fields are malformed (RFC 9113 8.3.2), or None: one
    three-digit :status first and no other pseudo-field, well-formed regular fields
    (`bad_field`), none connection-specific."""
    if not fields or fields[0][0] != b":status":
        return "no :status first"
    status = fields[0][1]
    if len(status) != 3 or not status.isdigit():
        return f"a :status of {status[:40]!r}"
    for name, value in fields[1:]:
        if name[:1] == b":":
            return f"pseudo-field {name[:40]!r} after :status"
        if bad_field(name, value):
            return f"a malformed field {name[:40]!r}"
        if name in CONNECTION_FIELDS and name not in (b"te", b"host"):
            return f"connection-specific field {name.decode('latin-1')}"
    return None


def trailer_lines(fields: Fields) -> bytes:
    """A machine's trailer fields as `Name: value\\r\\n` lines: well-formed regular
    fields only (`bad_field`), none that frames or routes a message."""
    return b"".join(b"%s: %s\r\n" % (name, value) for name, value in fields
                    if name[:1] != b":" and name not in CONNECTION_FIELDS
                    and name != b"content-length" and not bad_field(name, value))


def trailer_fields(lines: bytes) -> Fields:
    """`Name: value\\r\\n` lines (a request's checked trailers) as HTTP/2 fields."""
    fields: Fields = []
    for line in lines.split(CRLF):
        name, sep, value = line.partition(b":")
        if sep:
            name = name.strip().lower()
            if name not in CONNECTION_FIELDS:
                fields.append((name, value.strip()))
    return fields
