"""A small HTTP/2 client over asyncio streams, built on the h2 library, for tests: h2c with
prior knowledge (or TLS with ALPN h2), many streams on one connection, raw frames when a
test needs to misbehave."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.settings


@dataclass
class Answer:
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    reset: int | None = None  # the RST_STREAM error code, if the edge reset the stream
    trailers: dict[bytes, bytes] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class H2Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 window: int = 1 << 20, auto_ack: bool = True) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding=None, validate_outbound_headers=False))
        self.conn.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window,
            h2.settings.SettingCodes.ENABLE_PUSH: 0})
        self.auto_ack = auto_ack  # acknowledge received DATA at once (False: a slow reader)
        self.answers: dict[int, Answer] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = asyncio.Event()
        self.conn.initiate_connection()
        self.flush()
        self._task = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, port: int, *, tls: ssl.SSLContext | None = None,
                   server_hostname: str | None = None, source: str = "127.0.0.1",
                   **kwargs: object) -> H2Client:
        """`source`: the loopback address to connect from (the edge tells clients apart
        by address: an attacker in a test is another client than the one it observes
        with, as it would be)."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=tls, server_hostname=server_hostname if tls else None,
            limit=1 << 22, local_addr=(source, 0))
        return cls(reader, writer, **kwargs)  # type: ignore[arg-type]

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def start(self, host: bytes, path: bytes = b"/", method: bytes = b"GET",
              body: bytes | None = None, extra: list[tuple[bytes, bytes]] | None = None,
              ) -> int:
        stream_id = self.conn.get_next_available_stream_id()
        headers = [(b":method", method), (b":scheme", b"http"), (b":authority", host),
                   (b":path", path), *(extra or [])]
        self.answers[stream_id] = Answer()
        self.conn.send_headers(stream_id, headers, end_stream=body is None)
        self.flush()
        if body is not None:
            asyncio.get_running_loop().create_task(self.send(stream_id, body, end=True))
        return stream_id

    async def request(self, host: bytes, path: bytes = b"/", method: bytes = b"GET",
                      body: bytes | None = None, extra: list[tuple[bytes, bytes]] | None = None,
                      timeout_s: float = 20.0) -> Answer:
        stream_id = self.start(host, path, method, body, extra)
        answer = self.answers[stream_id]
        await asyncio.wait_for(answer.done.wait(), timeout_s)
        return answer

    def open_websocket(self, host: bytes, path: bytes = b"/ws") -> int:
        """An RFC 8441 extended CONNECT: the stream stays open both ways."""
        stream_id = self.conn.get_next_available_stream_id()
        self.answers[stream_id] = Answer()
        self.conn.send_headers(stream_id, [
            (b":method", b"CONNECT"), (b":protocol", b"websocket"), (b":scheme", b"http"),
            (b":authority", host), (b":path", path), (b"sec-websocket-version", b"13")])
        self.flush()
        return stream_id

    async def send(self, stream_id: int, data: bytes, end: bool = False) -> None:
        """DATA within the edge's windows (waiting for them), END_STREAM after if `end`."""
        view = memoryview(data)
        while view:
            window = min(self.conn.local_flow_control_window(stream_id),
                         self.conn.max_outbound_frame_size)
            if window <= 0:
                await asyncio.sleep(0.005)
                continue
            self.conn.send_data(stream_id, bytes(view[:window]))
            view = view[window:]
            self.flush()
            await self.writer.drain()
        if end:
            self.conn.end_stream(stream_id)
            self.flush()

    def ack(self, stream_id: int, size: int) -> None:
        self.conn.acknowledge_received_data(size, stream_id)
        self.flush()

    async def _read(self) -> None:
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                for event in self.conn.receive_data(data):
                    self._event(event)
                self.flush()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            self.closed.set()
            for answer in self.answers.values():
                answer.done.set()

    def _event(self, event: object) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            answer = self.answers[event.stream_id or 0]
            answer.headers = dict(event.headers or [])
            answer.status = int(answer.headers.get(b":status", b"0"))
        elif isinstance(event, h2.events.DataReceived):
            answer = self.answers[event.stream_id or 0]
            answer.body += event.data or b""
            if self.auto_ack:
                self.conn.acknowledge_received_data(event.flow_controlled_length or 0,
                                                    event.stream_id or 0)
        elif isinstance(event, h2.events.TrailersReceived):
            self.answers[event.stream_id or 0].trailers = dict(event.headers or [])
        elif isinstance(event, h2.events.StreamEnded):
            self.answers[event.stream_id or 0].done.set()
        elif isinstance(event, h2.events.StreamReset):
            answer = self.answers.get(event.stream_id or 0)
            if answer is not None:
                answer.reset = int(event.error_code or 0)
                answer.done.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event

    async def close(self) -> None:
        self._task.cancel()
        self.writer.close()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
