"""hello: the smallest thaw app. Standard library only.

Listens on 0.0.0.0:$PORT (default 8080; a machine is reached at its own address). `GET /`
answers "<GREETING> from <THAW_MACHINE_ID>" (GREETING defaults to "hello"), `GET /healthz`
answers "ok", and `GET /ws` is a WebSocket that echoes every message (the text
message "close-me" makes the app close it). SIGTERM shuts the
server down cleanly (in-flight requests finish, exit status 0).
"""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MACHINE_ID = os.environ.get("THAW_MACHINE_ID", "unknown")
GREETING = os.environ.get("GREETING", "hello")
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, 1.3
WS_MAX_MESSAGE = 16 << 20


class Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # One send per answer: buffered writes flushed once at the end of each request, and
    # Nagle off. As it comes, http.server writes the head and the body apart; with Nagle
    # on, the body waits for the head's ACK, which the peer may delay ~40 ms.
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._answer(200, b"ok\n")
        elif self.path == "/ws":
            self._websocket()
        elif self.path == "/" or self.path.startswith("/?"):
            self._answer(200, f"{GREETING} from {MACHINE_ID}\n".encode())
        else:
            self._answer(404, b"not found\n")

    def _websocket(self) -> None:
        """RFC 6455 echo: text and binary messages come back as sent; a text message
        "close-me" makes the app close the connection (1000); ping gets pong."""
        key = self.headers.get("Sec-WebSocket-Key", "")
        if self.headers.get("Upgrade", "").lower() != "websocket" or not key:
            self._answer(400, b"a websocket upgrade was expected\n")
            return
        accept = base64.b64encode(hashlib.sha1(key.encode() + WS_GUID).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        message, kind = bytearray(), 1
        while True:
            frame = self._read_frame()
            if frame is None:
                return
            fin, opcode, payload = frame
            if opcode == 8:  # close: answer it with the same code
                self._send_frame(8, payload[:2])
                return
            if opcode == 9:
                self._send_frame(10, payload)
                continue
            if opcode in (1, 2):
                kind, message = opcode, bytearray(payload)
            elif opcode == 0:
                message += payload
            else:
                continue
            if len(message) > WS_MAX_MESSAGE:
                self._send_frame(8, struct.pack("!H", 1009))
                return
            if fin:
                if kind == 1 and message == b"close-me":
                    self._send_frame(8, struct.pack("!H", 1000))
                    return
                self._send_frame(kind, bytes(message))

    def _read_frame(self) -> tuple[bool, int, bytes] | None:
        head = self.rfile.read(2)
        if len(head) < 2:
            return None
        size = head[1] & 0x7F
        if size == 126:
            size = struct.unpack("!H", self.rfile.read(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", self.rfile.read(8))[0]
        if size > WS_MAX_MESSAGE:
            return None
        mask = self.rfile.read(4) if head[1] & 0x80 else b""
        payload = self.rfile.read(size)
        if len(payload) < size:
            return None
        if mask:  # unmask as one big integer: fast for large frames in pure Python
            key = (mask * (size // 4 + 1))[:size]
            payload = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(
                size, "big")
        return bool(head[0] & 0x80), head[0] & 0x0F, payload

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, size)
        self.wfile.write(head + payload)
        self.wfile.flush()

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    port = int(os.environ.get("PORT", "8080"))
    # a listen backlog for a burst: the edge opens many connections to a fresh machine
    # at once, and http.server's default of 5 makes the kernel drop the rest (each then
    # retried by the client's SYN 1 s later)
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer(("0.0.0.0", port), Hello)
    server.daemon_threads = True

    def stop(_signum: int, _frame: object) -> None:
        # shutdown() blocks until serve_forever returns, so call it off the main thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"hello {MACHINE_ID} listening on 0.0.0.0:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
