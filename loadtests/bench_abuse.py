"""Abuse benchmark (issue 26): one client attacks the edge while another's steady warm load
is measured beside it.

    .venv/bin/python loadtests/bench_abuse.py [--seconds 10] [--rate 200]
        [--attacks idle-conns,rapid-reset,made-you-reset,hold-flood,ws-idle,tls-aborts]
        [--pin | --isolate] [--rounds N] [--edge-args "--nft-table thaw_bench"] [--no-write]

Every process is separate and on loopback: a Redis (the edge's registry), a fixtures
process (this script with `--fixtures`: an asyncio backend answering `200 ok` and
WebSocket upgrades, and a fake placement whose wakes answer at once with that backend —
except app `flood`'s, which it holds until it stops), `thaw edge` (native build, HTTPS on
its own port with a certificate from thaw/localca.py) and, per attack, an attacker (this
script with `--attack NAME`) bound to its own loopback source address, so the edge's
per-client limits see another client than the warm load from 127.0.0.1.

`--pin` gives the edge a core of its own (taskset: CPU 1) and keeps everything else on
CPU 0, the attackers at nice 19: on a 2-core machine the attacker's own CPU then does not
take the edge's core. Without it nothing is pinned. Even pinned, the attack is not the
edge's work alone: the kernel's work for the attacker's connections (loopback packets
are processed on the sender's CPU) lands on CPU 0 beside the warm load and the backend.
So a second load as large, *direct*, goes from the same process straight to the backend
(no edge) throughout: its p99 under an attack against its own baselines is what the
attack costs the measuring side, whatever the edge does.

`--isolate` pins as `--pin` does but runs the attackers on CPU 1 beside the edge at
SCHED_IDLE (`chrt --idle 0`): their own work, user and kernel, then takes only the CPU
the edge leaves, and CPU 0 (the warm load, the backend) carries none of the attack — the
nearest a 2-core machine comes to an attacker on another host. The direct load shows
whether it did.

Phases, interleaved: baseline, attack 1, 10 s cool-down, baseline, attack 2, ...,
baseline; with `--rounds N` the attacks N times over, and each attack is judged by the
median over rounds of its p99 ÷ the p99 of the two baselines beside it. An attacker's
connects end with its phase even when the kernel drops its SYNs (`--nft-table`). The
warm load (`--rate` GETs/s to app `web` over keep-alive connections, open loop: each
request is sent on schedule, on an idle connection or a new one; 5 s timeout) runs
throughout; each phase reports the requests sent in it. A cold start (a
GET to a fresh app with no machine) is made from 127.0.0.1 every 2 s in baselines and in
hold-flood. The edge's RSS (/proc/PID/status VmRSS) is read every 0.25 s: before the
phase, its max during it, and 10 s after an attack ends. Each phase stops by itself;
every process started is stopped by PID.

Attacks (each `--seconds` long):
- idle-conns (127.0.0.2): 5,000 connections, each sends one GET and then sits idle;
- rapid-reset (127.0.0.3): 4 tasks sending HEADERS + RST_STREAM(CANCEL) on h2c as fast
  as they can, reconnecting on GOAWAY or close;
- made-you-reset (127.0.0.4): 4 tasks making the edge reset streams — HEADERS with
  END_STREAM then DATA on it (STREAM_CLOSED), or a header name in upper case
  (PROTOCOL_ERROR), alternated — reconnecting on GOAWAY or close;
- hold-flood (127.0.0.5): 20 h2c connections open 100 streams each to app `flood`
  (max_pending 100000; no machine; its wake never answers, so the requests are held);
  each stream answered (503 queue_full past the app's share) is sent again after its
  Retry-After (1 s), so the queue is kept full;
- ws-idle (127.0.0.6): 2,000 WebSocket upgrades to `web`, left idle once tunnelled;
- tls-aborts (127.0.0.7): 4 tasks: connect to the TLS port, send half a ClientHello,
  close, again.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.benchlib import (
    cpu_s,
    free_port,
    key_file,
    machine_line,
    median,
    percentile,
    process,
    wait_port,
    write_section,
)

ATTACKS = ("idle-conns", "rapid-reset", "made-you-reset", "hold-flood", "ws-idle",
           "tls-aborts")
SOURCES = {name: f"127.0.0.{i + 2}" for i, name in enumerate(ATTACKS)}
DOMAIN = "localhost"
COOLDOWN_S = 10.0
RETRY_AFTER_S = 1.0  # hold-flood: an answered stream is sent again after Retry-After
COLD_EVERY_S = 2.0
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
SCRIPT = str(Path(__file__).resolve())
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


# -- the fixtures process: backend + fake placement -----------------------------------------


async def backend_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """HTTP/1.1 keep-alive `200 ok`; a WebSocket upgrade gets 101 and is then read until
    closed (nothing is echoed: the attack leaves it idle)."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if length:
                await reader.readexactly(length)
            if headers.get("upgrade", "").lower() == "websocket":
                key = headers.get("sec-websocket-key", "").encode()
                accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
                writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept +
                             b"\r\n\r\n")
                while await reader.read(65536):
                    pass
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Type: text/plain"
                         b"\r\n\r\nok\n")
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def fixtures(backend_port: int, placement_port: int) -> None:
    import msgspec
    from aiohttp import web

    from placement.api import WakeResponse, WakeTimings, WokenMachine

    closing = asyncio.Event()
    woken = 0

    async def wake(request: web.Request) -> web.Response:
        nonlocal woken
        await request.read()
        app = request.match_info["app"]
        if app == "flood":  # never ready: held requests stay held until they leave
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing.wait(), 3600)
            return web.json_response({"error": "no_capacity", "message": "fake"}, status=503)
        woken += 1
        answer = WakeResponse(machines=[WokenMachine(
            id=f"{app}-m{woken}", address=f"127.0.0.1:{backend_port}", worker="w-bench")],
            timings=WakeTimings(place_ms=1.0))
        return web.Response(body=msgspec.json.encode(answer), content_type="application/json")

    async def autostop(request: web.Request) -> web.Response:
        return web.json_response({"id": request.match_info["id"], "state": "stopped"})

    server = await asyncio.start_server(backend_conn, "127.0.0.1", backend_port, backlog=4096)
    app = web.Application()
    app.add_routes([web.post("/internal/apps/{app}/wake", wake),
                    web.post("/internal/apps/{app}/machines/{id}/autostop", autostop)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", placement_port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    closing.set()
    await runner.cleanup()
    server.close()


# -- HTTP/2 frames (the attacker's, by hand: no library between it and the wire) -----------


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def request_block(host: str, *, bad: bool = False) -> bytes:
    """GET / over http with `:authority` host (static indexes, literals not indexed: no
    dynamic table on either side); `bad` adds a header whose name is upper case."""
    raw = host.encode()
    block = b"\x82\x86\x84\x01" + bytes([len(raw)]) + raw
    if bad:
        block += b"\x00\x05X-Bad\x01x"
    return block


H2_OPEN = PREFACE + frame(4, 0, 0, struct.pack(">HI", 4, 2**31 - 1)) + \
    frame(8, 0, 0, struct.pack(">I", 2**31 - 1 - 65535))  # windows wide open
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


@dataclass
class Tally:
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(port: int, source: str, tally: Tally, until: float) -> Stream | None:
    """A connection from `source`, or None (counted): refused, or not made before the
    attack's end (a SYN the kernel dropped — `--nft-table` — is sent again a second later
    and may wait minutes: an attacker stops on time all the same)."""
    try:
        return await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)),
            max(0.05, until - time.monotonic()))
    except TimeoutError:
        tally.add("connect_timeouts")
    except OSError:
        tally.add("connect_errors")
    return None


