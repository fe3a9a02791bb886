"""An app's machine logs through placement: the follow cursor and whole lines.

`GET /v1/apps/{app}/logs` reads each machine's log from its agent. A follower passes
back the `cursor` of the last answer — `machine:offset` pairs — and gets only what
was written since. A chunk is cut after its last newline, so a line is never split
across two answers (unless one line is longer than a whole chunk), and multi-byte
characters are never cut in half.
"""

from __future__ import annotations

import re

MAX_CURSOR_CHARS = 4000  # a request line stays within the server's 8 KiB
MAX_CURSOR_MACHINES = 100
_PAIR = re.compile(r"^([A-Za-z0-9_-]{1,64}):(\d{1,15})$")


class BadCursor(ValueError):
    pass


def parse_cursor(text: str) -> dict[str, int]:
    """"m1:120,m2:0" -> {"m1": 120, "m2": 0}; "" -> {} (every log from its tail)."""
    if len(text) > MAX_CURSOR_CHARS:
        raise BadCursor(f"cursor is longer than {MAX_CURSOR_CHARS} characters")
    offsets: dict[str, int] = {}
    for pair in filter(None, text.split(",")):
        found = _PAIR.match(pair)
        if found is None:
            raise BadCursor("cursor is not a list of machine:offset")
        offsets[found.group(1)] = int(found.group(2))
    if len(offsets) > MAX_CURSOR_MACHINES:
        raise BadCursor(f"cursor names more than {MAX_CURSOR_MACHINES} machines")
    return offsets


def format_cursor(offsets: dict[str, int]) -> str:
    return ",".join(f"{mid}:{offset}" for mid, offset in sorted(offsets.items()))


def whole_lines(data: bytes, full: bool) -> bytes:
    """The part of `data` up to its last newline. A chunk with none is kept whole only
    when it is `full` (one line longer than a chunk: better split than stuck)."""
    end = data.rfind(b"\n") + 1
    return data if end == 0 and full else data[:end]


def lines(data: bytes) -> list[str]:
    """The chunk's lines as text (bytes that are not UTF-8 replaced, never raised on).
    Lines end at "\n" only, as the agent stamps them: a "\r" or a Unicode line separator
    a machine writes stays inside its line, so it cannot forge a stamped line of its own."""
    text = data.decode("utf-8", errors="replace")
    parts = text.split("\n")
    return parts[:-1] if parts and parts[-1] == "" else parts
