"""Test app: echoes request bodies as a sha256, streams chunked bytes, or never listens."""

import hashlib
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

MACHINE_ID = os.environ.get("THAW_MACHINE_ID", "?")


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        digest = hashlib.sha256()
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                digest.update(self.rfile.read(size))
                self.rfile.readline()
        else:
            remaining = int(self.headers.get("Content-Length", "0"))
            while remaining:
                chunk = self.rfile.read(min(remaining, 1 << 16))
                digest.update(chunk)
                remaining -= len(chunk)
        self._send(200, digest.hexdigest().encode())

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == "/stream":
            self._stream(int(query.get("bytes", ["0"])[0]))
        elif url.path == "/slow":
            time.sleep(float(query.get("s", ["0.2"])[0]))
            self._send(200, f"slow {MACHINE_ID}\n".encode())
        else:
            self._send(200, f"echo {MACHINE_ID}\n".encode())

    def _stream(self, total: int) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        block = bytes(range(256)) * 256  # 64 KiB, deterministic
        sent = 0
        while sent < total:
            piece = block[: min(len(block), total - sent)]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            sent += len(piece)
        self.wfile.write(b"0\r\n\r\n")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    if "--never-listen" in sys.argv:
        time.sleep(3600)
    if "--boot-delay" in sys.argv:  # a slow cold boot, as real apps have
        time.sleep(float(sys.argv[sys.argv.index("--boot-delay") + 1]))
    server = ThreadingHTTPServer(("0.0.0.0", int(os.environ["PORT"])), Echo)
    server.daemon_threads = True
    server.serve_forever()
