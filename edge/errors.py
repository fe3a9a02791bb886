"""Edge error codes, their HTTP statuses and messages, and the one place answers are built.

Every answer the edge makes itself is JSON `{"error": code, "message": text}`
(Knative-activator style: 503 when the app cannot take it now, 504 when time
ran out, 502 when the machine failed the request). The text is fixed per code
(MESSAGES): what went wrong in detail — placement's words, which can name
agents' URLs, a machine's address, an exception — is for the log, never for
the end user. A gRPC call (`content-type: application/grpc…`) gets the same
answer in gRPC's terms instead (`grpc_error_trailers`): 200 with no message and
trailers holding a `grpc-status` mapped from the HTTP status as gRPC's own HTTP
mapping does, and the fixed message as `grpc-message` — what Envoy does for its
local replies — so a gRPC client sees UNAVAILABLE "the app did not become ready
in time", not an unexplained HTTP 504.
"""

from __future__ import annotations

import functools
import json
from http import HTTPStatus

STATUS: dict[str, int] = {
    "bad_request": 400,
    "bad_framing": 400,
    "bad_header": 400,
    "missing_host": 400,
    "duplicate_host": 400,
    "conflicting_host": 400,
    "bad_host": 400,
    "bad_target": 400,
    "unknown_app": 404,
    "not_found": 404,  # placement does not know the app
    "request_timeout": 408,
    "body_too_large": 413,
    "too_many_requests": 429,  # a client over its own limits (edge/core/clients.py)
    "too_many_held": 429,  # a client with as many requests held as it may (holdqueue)
    "too_many_tunnels": 429,  # a client with as many WebSocket tunnels as it may
    "headers_too_large": 431,
    "upgrade_not_supported": 501,
    "transfer_coding_not_supported": 501,
    "version_not_supported": 505,
    "bad_gateway": 502,
    "image_unavailable": 502,  # the app's image cannot be had: retrying will not help
    "queue_full": 503,
    "tunnels_full": 503,
    "edge_full": 503,
    "no_capacity": 503,
    "start_failed": 503,
    "auto_start_off": 503,
    "shutting_down": 503,
    "wake_failed": 503,
    "hold_timeout": 504,
    "deadline": 504,
    "upstream_timeout": 504,
}
MESSAGES: dict[str, str] = {
    "bad_request": "malformed HTTP request",
    "bad_framing": "ambiguous or invalid request body framing",
    "bad_header": "header names with an underscore are not accepted",
    "missing_host": "a Host header is required",
    "duplicate_host": "more than one Host header",
    "conflicting_host": "the request target names another host than the Host header",
    "bad_host": "the Host header or the request target's authority is not a host and port",
    "bad_target": "the request target must be a path, an http(s) URL, or * for OPTIONS",
    "unknown_app": "no app serves this host",
    "not_found": "no such app",
    "request_timeout": "the request head was not received in time",
    "body_too_large": "the request body is too large",
    "too_many_requests": "too many connections or requests from this client",
    "too_many_held": "too many of this client's requests are waiting for an app to start",
    "too_many_tunnels": "too many WebSocket connections from this client",
    "headers_too_large": "the request headers are too large",
    "upgrade_not_supported": "protocol upgrades other than WebSocket are not supported",
    "transfer_coding_not_supported": "only the chunked transfer coding is supported",
    "version_not_supported": "only HTTP/1.0 and HTTP/1.1 are served",
    "bad_gateway": "the app failed to answer the request",
    "image_unavailable": "the app's image is not available",
    "queue_full": "too many requests are waiting for this app",
    "tunnels_full": "the app holds as many WebSocket connections as it may",
    "edge_full": "too many requests are waiting",
    "no_capacity": "no capacity to start the app",
    "start_failed": "the app failed to start",
    "auto_start_off": "the app has no running machine",
    "shutting_down": "the edge is shutting down",
    "wake_failed": "the app could not be started",
    "hold_timeout": "the app did not become ready in time",
    "deadline": "the app did not start in time",
    "upstream_timeout": "the app did not answer in time",
}
INTERNAL_ERROR = "internal error"  # the message of a code missing from MESSAGES
RETRY_AFTER = frozenset(
    {"queue_full", "tunnels_full", "edge_full", "no_capacity", "start_failed", "auto_start_off",
     "shutting_down", "wake_failed", "too_many_requests", "too_many_held",
     "too_many_tunnels"}
)


class EdgeError(Exception):
    """An IO failure translated at an adapter edge; `code` is a key of STATUS, `message`
    the detail for the log."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status_of(code: str) -> int:
    return STATUS.get(code, 500)


@functools.lru_cache(maxsize=128)  # (every answer to a refused or failed request: each
def reason_phrase(status: int) -> bytes:  # computed once, not per answer)
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Unknown"


# gRPC status codes for HTTP statuses (grpc/doc/http-grpc-status-mapping.md), and for a
# few of the edge's own codes a closer one
GRPC_BY_STATUS = {400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14}
GRPC_BY_CODE = {"hold_timeout": 4, "queue_full": 8, "edge_full": 8, "too_many_held": 8,
                "body_too_large": 8, "upgrade_not_supported": 12}
GRPC_UNKNOWN = 2
GRPC_CONTENT_TYPE = b"content-type: application/grpc"


def is_grpc(forward: bytes) -> bool:
    """Whether a request's passed-on header lines say it is a gRPC call (HTTP/2's are
    lower-case)."""
    return GRPC_CONTENT_TYPE in forward


@functools.lru_cache(maxsize=256)
def grpc_error_trailers(code: str) -> tuple[tuple[bytes, bytes], ...]:
    """The trailers of the edge's answer for `code` to a gRPC call (its head is 200 and
    `content-type: application/grpc`): `grpc-status` and the fixed message,
    percent-encoded as gRPC asks."""
    status = GRPC_BY_CODE.get(code, GRPC_BY_STATUS.get(status_of(code), GRPC_UNKNOWN))
    message = MESSAGES.get(code, INTERNAL_ERROR).encode()
    encoded = b"".join(bytes([c]) if 0x20 <= c <= 0x7e and c != 0x25 else b"%%%02X" % c
                       for c in message)
    return ((b"grpc-status", b"%d" % status), (b"grpc-message", encoded))


@functools.lru_cache(maxsize=256)  # the codes are the edge's own, a few dozen
def error_body(code: str) -> bytes:
    return json.dumps({"error": code, "message": MESSAGES.get(code, INTERNAL_ERROR)}).encode()


def error_response(
    code: str,
    detail: str = "",
    *,
    keep_alive: bool,
    retry_after_s: int = 1,
    extra_headers: bytes = b"",
    head_request: bool = False,
) -> bytes:
    """A whole HTTP/1.1 answer for `code`; `extra_headers` are complete CRLF-ended lines.
    The body says the code and its fixed message only: `detail` is never sent (whoever
    knows the app and request logs it). The answer to a HEAD request has the
    Content-Length of the body but not the body."""
    status = status_of(code)
    body = error_body(code)
    lines = [
        b"HTTP/1.1 %d %s\r\n" % (status, reason_phrase(status)),
        b"Content-Type: application/json\r\n",
        b"Content-Length: %d\r\n" % len(body),
        b"Connection: keep-alive\r\n" if keep_alive else b"Connection: close\r\n",
    ]
    if code in RETRY_AFTER:
        lines.append(b"Retry-After: %d\r\n" % retry_after_s)
    lines.append(extra_headers)
    lines.append(b"\r\n")
    if not head_request:
        lines.append(body)
    return b"".join(lines)
