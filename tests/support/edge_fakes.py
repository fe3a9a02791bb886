"""Fakes for edge tests: a stdlib HTTP backend (run as a real process) and a fake
placement that implements the wake and autostop contracts by launching them.

Backend: `python -m tests.support.edge_fakes PORT MACHINE_ID`. Routes:
`/` hello, `/accepts` connections accepted so far, `/requests` requests read so far
(this one included), `/headers` the request headers as JSON, `/sha256` (POST) hex
digest of the body (Content-Length or chunked), `/stream?bytes=N` a chunked body of N
pattern bytes, `/sleep?ms=N`, `/trailers` (GET: a chunked body "abc" with an
`X-Checksum` trailer; POST: the request's trailer lines as the body).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import msgspec
from aiohttp import web

from ground.auth.aiohttp_glue import refusal
from ground.auth.signing import Verifier
from placement.api import (
    AutostopRequest,
    SuspectAnswer,
    SuspectReport,
    WakeRequest,
    WakeResponse,
    WakeTimings,
    WokenMachine,
)
from tests.support.credentials import RING
from tests.support.ports import free_port

if TYPE_CHECKING:
    from edge.service import Edge

ROOT = Path(__file__).resolve().parents[2]
BLOCK = bytes(range(256)) * 256  # 64 KiB


def pattern_sha256(size: int) -> str:
    """The digest of `/stream?bytes=size`."""
    digest = hashlib.sha256()
    left = size
    while left:
        piece = BLOCK[: min(left, len(BLOCK))]
        digest.update(piece)
        left -= len(piece)
    return digest.hexdigest()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    accepts = 0
    requests = 0
    machine_id = ""

    def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
        type(self).accepts += 1
        super().process_request(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Machine", self.server.machine_id)
        self.end_headers()
        self.wfile.write(body)

    def _body_chunks(self):  # type: ignore[no-untyped-def]
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.request_trailers = b""
                    while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                        self.request_trailers += line
                    return
                left = size
                while left:
                    piece = self.rfile.read(min(left, 65536))
                    left -= len(piece)
                    yield piece
                self.rfile.readline()
        left = int(self.headers.get("Content-Length", "0"))
        while left:
            piece = self.rfile.read(min(left, 65536))
            if not piece:
                return
            left -= len(piece)
            yield piece

    def parse_request(self) -> bool:
        _Server.requests += 1
        return super().parse_request()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        if parts.path == "/accepts":
            self._send(200, str(_Server.accepts).encode())
        elif parts.path == "/requests":
            self._send(200, str(_Server.requests).encode())
        elif parts.path == "/headers":
            body = json.dumps([[k, v] for k, v in self.headers.items()]).encode()
            self._send(200, body, "application/json")
        elif parts.path == "/stream":
            self._stream(int(query.get("bytes", "0")))
        elif parts.path == "/trailers":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "X-Checksum")
            self.end_headers()
            self.wfile.write(b"3\r\nabc\r\n0\r\nX-Checksum: 900150983cd24fb0\r\n\r\n")
        elif parts.path == "/crash":  # a request of death: the machine dies unanswering
            os._exit(3)
        elif parts.path == "/sleep":
            time.sleep(int(query.get("ms", "0")) / 1000)
            self._send(200, b"slept")
        elif parts.path == "/header":  # an answer with one header of the caller's choosing
            self.send_response(200)
            self.send_header(query["name"], query["value"])
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send(200, f"hello from {self.server.machine_id}".encode())

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "11")
        self.end_headers()

    def do_POST(self) -> None:
        digest = hashlib.sha256()
        self.request_trailers = b""
        for piece in self._body_chunks():
            digest.update(piece)
        if urlsplit(self.path).path == "/trailers":
            self._send(200, self.request_trailers)
            return
        self._send(200, digest.hexdigest().encode())

    def _stream(self, size: int) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        left = size
        while left:
            piece = BLOCK[: min(left, len(BLOCK))]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            left -= len(piece)
        self.wfile.write(b"0\r\n\r\n")


def serve(port: int, machine_id: str) -> None:
    server = _Server(("127.0.0.1", port), _Handler)
    server.machine_id = machine_id
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    server.serve_forever()


# -- processes -------------------------------------------------------------------------


def start_backend(machine_id: str, port: int | None = None, kind: str = "fake",
                  ) -> tuple[subprocess.Popen[bytes], int]:
    """A backend process: this module's (`kind` "fake"), examples/hello ("hello"), or a
    gRPC server (tests/support/grpc_app.py, "grpc")."""
    port = port or free_port()
    if kind == "hello":
        command = [sys.executable, str(ROOT / "examples/hello/app.py")]
    elif kind == "grpc":
        command = [sys.executable, "-m", "tests.support.grpc_app"]
    else:
        command = [sys.executable, "-m", "tests.support.edge_fakes", str(port), machine_id]
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PORT": str(port), "THAW_MACHINE_ID": machine_id},
    )
    return proc, port


async def wait_port_async(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"port {port} did not open") from None
            await asyncio.sleep(0.02)
        else:
            writer.close()
            return


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """`app` listening on a free loopback port: its runner (to clean up) and its URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


