"""hello: the smallest thaw app. Standard library only.

Listens on 127.0.0.1:$PORT (default 8080). `GET /` answers
"<GREETING> from <THAW_MACHINE_ID>" (GREETING defaults to "hello"), `GET /healthz`
answers "ok". SIGTERM shuts the
server down cleanly (in-flight requests finish, exit status 0).
"""

from __future__ import annotations

import os
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MACHINE_ID = os.environ.get("THAW_MACHINE_ID", "unknown")
GREETING = os.environ.get("GREETING", "hello")


class Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._answer(200, b"ok\n")
        elif self.path == "/" or self.path.startswith("/?"):
            self._answer(200, f"{GREETING} from {MACHINE_ID}\n".encode())
        else:
            self._answer(404, b"not found\n")

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
    server = ThreadingHTTPServer(("127.0.0.1", port), Hello)
    server.daemon_threads = True

    def stop(_signum: int, _frame: object) -> None:
        # shutdown() blocks until serve_forever returns, so call it off the main thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"hello {MACHINE_ID} listening on 127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
