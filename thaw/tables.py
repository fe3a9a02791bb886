"""The CLI's output: plain-text tables that fit a terminal, or JSON for scripts."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

WIDTH = 100  # columns a table may take when the terminal does not say (a pipe, a file)
NARROWEST, WIDEST = 60, 400
GAP = "  "


def terminal_width() -> int:
    """The columns a table may take: `COLUMNS`, else the terminal's width, else `WIDTH`
    (as `ls` and `git` do), within [NARROWEST, WIDEST]."""
    columns = shutil.get_terminal_size((WIDTH, 24)).columns
    return min(WIDEST, max(NARROWEST, columns))


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], width: int | None = None,
          below: str = "") -> str:
    """Rows under upper-case headers, at most `width` columns (default: the terminal's):
    the widest columns are shortened (with "…") until the table fits. `below` names a
    field printed in full under its row, every line of it indented (a reason: its words
    are the point)."""
    width = terminal_width() if width is None else width
    if below:
        return _with_below(rows, columns, width, below)
    cells = [[printable(str(row.get(col, ""))) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    excess = sum(widths) + len(GAP) * (len(columns) - 1) - width
    while excess > 0:
        widest = max(range(len(widths)), key=lambda i: widths[i])
        floor = max(len(columns[widest]), 8)
        if widths[widest] <= floor:
            break
        cut = min(excess, widths[widest] - floor)
        widths[widest] -= cut
        excess -= cut
    lines = [GAP.join(col.upper().ljust(w) for col, w in zip(columns, widths, strict=True))]
    for r in cells:
        lines.append(GAP.join(shorten(c, w).ljust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def _with_below(rows: Sequence[dict[str, Any]], columns: Sequence[str], width: int,
                below: str) -> str:
    lines = table(rows, columns, width).split("\n")
    out = lines[:1]
    for line, row in zip(lines[1:], rows, strict=True):
        out.append(line)
        text = str(row.get(below) or "")
        out += [f"    {printable(part)}".rstrip() for part in text.split("\n") if part.strip()]
    return "\n".join(out)


_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F]
             if c != 0x09} | {0x0D: "\\r"} | {c: f"\\u{c:04x}" for c in
                                              (0x85, 0x2028, 0x2029)}


def printable(text: str) -> str:
    """`text` with control characters shown as escapes (`\x1b`, `\r`): what a machine
    wrote reaches an operator's terminal, and must not move its cursor, retitle it or
    forge a line."""
    return text.translate(_CONTROLS)


def shorten(text: str, width: int) -> str:
    """`text` in at most `width` characters, its middle replaced by "…" when too long
    (both ends of an image reference or a path are the informative parts)."""
    if len(text) <= width:
        return text
    if width < 2:
        return text[:width]
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "-"


def emit(as_json: bool, value: Any, human: str | Callable[[], str]) -> None:
    """The answer for a script (`--json`: the API's JSON) or for a person."""
    if as_json:
        print(json.dumps(value, indent=2, sort_keys=True))
    else:
        print(human() if callable(human) else human)