@dataclass
class FakePlacement:
    """Wake: start `count` backends (or fail as told); autostop: stop it (or keep it: 409)."""

    wake_delay_s: float = 0.0
    wake_error: tuple[int, str] | None = None  # (status, code) to answer instead
    wake_error_message: str = ""  # the message of that answer ("fake {code}" when empty)
    autostop_status: int = 200
    wakes: list[int] = field(default_factory=list)
    wakes_in_flight: int = 0
    max_wakes_in_flight: int = 0
    autostops: list[str] = field(default_factory=list)
    suspects: list[tuple[str, SuspectReport]] = field(default_factory=list)
    fail_suspects: bool = False  # answer that a reported worker is failed
    backend: str = "fake"  # what a woken machine runs: "fake", "hello" or "grpc"
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    url: str = ""
    unsigned: int = 0  # calls refused for want of a valid signature
    verifier: Verifier = field(default_factory=lambda: Verifier(RING))
    _runner: web.AppRunner | None = None
    _count: int = 0
    _closing: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> str:
        app = web.Application(middlewares=[self._signed])
        app.add_routes([
            web.post("/internal/apps/{app}/wake", self._wake),
            web.post("/internal/apps/{app}/machines/{id}/autostop", self._autostop),
            web.post("/internal/workers/{worker}/suspect", self._suspect),
        ])
        self._runner, self.url = await serve_app(app)
        return self.url

    @web.middleware
    async def _signed(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Like placement: an unsigned call is 401 (so the edge's calls must be signed)."""
        if await refusal(self.verifier, request) is not None:
            self.unsigned += 1
            return web.json_response({"error": "unauthorized", "message": "unsigned"},
                                     status=401)
        response: web.StreamResponse = await handler(request)
        return response

    async def _wake(self, request: web.Request) -> web.Response:
        body = msgspec.json.decode(await request.read(), type=WakeRequest)
        self.wakes_in_flight += 1
        self.max_wakes_in_flight = max(self.max_wakes_in_flight, self.wakes_in_flight)
        try:
            self.wakes.append(body.count)
            if self.wake_delay_s:  # cut short by close(), so a long delay never holds it up
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closing.wait(), self.wake_delay_s)
            if self.wake_error is not None:
                status, code = self.wake_error
                message = self.wake_error_message or f"fake {code}"
                return web.json_response({"error": code, "message": message}, status=status)
            began = time.monotonic()
            machines = await asyncio.gather(*(self._boot(request.match_info["app"])
                                              for _ in range(body.count)))
            boot_ms = (time.monotonic() - began) * 1000
            answer = WakeResponse(machines=list(machines),
                                  timings=WakeTimings(place_ms=1.0, pull_ms=0.0, boot_ms=boot_ms))
            return web.Response(body=msgspec.json.encode(answer), content_type="application/json")
        finally:
            self.wakes_in_flight -= 1

    async def _boot(self, app: str) -> WokenMachine:
        self._count += 1
        machine_id = f"{app}-m{self._count}"
        proc, port = start_backend(machine_id, kind=self.backend)
        self.procs[machine_id] = proc
        await wait_port_async(port)
        return WokenMachine(id=machine_id, address=f"127.0.0.1:{port}", worker="w-fake")

    async def _suspect(self, request: web.Request) -> web.Response:
        report = msgspec.json.decode(await request.read(), type=SuspectReport)
        worker = request.match_info["worker"]
        self.suspects.append((worker, report))
        answer = SuspectAnswer(worker=worker, failed=self.fail_suspects, reason="fake")
        return web.Response(body=msgspec.json.encode(answer), content_type="application/json")

    async def _autostop(self, request: web.Request) -> web.Response:
        msgspec.json.decode(await request.read(), type=AutostopRequest)
        machine_id = request.match_info["id"]
        self.autostops.append(machine_id)
        if self.autostop_status != 200:
            return web.json_response({"error": "kept", "message": "min running"},
                                     status=self.autostop_status)
        proc = self.procs.pop(machine_id, None)
        if proc is not None:
            await asyncio.to_thread(stop_process, proc)
        return web.json_response({"id": machine_id, "state": "stopped"})

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
        for proc in self.procs.values():
            await asyncio.to_thread(stop_process, proc)
        self.procs.clear()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])


