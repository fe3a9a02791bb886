"""Which of the project's modules a warm request runs code of: an in-process edge serving
app `web` from a started machine, warm HTTP/1.1 and h2c requests (after a warm-up) with
a profile hook on, every Python frame's module recorded. Run as a script in a process of
its own with THAW_NATIVE=0 (a compiled module's functions are not Python frames): prints
the modules as JSON, `{"http1": [...], "h2c": [...]}`."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("edge", "ground")  # what runs in the edge's process
WARM_UP = 20
TRACED = 50
GET = b"GET / HTTP/1.1\r\nHost: web.localhost\r\n\r\n"


# Code compiled from a string at run time that the project's code calls: a dataclass's
# generated methods stay interpreted even in a compiled module (mypyc leaves them to
# dataclasses), so a dataclass made per request costs its interpreted __init__ each time.
GENERATED = "<generated>"


def module_of(filename: str) -> str | None:
    path = Path(filename)
    if not path.is_absolute() or ROOT not in path.parents:
        return None
    rel = path.relative_to(ROOT)
    return str(rel) if rel.parts[0] in PACKAGES else None


class Recorder:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            filename = frame.f_code.co_filename
            if filename == "<string>":  # generated: GENERATED if the project called it
                caller = frame.f_back
                module = (GENERATED if caller is not None
                          and module_of(caller.f_code.co_filename) is not None else None)
            else:
                module = module_of(filename)
            if module is not None:
                self.calls[module] += 1

    def per_request(self) -> list[str]:
        """The modules called at least once a request on average (not a connection's
        setup, nor a timer that ticked meanwhile)."""
        return sorted(m for m, n in self.calls.items() if n >= TRACED)


async def http1(port: int, count: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(count):
            writer.write(GET)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n")[0])
            await reader.readexactly(length)
    finally:
        writer.close()


async def h2c(port: int, count: int) -> None:
    from tests.support.h2client import H2Client

    client = await H2Client.open(port)
    try:
        for _ in range(count):
            answer = await client.request(b"web.localhost")
            assert answer.status == 200, answer
    finally:
        await client.close()


async def main() -> dict[str, list[str]]:
    from tests.support.edge_fakes import start_warm_edge

    found: dict[str, list[str]] = {}
    async with await start_warm_edge() as edge:
        for name, run in (("http1", http1), ("h2c", h2c)):
            await run(edge.port, WARM_UP)
            recorder = Recorder()
            sys.setprofile(recorder)
            try:
                await run(edge.port, TRACED)
            finally:
                sys.setprofile(None)
            found[name] = recorder.per_request()
            found[f"{name} calls"] = [f"{m} {n}" for m, n in recorder.calls.most_common()]
    return found


if __name__ == "__main__":
    assert os.environ.get("THAW_NATIVE") == "0", "run with THAW_NATIVE=0"
    print(json.dumps(asyncio.run(main())))