class H2Conn:
    """An h2c connection from `source`; `closed` is set on GOAWAY or EOF."""

    def __init__(self, tally: Tally, on_headers: Any = None) -> None:
        self.tally = tally
        self.closed = asyncio.Event()
        self.on_headers = on_headers
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None

    async def open(self, port: int, source: str, until: float) -> bool:
        made = await connect(port, source, self.tally, until)
        if made is None:
            return False
        reader, self.writer = made
        self.tally.add("connections")
        self.writer.write(H2_OPEN)
        self.reader_task = asyncio.create_task(self._read(reader))
        return True

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            first = await reader.readexactly(9)
            if not first.startswith(b"\x00\x00") or first[3] not in range(10):
                self.tally.add("refused_http1")  # the HTTP/1 door's 429: refused at once
                return
            head = first
            while True:
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = await reader.readexactly(length) if length else b""
                if kind == 7:
                    self.tally.add("goaway")
                    return
                if kind == 4 and not flags & ACK and self.writer is not None:
                    self.writer.write(frame(4, ACK, 0))
                elif kind == 3:
                    self.tally.add("edge_resets")
                elif kind == 1 and self.on_headers is not None:
                    self.on_headers(stream, flags, payload)
                head = await reader.readexactly(9)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self.tally.add("closed_by_edge")
        finally:
            self.closed.set()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.reader_task is not None:
            self.reader_task.cancel()


