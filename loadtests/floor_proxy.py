"""The floor: the least a Python reverse proxy on uvloop + httptools can do per request.

    .venv/bin/python loadtests/floor_proxy.py --port P --backend 127.0.0.1:B

A calibration point for `bench_warm.py`, not a product: it parses requests and
responses with httptools, rebuilds the request head (Host, X-Forwarded-For),
forwards Content-Length bodies only, and keeps one keep-alive upstream
connection per client connection. No routing, limits, timeouts, hold queue,
metrics or error handling. What the edge costs above this line is the price of
its features; what this costs against nginx is the price of Python.
"""

from __future__ import annotations

import argparse
import asyncio

import httptools
import uvloop


class Upstream(asyncio.Protocol):
    def __init__(self, client: Client) -> None:
        self.client = client
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.headers: list[bytes] = []
        self.pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.pending:
            self.transport.write(self.pending)  # type: ignore[union-attr]
            self.pending = b""

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.upstream = None
        if self.client.transport is not None:
            self.client.transport.close()

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.headers = [b"HTTP/1.1 %d OK\r\n" % 200]

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers += (name, b": ", value, b"\r\n")

    def on_headers_complete(self) -> None:
        self.headers[0] = b"HTTP/1.1 %d OK\r\n" % self.parser.get_status_code()
        self.headers.append(b"\r\n")

    def on_body(self, body: bytes) -> None:
        self.headers.append(body)

    def on_message_complete(self) -> None:
        assert self.client.transport is not None
        self.client.transport.write(b"".join(self.headers))


class Client(asyncio.Protocol):
    def __init__(self, backend: tuple[str, int]) -> None:
        self.backend = backend
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.upstream: Upstream | None = None
        self.connecting: asyncio.Task[object] | None = None
        self.url = b""
        self.parts: list[bytes] = []
        self.peer = b"127.0.0.1"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url = b""
        self.parts = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in (b"connection", b"keep-alive"):
            self.parts += (name, b": ", value, b"\r\n")

    def on_headers_complete(self) -> None:
        method = self.parser.get_method()
        self.parts[:0] = [method, b" ", self.url, b" HTTP/1.1\r\n"]
        self.parts += (b"X-Forwarded-For: ", self.peer, b"\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self.parts.append(body)

    def on_message_complete(self) -> None:
        request = b"".join(self.parts)
        upstream = self.upstream
        if upstream is None:
            upstream = self.upstream = Upstream(self)
            upstream.pending = request
            loop = asyncio.get_running_loop()
            self.connecting = loop.create_task(
                loop.create_connection(lambda: upstream, *self.backend))
        elif upstream.transport is None:
            upstream.pending += request
        else:
            upstream.transport.write(request)


async def serve(port: int, backend: tuple[str, int]) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(backend), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", required=True, help="host:port")
    args = parser.parse_args()
    host, _, port = args.backend.rpartition(":")
    uvloop.run(serve(args.port, (host, int(port))))


if __name__ == "__main__":
    main()
