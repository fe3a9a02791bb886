"""Steady load of idempotent GETs from threads, every answer recorded (tests and benches)."""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Answer:
    started: float  # monotonic
    status: int  # 0: no HTTP answer (refused, reset, timed out)
    seconds: float
    body: str


@dataclass
class SteadyLoad:
    """`rate` GETs per second for `host` through the edge at `port`, spread over `clients`
    threads, each request on its own connection (as independent clients would)."""

    port: int
    host: str
    rate: float = 50.0
    clients: int = 5
    timeout_s: float = 30.0
    address: str = "127.0.0.1"  # the edge's
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> SteadyLoad:
        start = time.monotonic()
        for i in range(self.clients):
            thread = threading.Thread(target=self._client, args=(start, i), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timeout_s + 5)

    def _client(self, start: float, index: int) -> None:
        interval = self.clients / self.rate
        due = start + index * interval / self.clients
        while not self._stop.is_set():
            delay = due - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            due = max(due + interval, time.monotonic() - interval)
            self.answers.append(self.get())

    def get(self) -> Answer:
        began = time.monotonic()
        conn = http.client.HTTPConnection(self.address, self.port, timeout=self.timeout_s)
        try:
            conn.request("GET", "/", headers={"Host": self.host})
            response = conn.getresponse()
            body = response.read().decode(errors="replace")
            return Answer(began, response.status, time.monotonic() - began, body)
        except (OSError, http.client.HTTPException) as exc:
            return Answer(began, 0, time.monotonic() - began, repr(exc))
        finally:
            conn.close()

    def between(self, since: float, until: float = float("inf")) -> list[Answer]:
        return [a for a in list(self.answers) if since <= a.started < until]