async def reset_loop(port: int, source: str, until: float, tally: Tally, made: bool) -> None:
    good = request_block(f"web.{DOMAIN}")
    bad = request_block(f"web.{DOMAIN}", bad=True)
    while time.monotonic() < until:
        conn = H2Conn(tally)
        if not await conn.open(port, source, until):
            await asyncio.sleep(0.001)
            continue
        stream = 1
        try:
            while not conn.closed.is_set() and time.monotonic() < until and stream < 2**30:
                batch = []
                for _ in range(20):
                    if not made:  # rapid reset: open, cancel at once
                        batch.append(frame(1, END_HEADERS | END_STREAM, stream, good))
                        batch.append(frame(3, 0, stream, struct.pack(">I", 8)))
                    elif stream % 4 == 1:  # the edge must reset: DATA after END_STREAM
                        batch.append(frame(1, END_HEADERS | END_STREAM, stream, good))
                        batch.append(frame(0, 0, stream, b"x"))
                    else:  # the edge must reset: a malformed request
                        batch.append(frame(1, END_HEADERS | END_STREAM, stream, bad))
                    stream += 2
                assert conn.writer is not None
                conn.writer.write(b"".join(batch))
                tally.add("streams_written", 20)
                await conn.writer.drain()
                await asyncio.sleep(0)
        except (ConnectionError, OSError):
            tally.add("write_errors")
        finally:
            conn.close()


async def attack_resets(port: int, source: str, seconds: float, made: bool) -> Tally:
    tally = Tally()
    until = time.monotonic() + seconds
    await asyncio.gather(*(reset_loop(port, source, until, tally, made) for _ in range(4)))
    return tally


Kept = list[Stream]


async def http1_open(port: int, source: str, request: bytes, tally: Tally, keep: Kept,
                     until: float) -> None:
    made = await connect(port, source, tally, until)
    if made is None:
        return
    reader, writer = made
    try:
        writer.write(request)
        async with asyncio.timeout(5):
            status, close, _ = await read_answer(reader, body=False)
            if status != 101:
                await read_body(reader, close)
        tally.add(f"status_{status}")
        if status in (200, 101) and close >= 0:
            keep.append((reader, writer))
            return
    except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError, IndexError):
        tally.add("no_answer")
    writer.close()


async def attack_idle(port: int, source: str, seconds: float, count: int,
                      request: bytes) -> Tally:
    tally = Tally()
    until = time.monotonic() + seconds
    keep: Kept = []
    for start in range(0, count, 250):
        if time.monotonic() >= until:
            break
        await asyncio.gather(*(http1_open(port, source, request, tally, keep, until)
                               for _ in range(start, min(count, start + 250))))
    tally.add("held_open_after_setup", len(keep))
    await asyncio.sleep(max(0.0, until - time.monotonic()))
    tally.add("still_open_at_end", sum(1 for r, _ in keep if not r.at_eof()))
    for _, writer in keep:
        writer.close()
    return tally


async def attack_hold_flood(port: int, source: str, seconds: float) -> Tally:
    from hpack import Decoder

    tally = Tally()
    until = time.monotonic() + seconds
    block = request_block(f"flood.{DOMAIN}")

    async def one() -> None:
        decoder = Decoder()
        conn = H2Conn(tally)
        next_stream = [1]
        answered: asyncio.Queue[int] = asyncio.Queue()

        def on_headers(stream: int, flags: int, payload: bytes) -> None:
            if flags & 0x8:  # PADDED
                payload = payload[1:len(payload) - payload[0]]
            if flags & 0x20:  # PRIORITY
                payload = payload[5:]
            for name, value in decoder.decode(payload):
                if name == ":status":
                    tally.add(f"status_{value}")
            answered.put_nowait(stream)

        conn.on_headers = on_headers

        def again(was: H2Conn) -> None:
            if was is conn and not conn.closed.is_set() and time.monotonic() < until:
                open_stream()

        def open_stream() -> None:
            assert conn.writer is not None
            conn.writer.write(frame(1, END_HEADERS | END_STREAM, next_stream[0], block))
            next_stream[0] += 2
            tally.add("streams_opened")

        while time.monotonic() < until:
            if not await conn.open(port, source, until):
                await asyncio.sleep(0.05)
                continue
            for _ in range(100):
                open_stream()
            while not conn.closed.is_set() and time.monotonic() < until:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(answered.get(), until - time.monotonic())
                    asyncio.get_running_loop().call_later(RETRY_AFTER_S, again, conn)
            conn.close()
            conn = H2Conn(tally, on_headers)
            decoder = Decoder()
            next_stream[0] = 1

    await asyncio.gather(*(one() for _ in range(20)))
    return tally


