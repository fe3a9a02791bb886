"""A scripted HTTP/2 machine for the edge's h2c upstream (tests only): raw frames, so it
can do what no well-behaved server library lets a test do — answer after its own
GOAWAY, send a malformed head or more DATA than its content-length, refuse a stream.
Each request is handed to `behave(machine, conn, stream_id, headers)`, a coroutine
that answers it (or does not)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Coroutine
from typing import Any

import hpack
import hyperframe.frame as hf

from tests.support.ports import free_port

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, CANCEL = 0x0, 0x1, 0x7, 0x8
WIDE = (1 << 31) - 1

Behaviour = Callable[["ScriptedMachine", "MachineConn", int, dict[bytes, bytes]],
                     Coroutine[Any, Any, None]]


class MachineConn(asyncio.Protocol):
    """One connection the edge opened to the machine."""

    def __init__(self, machine: ScriptedMachine) -> None:
        self.machine = machine
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.preface_seen = False
        self.decoder = hpack.Decoder()
        self.encoder = hpack.Encoder()
        self.block: list[bytes] = []
        self.seen: set[int] = set()  # streams whose request head came (trailers aside)
        self.bodies: dict[int, bytearray] = {}
        self.ended: dict[int, asyncio.Event] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.machine.connections += 1
        # windows as large as HTTP/2 allows: the edge may send whole bodies at once
        self._send(hf.SettingsFrame(0, settings={hf.SettingsFrame.INITIAL_WINDOW_SIZE: WIDE}))
        update = hf.WindowUpdateFrame(0)
        update.window_increment = WIDE - 65535
        self._send(update)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.preface_seen:
            if len(self.buffer) < len(PREFACE):
                return
            assert self.buffer.startswith(PREFACE)
            self.buffer = self.buffer[len(PREFACE):]
            self.preface_seen = True
        while len(self.buffer) >= 9:
            frame, length = hf.Frame.parse_frame_header(memoryview(self.buffer[:9]))
            if len(self.buffer) < 9 + length:
                return
            frame.parse_body(memoryview(self.buffer[9:9 + length]))
            self.buffer = self.buffer[9 + length:]
            self._frame(frame)

    def _frame(self, frame: hf.Frame) -> None:
        machine = self.machine
        if isinstance(frame, hf.SettingsFrame) and "ACK" not in frame.flags:
            ack = hf.SettingsFrame(0)
            ack.flags.add("ACK")
            self._send(ack)
        elif isinstance(frame, hf.PingFrame) and "ACK" not in frame.flags:
            pong = hf.PingFrame(0)
            pong.flags.add("ACK")
            pong.opaque_data = frame.opaque_data
            self._send(pong)
        elif isinstance(frame, hf.RstStreamFrame):
            machine.resets.append((frame.stream_id, frame.error_code))
        elif isinstance(frame, hf.GoAwayFrame):
            machine.goaways.append(frame.error_code)
        elif isinstance(frame, hf.DataFrame):
            self.bodies.setdefault(frame.stream_id, bytearray()).extend(frame.data)
            if "END_STREAM" in frame.flags:
                self._ended(frame.stream_id).set()
        elif isinstance(frame, hf.HeadersFrame | hf.ContinuationFrame):
            self.block.append(frame.data)
            if "END_HEADERS" in frame.flags:
                fields = self.decoder.decode(b"".join(self.block), raw=True)
                self.block = []
                headers = {bytes(k): bytes(v) for k, v in fields}
                if "END_STREAM" in frame.flags:
                    self._ended(frame.stream_id).set()
                if frame.stream_id not in self.seen:
                    self.seen.add(frame.stream_id)
                    machine.seen_streams.append(frame.stream_id)
                    task = asyncio.get_running_loop().create_task(
                        machine.behave(machine, self, frame.stream_id, headers))
                    machine.tasks.add(task)
                    task.add_done_callback(machine.tasks.discard)

    def _ended(self, stream_id: int) -> asyncio.Event:
        return self.ended.setdefault(stream_id, asyncio.Event())

    async def body(self, stream_id: int) -> bytes:
        """The stream's request body, once the edge ended it."""
        await self._ended(stream_id).wait()
        return bytes(self.bodies.get(stream_id, b""))

    def _send(self, frame: hf.Frame) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(bytes(frame.serialize()))

    # -- what a behaviour sends ----------------------------------------------------------

    def headers(self, stream_id: int, fields: list[tuple[bytes, bytes]],
                end_stream: bool = False) -> None:
        frame = hf.HeadersFrame(stream_id)
        frame.data = self.encoder.encode(fields)
        frame.flags.add("END_HEADERS")
        if end_stream:
            frame.flags.add("END_STREAM")
        self._send(frame)

    def data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        frame = hf.DataFrame(stream_id)
        frame.data = data
        if end_stream:
            frame.flags.add("END_STREAM")
        self._send(frame)

    def goaway(self, last_stream_id: int, code: int = NO_ERROR) -> None:
        frame = hf.GoAwayFrame(0)
        frame.last_stream_id = last_stream_id
        frame.error_code = code
        self._send(frame)

    def reset(self, stream_id: int, code: int) -> None:
        frame = hf.RstStreamFrame(stream_id)
        frame.error_code = code
        self._send(frame)

    def raw(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        """A frame as given, checked by no library (a machine that breaks the rules)."""
        if self.transport is not None and not self.transport.is_closing():
            size = len(payload)
            self.transport.write(struct.pack(">HBBBL", size >> 8, size & 0xFF, kind, flags,
                                             stream_id) + payload)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ScriptedMachine:
    """The machine: an asyncio server on a free loopback port."""

    def __init__(self, behave: Behaviour) -> None:
        self.behave = behave
        self.connections = 0
        self.seen_streams: list[int] = []  # every connection's, in order
        self.resets: list[tuple[int, int]] = []
        self.goaways: list[int] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        self.port = free_port()
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: MachineConn(self), "127.0.0.1",
                                               self.port)
        return self.port

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        if self.server is not None:
            self.server.close()