# -- an edge under test, in this event loop -----------------------------------------------


@dataclass
class EdgeHarness:
    """An EdgeRuntime on the test's loop, a MemoryRegistry and a FakePlacement."""

    placement: FakePlacement
    registry: object
    runtime: object
    backends: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.runtime.proxy_port  # type: ignore[attr-defined,no-any-return]

    @property
    def admin_port(self) -> int:
        return self.runtime.admin_port  # type: ignore[attr-defined,no-any-return]

    @property
    def shell(self) -> Edge:
        """The edge's shell (its config, client table, view), for what a test reads."""
        return self.runtime.edge  # type: ignore[attr-defined,no-any-return]

    async def __aenter__(self) -> EdgeHarness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def state(self) -> dict[str, object]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.admin_port)
        writer.write(b"GET /v1/state HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        data = await reader.read()
        writer.close()
        return json.loads(data.split(b"\r\n\r\n", 1)[1])  # type: ignore[no-any-return]

    async def add_machine(self, app: str, machine_id: str, port: int | None = None,
                          start: bool = True, worker: str = "w-test") -> int:
        """Publish a started machine to the registry (a real backend unless start=False)."""
        from ground.registry.types import MachineRecord

        if start:
            proc, port = start_backend(machine_id, port)
            self.backends.append(proc)
            await wait_port_async(port)
        port = port or free_port()
        now = time.time()
        await self.registry.put_machine(MachineRecord(  # type: ignore[attr-defined]
            id=machine_id, app=app, worker=worker, region="local", state="started",
            image_digest="", created_at=now, updated_at=now, address=f"127.0.0.1:{port}",
        ))
        return port

    async def close(self) -> None:
        await self.runtime.stop()  # type: ignore[attr-defined]
        await self.placement.close()
        for proc in self.backends:
            await asyncio.to_thread(stop_process, proc)


async def start_edge(apps: list[dict[str, object]], placement: FakePlacement | None = None,
                     registry: object = None, board: object = None,
                     **config: object) -> EdgeHarness:
    """`registry`: one shared with other edges (default: a new MemoryRegistry); `board`:
    where the edge shares its loads with them (edge/loadshare.py)."""
    from edge.config import EdgeConfig
    from edge.runner import EdgeRuntime
    from ground.appconfig import parse
    from ground.registry.memory import MemoryRegistry

    placement = placement or FakePlacement()
    url = await placement.start()
    registry = registry or MemoryRegistry()
    for app in apps:
        await registry.put_app(parse({"image": "example/hello:v1", **app}))  # type: ignore[attr-defined]
    settings: dict[str, object] = {"port": 0, "shutdown_grace_s": 1.0, "cluster_keys": RING,
                                   **config}
    runtime = EdgeRuntime(EdgeConfig(placement_url=url, **settings), registry,  # type: ignore[arg-type]
                          board=board)  # type: ignore[arg-type]
    try:
        await runtime.start()
    except BaseException:
        await placement.close()
        raise
    return EdgeHarness(placement, registry, runtime)


async def start_warm_edge(**config: object) -> EdgeHarness:
    """An edge serving app `web` (also as `www.example.test`) from one started machine,
    `web-m1`, already in its view."""
    harness = await start_edge([{"name": "web", "hosts": ["www.example.test"]}], **config)
    try:
        await harness.add_machine("web", "web-m1")
        deadline = time.monotonic() + 5
        while not (await harness.state())["apps"]["web"]["machines"]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the machine never reached the view"
            await asyncio.sleep(0.02)
    except BaseException:
        await harness.close()
        raise
    return harness


def split_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status, headers by lower-case name, the rest) of a raw answer."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(lines[0].split()[1]), headers, body


async def exchange_raw(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """Send raw bytes, read until the edge closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()