def client_hello_part() -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=f"web.{DOMAIN}")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    return hello[: len(hello) // 2]


async def attack_tls(port: int, source: str, seconds: float) -> Tally:
    tally = Tally()
    until = time.monotonic() + seconds
    part = client_hello_part()

    async def loop() -> None:
        while time.monotonic() < until:
            made = await connect(port, source, tally, until)
            if made is None:
                await asyncio.sleep(0.001)
                continue
            _, writer = made
            writer.write(part)
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            tally.add("aborted_handshakes")

    await asyncio.gather(*(loop() for _ in range(4)))
    return tally


async def attack(name: str, port: int, tls_port: int, seconds: float) -> dict[str, int]:
    source = SOURCES[name]
    host = f"web.{DOMAIN}"
    if name == "idle-conns":
        request = f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        tally = await attack_idle(port, source, seconds, 5000, request)
    elif name == "ws-idle":
        key = base64.b64encode(os.urandom(16)).decode()
        request = (f"GET /ws HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\n"
                   f"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                   f"Sec-WebSocket-Key: {key}\r\n\r\n").encode()
        tally = await attack_idle(port, source, seconds, 2000, request)
    elif name in ("rapid-reset", "made-you-reset"):
        tally = await attack_resets(port, source, seconds, made=name == "made-you-reset")
    elif name == "hold-flood":
        tally = await attack_hold_flood(port, source, seconds)
    elif name == "tls-aborts":
        tally = await attack_tls(tls_port, source, seconds)
    else:
        raise SystemExit(f"unknown attack {name}")
    return tally.counts


# -- the warm load and the cold starts (127.0.0.1) -------------------------------------------


@dataclass
class Answer:
    started: float
    status: int  # 0: no answer within the timeout, or the connection failed
    seconds: float
    error: str = ""


async def read_answer(reader: asyncio.StreamReader, body: bool = True,
                      ) -> tuple[int, int, bytes]:
    """(status, -1 if the edge closes after it else the body's length, body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length, close = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "connection" and "close" in value.lower():
            close = True
    if not body:
        return status, -1 if close else length, b""
    data = await reader.readexactly(length) if length else b""
    return status, -1 if close else length, data


async def read_body(reader: asyncio.StreamReader, length: int) -> None:
    if length > 0:
        await reader.readexactly(length)


class WarmLoad:
    """`rate` GETs/s to `web` from 127.0.0.1, open loop, over keep-alive connections."""

    def __init__(self, port: int, rate: float, timeout_s: float = 5.0) -> None:
        self.port = port
        self.rate = rate
        self.timeout_s = timeout_s
        self.answers: list[Answer] = []
        self.cold: list[tuple[float, int, float, str]] = []  # (started, status, s, error)
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.request = f"GET / HTTP/1.1\r\nHost: web.{DOMAIN}\r\n\r\n".encode()
        self.stopping = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.stale = 0  # requests sent again after a kept-alive connection was found closed

    async def run(self) -> None:
        interval = 1.0 / self.rate
        due = time.monotonic()
        while not self.stopping:
            due += interval
            task = asyncio.create_task(self.one(time.monotonic()))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)

    async def one(self, started: float) -> None:
        conn = None
        try:
            async with asyncio.timeout(self.timeout_s):
                reused = bool(self.idle)
                if reused:
                    conn = self.idle.pop()
                else:
                    conn = await asyncio.open_connection("127.0.0.1", self.port,
                                                         local_addr=("127.0.0.1", 0))
                reader, writer = conn
                writer.write(self.request)
                try:
                    status, close, _ = await read_answer(reader)
                except asyncio.IncompleteReadError as exc:
                    if not reused or exc.partial:
                        raise
                    # a kept-alive connection the edge closed while it sat idle (its
                    # idle timeout): sent again on a new one, as HTTP clients do for an
                    # idempotent request (RFC 9112 9.3.1)
                    writer.close()
                    self.stale += 1
                    conn = await asyncio.open_connection("127.0.0.1", self.port,
                                                         local_addr=("127.0.0.1", 0))
                    reader, writer = conn
                    writer.write(self.request)
                    status, close, _ = await read_answer(reader)
            self.answers.append(Answer(started, status, time.monotonic() - started))
            if close < 0:
                writer.close()
            else:
                self.idle.append(conn)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            self.answers.append(Answer(started, 0, time.monotonic() - started,
                                       type(exc).__name__))
            if conn is not None:
                conn[1].close()

    async def cold_start(self, app: str) -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(15):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(f"GET / HTTP/1.1\r\nHost: {app}.{DOMAIN}\r\n"
                             "Connection: close\r\n\r\n".encode())
                status, _, body = await read_answer(reader)
                writer.close()
            error = ""
            if status != 200:
                with contextlib.suppress(ValueError):
                    error = json.loads(body).get("error", "")
            self.cold.append((started, status, time.monotonic() - started, error))
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            self.cold.append((started, 0, time.monotonic() - started, type(exc).__name__))

    async def stop(self) -> None:
        self.stopping = True
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=self.timeout_s + 1)
        for _, writer in self.idle:
            writer.close()


# -- the run ---------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@dataclass
class Phase:
    name: str
    began: float = 0.0
    ended: float = 0.0
    rss_before: int = 0
    rss_max: int = 0
    rss_after: int = 0  # 10 s after an attack; at the end of a baseline
    edge_cpu_s: float = 0.0
    attacker: dict[str, int] = field(default_factory=dict)
    held_max: int = 0  # the edge's /v1/state held_total, read every 0.25 s
    conns_max: int = 0  # and its open client connections
    edge_counts: dict[str, float] = field(default_factory=dict)  # /metrics deltas
    answers: list[Answer] = field(default_factory=list)
    # the same load straight to the backend, beside it: what the machine adds without an edge
    direct: list[Answer] = field(default_factory=list)
    cold: list[tuple[float, int, float, str]] = field(default_factory=list)
    stale: int = 0  # warm requests sent again: their kept-alive connection had closed

    def success(self) -> float:
        ok = sum(1 for a in self.answers if a.status == 200)
        return 100.0 * ok / max(1, len(self.answers))

    def latency_ms(self, q: float, direct: bool = False) -> float:
        ok = [a.seconds * 1000 for a in (self.direct if direct else self.answers)
              if a.status == 200]
        return percentile(ok, q) if ok else float("nan")


async def admin_get(port: int, path: str) -> bytes:
    async with asyncio.timeout(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
                     .encode())
        data = await reader.read()
        writer.close()
    return data.split(b"\r\n\r\n", 1)[1]


COUNTERS = ("thaw_edge_client_connections_refused_total",
            "thaw_edge_client_connections_cut_total", "thaw_edge_shed_total")


async def counters(port: int) -> dict[str, float]:
    """The edge's own counts of refused and cut connections and shed requests."""
    found: dict[str, float] = {}
    with contextlib.suppress(OSError, TimeoutError, IndexError):
        for line in (await admin_get(port, "/metrics")).decode().splitlines():
            if line.startswith(COUNTERS):
                name, _, value = line.rpartition(" ")
                found[name.replace("thaw_edge_", "")] = float(value)
    return found


async def sample(pid: int, admin_port: int, phase: Phase, until: asyncio.Event) -> None:
    while not until.is_set():
        phase.rss_max = max(phase.rss_max, rss_kib(pid))
        with contextlib.suppress(OSError, TimeoutError, ValueError, IndexError):
            state = json.loads(await admin_get(admin_port, "/v1/state"))
            phase.held_max = max(phase.held_max, int(state["held_total"]))
            phase.conns_max = max(phase.conns_max, int(state["connections"]))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(until.wait(), 0.25)


EDGE_CPU = ("taskset", "-c", "1")  # --pin: the edge's own core
NICE = ("nice", "-n", "19")  # --pin: attackers yield core 0 to the warm load
# --isolate: attackers on the edge's core at SCHED_IDLE, so their user and kernel work
# (loopback packets are processed on the sender's CPU) takes only what the edge leaves
EDGE_CORE_IDLE = ("taskset", "-c", "1", "chrt", "--idle", "0")


def attacker_prefix(args: argparse.Namespace) -> tuple[str, ...]:
    if args.isolate:
        return EDGE_CORE_IDLE
    return NICE if args.pin else ()


def placement_line(args: argparse.Namespace) -> str:
    if args.isolate:
        return ("the edge on CPU 1 with the attackers at SCHED_IDLE beside it, the warm "
                "load, backend and the rest on CPU 0)  ")
    if args.pin:
        return "the edge alone on CPU 1, everything else on CPU 0, attackers at nice 19)  "
    return "nothing pinned)  "

async def run_phase(phase: Phase, edge_pid: int, load: WarmLoad, direct: WarmLoad,
                    args: argparse.Namespace, ports: dict[str, int], work: Path,
                    cold_apps: list[str]) -> None:
    phase.rss_before = phase.rss_max = rss_kib(edge_pid)
    cpu_before = cpu_s(edge_pid)
    stale_before = load.stale
    done = asyncio.Event()
    counts_before = await counters(ports["admin"])
    sampler = asyncio.create_task(sample(edge_pid, ports["admin"], phase, done))
    phase.began = time.monotonic()
    colds: list[asyncio.Task[None]] = []

    async def cold_starts() -> None:
        while cold_apps:
            colds.append(asyncio.create_task(load.cold_start(cold_apps.pop(0))))
            await asyncio.sleep(COLD_EVERY_S)

    cold_task = (asyncio.create_task(cold_starts())
                 if phase.name == "baseline" or phase.name == "hold-flood" else None)
    if phase.name == "baseline":
        await asyncio.sleep(args.seconds)
    else:
        out = work / f"{phase.name}.json"
        child = await asyncio.create_subprocess_exec(
            *attacker_prefix(args), sys.executable, SCRIPT, "--attack", phase.name,
            "--edge-port", str(ports["edge"]), "--tls-port", str(ports["tls"]),
            "--seconds", str(args.seconds), "--out", str(out),
            start_new_session=True, stdout=subprocess.DEVNULL)
        try:
            await asyncio.wait_for(child.wait(), args.seconds + 30)
        except TimeoutError:
            print(f"{phase.name}: the attacker did not stop; killed", flush=True)
        finally:
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                await child.wait()
        with contextlib.suppress(OSError, ValueError):
            phase.attacker = json.loads(out.read_text())
    phase.ended = time.monotonic()
    if cold_task is not None:
        cold_task.cancel()
    phase.edge_cpu_s = cpu_s(edge_pid) - cpu_before
    phase.stale = load.stale - stale_before
    done.set()
    await sampler
    counts_after = await counters(ports["admin"])
    phase.edge_counts = {k: v - counts_before.get(k, 0.0) for k, v in counts_after.items()
                         if v - counts_before.get(k, 0.0)}
    if colds:
        await asyncio.wait(colds, timeout=20)
    if phase.name != "baseline":
        await asyncio.sleep(max(0.0, phase.ended + COOLDOWN_S - time.monotonic()))
    phase.rss_after = rss_kib(edge_pid)
    phase.answers = [a for a in load.answers if phase.began <= a.started < phase.ended]
    phase.direct = [a for a in direct.answers if phase.began <= a.started < phase.ended]
    phase.cold = [c for c in load.cold if phase.began <= c[0] < phase.ended]
    print(f"{phase.name:15s} warm {len(phase.answers)} req, {phase.success():.2f}% ok, "
          f"p50 {phase.latency_ms(50):.2f} ms p99 {phase.latency_ms(99):.2f} ms (direct "
          f"p99 {phase.latency_ms(99, direct=True):.2f} ms); RSS "
          f"{phase.rss_before / 1024:.1f}/{phase.rss_max / 1024:.1f}/"
          f"{phase.rss_after / 1024:.1f} MiB; edge CPU {phase.edge_cpu_s:.1f} s; "
          f"held max {phase.held_max}, connections max {phase.conns_max}; "
          f"cold {[c[1] for c in phase.cold]}; attacker {phase.attacker}; "
          f"edge {phase.edge_counts}", flush=True)


async def seed(redis_url: str, backend_port: int, cold_apps: list[str]) -> None:
    from ground.appconfig import parse
    from ground.registry.redis import RedisRegistry
    from ground.registry.types import MachineRecord

    registry = RedisRegistry(redis_url)
    limits = {"type": "requests", "soft_limit": 10000, "hard_limit": 10000}
    await registry.put_app(parse({"name": "web", "image": "bench:latest", "max_machines": 1,
                                  "auto_stop": "off", "concurrency": limits}))
    await registry.put_app(parse({"name": "flood", "image": "bench:latest", "max_machines": 1,
                                  "auto_stop": "off", "max_pending": 100000,
                                  "hold_timeout_s": 60, "concurrency": limits}))
    for app in cold_apps:
        await registry.put_app(parse({"name": app, "image": "bench:latest", "max_machines": 1,
                                      "auto_stop": "off"}))
    now = time.time()
    await registry.put_machine(MachineRecord(
        id="web-1", app="web", worker="w-bench", region="local", state="started",
        image_digest="", created_at=now, updated_at=now, address=f"127.0.0.1:{backend_port}",
    ))
    await registry.close()


async def measure(args: argparse.Namespace, work: Path, ports: dict[str, int],
                  edge_pid: int, cold_apps: list[str]) -> list[Phase]:
    load = WarmLoad(ports["edge"], args.rate)
    deadline = time.monotonic() + 20
    while True:  # the edge's view has the warm app
        probe = WarmLoad(ports["edge"], 1)
        await probe.one(time.monotonic())
        await probe.stop()
        if probe.answers[0].status == 200:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the warm app never answered 200: {probe.answers}")
        await asyncio.sleep(0.2)
    direct = WarmLoad(ports["backend"], args.rate)
    runners = [asyncio.create_task(load.run()), asyncio.create_task(direct.run())]
    await asyncio.sleep(2.0)  # warm-up: connections made, not measured
    phases: list[Phase] = []
    try:
        order = ["baseline"]
        for _ in range(args.rounds):
            for name in args.attacks:
                order += [name, "baseline"]
        for name in order:
            phase = Phase(name)
            await run_phase(phase, edge_pid, load, direct, args, ports, work, cold_apps)
            phases.append(phase)
    finally:
        for each in (load, direct):
            await each.stop()
        for runner in runners:
            runner.cancel()
    return phases


def beside_baselines(phases: list[Phase]) -> list[str]:
    """Per attack: its p99 ÷ the p99 of the baselines just before and after it (pooled),
    in each round, and the median over rounds — the drift of a long run (the machine's
    other jobs come and go) cancels out of a ratio to neighbours."""
    ratios: dict[str, list[float]] = {}
    for i, phase in enumerate(phases):
        if phase.name == "baseline" or i == 0 or i + 1 >= len(phases):
            continue
        around = Phase("baseline", answers=phases[i - 1].answers + phases[i + 1].answers)
        ratios.setdefault(phase.name, []).append(phase.latency_ms(99) / around.latency_ms(99))
    rows = ["| attack | p99 ÷ the baselines beside it, each round | median | p99 ≤ twice |",
            "|---|---|---|---|"]
    for name, each in ratios.items():
        middle = median(each)
        rows.append(f"| {name} | {', '.join(f'{r:.2f}' for r in each)} | {middle:.2f} | "
                    f"{verdict(middle <= 2)} |")
    return rows


def verdict(ok: bool) -> str:
    return "met" if ok else "**NOT met**"


def report(phases: list[Phase], args: argparse.Namespace, command: str) -> str:
    from ground.native import state

    baselines = [p for p in phases if p.name == "baseline"]
    pooled = Phase("baseline", answers=[a for p in baselines for a in p.answers])
    reference = pooled.latency_ms(99)
    pooled.direct = [a for p in baselines for a in p.direct]
    direct_reference = pooled.latency_ms(99, direct=True)
    rows = ["| phase | warm requests | warm success | p50 ms | p99 ms | p99 ÷ baseline p99 | "
            "direct p99 ms | direct p99 ÷ its baseline | "
            "RSS MiB before / max / after 10 s | edge CPU s | success ≥ 99.9 % | "
            "p99 ≤ twice | RSS within 10 % |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for phase in phases:
        ratio = phase.latency_ms(99) / reference
        rss = (f"{phase.rss_before / 1024:.1f} / {phase.rss_max / 1024:.1f} / "
               f"{phase.rss_after / 1024:.1f}")
        if phase.name == "baseline":
            targets = "— | — | —"
        else:
            grew = phase.rss_after / max(1, phase.rss_before) - 1
            targets = (f"{verdict(phase.success() >= 99.9)} | {verdict(ratio <= 2)} | "
                       f"{verdict(abs(grew) <= 0.10)} ({grew * 100:+.1f} %)")
            failed = [a.error or str(a.status) for a in phase.answers if a.status != 200]
            notes.append(f"- {phase.name} ({SOURCES[phase.name]}): attacker "
                         + ", ".join(f"{k} {v}" for k, v in sorted(phase.attacker.items()))
                         + f"; edge: held max {phase.held_max}, client connections max "
                         f"{phase.conns_max}"
                         + "".join(f", {k} +{v:.0f}" for k, v in
                                   sorted(phase.edge_counts.items()))
                         + (f"; warm failures: {sorted(set(failed))}" if failed else "")
                         + (f"; warm requests sent again on a new connection (a kept-alive "
                            f"one had closed): {phase.stale}" if phase.stale else ""))
        rows.append(f"| {phase.name} | {len(phase.answers)} | {phase.success():.2f} % | "
                    f"{phase.latency_ms(50):.2f} | {phase.latency_ms(99):.2f} | "
                    f"{ratio:.2f} | {phase.latency_ms(99, direct=True):.2f} | "
                    f"{phase.latency_ms(99, direct=True) / direct_reference:.2f} | {rss} | "
                    f"{phase.edge_cpu_s:.1f} | {targets} |")
    cold_lines = []
    for label, group in (("baselines", baselines),
                         ("hold-flood", [p for p in phases if p.name == "hold-flood"])):
        cold = [c for p in group for c in p.cold]
        if cold:
            codes = sorted({c[3] or str(c[1]) for c in cold})
            ms = [c[2] * 1000 for c in cold]
            cold_lines.append(
                f"- cold starts from 127.0.0.1 during {label}: {len(cold)}, "
                f"{sum(1 for c in cold if c[1] == 200)} answered 200 (answers: {codes}), "
                f"p50 {percentile(ms, 50):.1f} ms, max {max(ms):.1f} ms; edge_full: "
                f"{sum(1 for c in cold if c[3] == 'edge_full')}")
    native_on, native_why = state()
    return "\n".join([
        "## Abuse: one client's attack beside another's warm load (`loadtests/bench_abuse.py`,"
        " issue 26)", "",
        f"Command: `{command}`  ",
        f"Machine: {machine_line()} (nproc {os.cpu_count()}; shared with other jobs; "
        + placement_line(args),
        f"`thaw edge` as a separate process (native {'on' if native_on else 'off'}: "
        f"{native_why}), default limits, HTTPS on its own port (thaw/localca.py), a Redis "
        "registry; backend and fake placement in one fixtures process; each attacker a "
        f"process of its own on its own loopback address. Warm load: {args.rate:g} GET/s "
        "from 127.0.0.1 to app `web` over keep-alive connections (open loop, 5 s "
        f"timeout). Each phase {args.seconds:g} s; after each attack {COOLDOWN_S:.0f} s "
        "more before RSS *after* is read and the next baseline starts. p99 ÷ baseline "
        f"p99 is against all baselines pooled (p99 {reference:.2f} ms). *Direct*: the "
        f"same load ({args.rate:g} GET/s more) straight to the backend, no edge, in the "
        "same phase: what the attack costs the measuring side itself (the load, the "
        "backend and the attacker's kernel work share CPU 0); its p99 against its own "
        f"pooled baselines ({direct_reference:.2f} ms). Targets (issue "
        "26): warm success ≥ 99.9 %, p99 ≤ twice the baseline's, RSS 10 s after the attack within "
        "10 % of RSS before it.", "",
        *rows, "",
        *beside_baselines(phases), "",
        "What each attacker did and saw (its own counts):", "",
        *notes, *cold_lines,
    ])


async def main_async(args: argparse.Namespace, work: Path, ports: dict[str, int]
                     ) -> list[Phase]:
    from thaw.localca import LocalCA

    cold_apps = [f"cold{i}" for i in
                 range(int((len(args.attacks) * args.rounds + 2) * args.seconds / COLD_EVERY_S)
                       + 4)]
    chain, key = LocalCA(work / "tls", DOMAIN).issue(DOMAIN)  # type: ignore[misc]
    (work / "edge.pem").write_bytes(chain)
    (work / "edge.key").write_bytes(key)
    redis_url = f"redis://127.0.0.1:{ports['redis']}/0"
    with contextlib.ExitStack() as stack:
        stack.enter_context(process(
            ["redis-server", "--port", str(ports["redis"]), "--bind", "127.0.0.1", "--save",
             "", "--appendonly", "no", "--dir", str(work)], log=work / "redis.log"))
        stack.enter_context(process(
            [sys.executable, SCRIPT, "--fixtures",
             "--backend-port", str(ports["backend"]), "--placement-port",
             str(ports["placement"])], log=work / "fixtures.log"))
        for name in ("redis", "backend", "placement"):
            wait_port(ports[name])
        await seed(redis_url, ports["backend"], cold_apps)
        edge = stack.enter_context(process(
            [*(EDGE_CPU if args.pin else ()), sys.executable, "-m", "thaw", "edge",
             "--registry", redis_url,
             "--port", str(ports["edge"]), "--admin-port", str(ports["admin"]),
             "--placement", f"http://127.0.0.1:{ports['placement']}",
             "--no-discover-placements", "--log-level", "warning",
             "--cluster-key-file", str(key_file(work)), "--tls-cert", str(work / "edge.pem"),
             "--tls-key", str(work / "edge.key"), "--tls-port", str(ports["tls"]),
             *shlex.split(args.edge_args)],
            log=work / "edge.log"))
        wait_port(ports["edge"])
        wait_port(ports["tls"])
        try:
            return await measure(args, work, ports, edge.pid, cold_apps)
        finally:
            print((work / "edge.log").read_text()[-3000:], file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attacks", default=",".join(ATTACKS),
                        help="a comma list of: " + ", ".join(ATTACKS))
    parser.add_argument("--seconds", type=float, default=10.0, help="each phase's length")
    parser.add_argument("--rate", type=float, default=200.0, help="warm GETs per second")
    parser.add_argument("--rounds", type=int, default=1,
                        help="the attacks this many times over, each between two baselines; "
                             "each attack judged by the median over rounds of its p99 ÷ the "
                             "p99 of the two baselines beside it")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--edge-args", default="", metavar="ARGS",
                        help="more `thaw edge` flags, e.g. '--new-conns-per-s 100'")
    parser.add_argument("--pin", action="store_true",
                        help="the edge alone on CPU 1, the rest on CPU 0, attackers nice 19")
    parser.add_argument("--isolate", action="store_true",
                        help="as --pin, but the attackers on CPU 1 beside the edge at "
                             "SCHED_IDLE: the measuring side's core carries no attack")
    # internal: the child processes
    parser.add_argument("--fixtures", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--placement-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--attack", help=argparse.SUPPRESS)
    parser.add_argument("--edge-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tls-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fixtures:
        asyncio.run(fixtures(args.backend_port, args.placement_port))
        return
    if args.attack:
        counts = asyncio.run(attack(args.attack, args.edge_port, args.tls_port, args.seconds))
        args.out.write_text(json.dumps(counts))
        return
    args.attacks = [a for a in args.attacks.split(",") if a]
    unknown = set(args.attacks) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attacks: {sorted(unknown)}")
    command = "python loadtests/bench_abuse.py " + " ".join(sys.argv[1:])
    args.pin = args.pin or args.isolate
    if args.pin:
        os.sched_setaffinity(0, {0})  # this process and every child but the edge
    work = Path(tempfile.mkdtemp(prefix="thaw-bench-abuse-"))
    ports = {name: free_port() for name in ("redis", "backend", "placement", "edge", "admin",
                                            "tls")}
    try:
        phases = asyncio.run(main_async(args, work, ports))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(phases, args, command.strip())
    print(text)
    if not args.no_write:
        write_section("abuse", text)


if __name__ == "__main__":
    main()
