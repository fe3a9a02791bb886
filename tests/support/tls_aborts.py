"""Aborted TLS handshakes against an edge's TLS port, and an edge in a process of its own
so that its RSS is the edge's alone (issue 26: tests/integration/test_edge_tls_aborts.py,
loadtests/tls_abort_probe.py).

The kinds of aborted handshake, each a fresh TCP connection:

    silent   connect, send nothing, close
    partial  send the first half of a ClientHello, close
    midway   send a whole ClientHello, read the server's first flight, close

and `hold_silent`: silent connections kept open until the edge closes them itself.

`python -m tests.support.tls_aborts [--loop uvloop|asyncio] [--config JSON] [--tls JSON]
[--objects]` runs a warm edge (edge_fakes.start_warm_edge) with TLS from a LocalCA,
prints {"pid", "tls_port", "cafile", "loop"} as a JSON line, then answers commands read
from stdin, one JSON line each: `rss`, `gc`, `trim` (glibc's malloc_trim(0), timed),
`live` (connection objects alive, by type), `objects` (with --objects: objects by type
and allocation sites grown since the start); `quit` or EOF stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "web.test"  # the warm edge's app `web` under domain "test"
KINDS = ("silent", "partial", "midway")
# the objects of a connection (uvloop's names and the stdlib loop's), counted by `live`
CONNECTION_TYPES = frozenset({
    "SSLProtocol", "SSLObject", "_SSLSocket", "MemoryBIO", "TCPTransport",
    "_SelectorSocketTransport", "_SSLProtocolTransport", "_Alpn", "ClientConnection",
    "H2Connection"})


def rss_kb(pid: int) -> int:
    """The resident set of process `pid`, KB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


# -- the client -------------------------------------------------------------------------

def client_hello() -> bytes:
    """The bytes of a real ClientHello (TLS 1.3 and 1.2) for NAME."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=NAME)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def abort_batch(port: int, kind: str, count: int, hello: bytes) -> None:
    """`count` connections opened together, each taken as far as `kind` says, then
    closed."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]
    try:
        for s in socks:
            if kind == "partial":
                s.sendall(hello[: len(hello) // 2])
            elif kind == "midway":
                s.sendall(hello)
        if kind == "midway":
            for s in socks:
                with contextlib.suppress(OSError):
                    s.recv(65536)  # the server's first flight: its handshake is under way
        else:
            time.sleep(0.05)  # the edge accepted them (and read what came)
    finally:
        for s in socks:
            s.close()


def abort(port: int, kind: str, count: int, hello: bytes, batch: int = 100) -> None:
    """`count` aborted handshakes of `kind`, `batch` at a time."""
    for done in range(0, count, batch):
        abort_batch(port, kind, min(batch, count - done), hello)


def open_silent(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]


def closed_by_edge(socks: list[socket.socket], within_s: float) -> int:
    """How many of `socks` the edge closed (EOF or reset) within `within_s` from now."""
    deadline = time.monotonic() + within_s
    closed = 0
    for s in socks:
        s.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            if s.recv(1) == b"":
                closed += 1
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed += 1
    return closed


def hold_silent(port: int, count: int, limit_s: float,
                pid: int) -> tuple[int, float, int]:
    """`count` silent connections open together until the edge closes them (or `limit_s`);
    (how many it closed, seconds until the last of those, the edge's RSS in KB 1 s after
    they were all open)."""
    socks = open_silent(port, count)
    start = time.monotonic()
    try:
        time.sleep(1.0)
        held_rss = rss_kb(pid)
        closed = closed_by_edge(socks, limit_s - 1.0)
        return closed, time.monotonic() - start, held_rss
    finally:
        for s in socks:
            s.close()


def warm_request(port: int, cafile: str) -> int:
    """The status of one GET over TLS to NAME."""
    context = ssl.create_default_context(cafile=cafile)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=NAME) as tls:
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {NAME}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


class EdgeProcess:
    """This module's edge in a child process, and its commands (see the module's doc)."""

    def __init__(self, loop: str = "uvloop", config: dict[str, object] | None = None,
                 tls: dict[str, object] | None = None, env: dict[str, str] | None = None,
                 objects: bool = False) -> None:
        # every connection here comes from 127.0.0.1: the per-client limits (which would
        # refuse most aborted handshakes before TLS, as they should) are lifted, so that
        # what is measured is what a handshake leaves behind
        config = {"new_conns_per_s": 1e9, "new_conns_burst": 1 << 30,
                  "max_conns_per_client": 1 << 20, **(config or {})}
        command = [sys.executable, "-m", "tests.support.tls_aborts", "--loop", loop,
                   "--config", json.dumps(config), "--tls", json.dumps(tls or {})]
        if objects:
            command.append("--objects")
        self.proc = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            raise RuntimeError(f"the edge process exited ({self.proc.returncode})")
        started = json.loads(line)
        self.pid: int = started["pid"]
        self.port: int = started["tls_port"]
        self.cafile: str = started["cafile"]
        self.loop: str = started["loop"]

    def ask(self, command: str) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())  # type: ignore[no-any-return]

    def rss(self) -> int:
        return rss_kb(self.pid)

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def warm_request(self) -> int:
        return warm_request(self.port, self.cafile)

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- the edge (child process) ------------------------------------------------------------

