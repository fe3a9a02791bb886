"""Plain-text tables for `thaw status` and list commands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[str(row.get(col, "")) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]
    lines = ["  ".join(col.upper().ljust(w) for col, w in zip(columns, widths, strict=True))]
    for r in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)
