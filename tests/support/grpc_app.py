"""A real gRPC server (grpcio) for the h2c machine tests: `python -m tests.support.grpc_app`
listens on $PORT and serves `thaw.test.Probe` with raw bytes as messages (no protobuf):

- `Say` (unary): b"echo:" + the request; its trailing metadata `x-machine` names the
  machine ($THAW_MACHINE_ID);
- `Headers` (unary): the call's metadata as JSON (what the edge passed on);
- `Count` (server streaming): the request is a count N, the answer N messages b"0"…;
- `Chat` (bidirectional): b"re:" + each message, as it comes;
- `Upload` (client streaming): the SHA-256 (hex) of every message's bytes in order;
- `Download` (server streaming): the request is "N SIZE": N messages of SIZE bytes of
  tests.support.edge_fakes' pattern;
- `Fail` (unary): INVALID_ARGUMENT, "bad input", trailing metadata `x-detail: why`;
- `Slow` (unary): waits until its call is cancelled (or 30 s), counting cancels;
- `Cancels` (unary): how many `Slow` calls were cancelled so far;

and `grpc.health.v1.Health/Check` (the gRPC health protocol, by hand): SERVING, or
NOT_SERVING when $THAW_TEST_NOT_SERVING is set.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc

from tests.support.edge_fakes import BLOCK

SERVICE = "thaw.test.Probe"
_cancels = 0
_lock = threading.Lock()


def say(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.set_trailing_metadata((("x-machine", os.environ.get("THAW_MACHINE_ID", "")),))
    return b"echo:" + request


def headers(request: bytes, context: grpc.ServicerContext) -> bytes:
    return json.dumps(dict(context.invocation_metadata())).encode()


def count(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    for i in range(int(request)):
        yield b"%d" % i


def chat(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    for message in requests:
        yield b"re:" + message


def upload(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
    digest = hashlib.sha256()
    for message in requests:
        digest.update(message)
    return digest.hexdigest().encode()


def download(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    n, size = (int(x) for x in request.split())
    for _ in range(n):
        yield (BLOCK * (size // len(BLOCK) + 1))[:size]


def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.set_trailing_metadata((("x-detail", "why"),))
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad input")
    raise AssertionError("abort returns never")


def slow(request: bytes, context: grpc.ServicerContext) -> bytes:
    done = threading.Event()

    def cancelled() -> None:
        global _cancels
        if not context.is_active():
            with _lock:
                _cancels += 1
        done.set()

    context.add_callback(cancelled)
    done.wait(30)
    return b"late"


def cancels(request: bytes, context: grpc.ServicerContext) -> bytes:
    with _lock:
        return b"%d" % _cancels


def health_check(request: bytes, context: grpc.ServicerContext) -> bytes:
    """HealthCheckResponse{status: SERVING (1) or NOT_SERVING (2)}."""
    return b"\x08\x02" if os.environ.get("THAW_TEST_NOT_SERVING") else b"\x08\x01"


def main() -> None:
    unary, stream = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler
    handlers: dict[str, Any] = {
        "Say": unary(say), "Headers": unary(headers), "Fail": unary(fail),
        "Slow": unary(slow), "Cancels": unary(cancels),
        "Count": stream(count), "Download": stream(download),
        "Chat": grpc.stream_stream_rpc_method_handler(chat),
        "Upload": grpc.stream_unary_rpc_method_handler(upload),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                         handlers=[grpc.method_handlers_generic_handler(SERVICE, handlers),
                  grpc.method_handlers_generic_handler("grpc.health.v1.Health",
                                                       {"Check": unary(health_check)})],
                         options=[("grpc.so_reuseport", 0)])
    server.add_insecure_port(f"127.0.0.1:{os.environ['PORT']}")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop(0)


if __name__ == "__main__":
    main()