def _types(keep: frozenset[str] | None = None) -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects()
                   if keep is None or type(o).__qualname__ in keep)


def _answer(command: str, base_types: Counter[str],
            base_snapshot: tracemalloc.Snapshot | None) -> dict[str, object]:
    if command == "trim":
        start = time.perf_counter()
        ctypes.CDLL(None).malloc_trim(0)
        return {"rss_kb": rss_kb(os.getpid()), "trim_ms": (time.perf_counter() - start) * 1e3}
    if command == "gc":
        gc.collect()
    elif command == "live":  # before and after a collection of reference cycles
        before = dict(_types(CONNECTION_TYPES))
        gc.collect()
        return {"before_gc": before, "live": dict(_types(CONNECTION_TYPES)),
                "rss_kb": rss_kb(os.getpid())}
    elif command == "objects":
        gc.collect()
        answer: dict[str, object] = {"types": (_types() - base_types).most_common(15)}
        if base_snapshot is not None:
            stats = tracemalloc.take_snapshot().compare_to(base_snapshot, "lineno")[:12]
            answer["top"] = [str(s) for s in stats]
            answer["traced_kb"] = tracemalloc.get_traced_memory()[0] // 1024
        return answer
    return {"rss_kb": rss_kb(os.getpid())}


async def serve(config: dict[str, object], tls: dict[str, object], objects: bool) -> None:
    from edge.config import TlsConfig
    from tests.support.edge_fakes import start_warm_edge
    from thaw.localca import LocalCA

    with tempfile.TemporaryDirectory(prefix="tls-aborts-") as tmp:
        ca = LocalCA(Path(tmp) / "ca", domain="test")
        edge = await start_warm_edge(domain="test", **config,
                                     tls=TlsConfig(port=0, issuer=ca.issue, **tls))  # type: ignore[arg-type]
        try:
            gc.collect()
            base_types = _types() if objects else Counter[str]()
            if objects:
                tracemalloc.start(8)
            base_snapshot = tracemalloc.take_snapshot() if objects else None
            print(json.dumps({"pid": os.getpid(), "tls_port": edge.runtime.tls_port,  # type: ignore[attr-defined]
                              "cafile": str(ca.cert_path),
                              "loop": type(asyncio.get_running_loop()).__module__}),
                  flush=True)
            while command := (await asyncio.to_thread(sys.stdin.readline)).strip():
                if command == "quit":
                    break
                print(json.dumps(_answer(command, base_types, base_snapshot)), flush=True)
        finally:
            await edge.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--config", default="{}", help="EdgeConfig fields (JSON)")
    parser.add_argument("--tls", default="{}", help="TlsConfig fields (JSON)")
    parser.add_argument("--objects", action="store_true")
    args = parser.parse_args()
    run = serve(json.loads(args.config), json.loads(args.tls), args.objects)
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(run)
    else:
        asyncio.run(run)


if __name__ == "__main__":
    main()
