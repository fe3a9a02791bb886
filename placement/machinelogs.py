"""An app's machine logs, read from their agents (`GET /v1/apps/{app}/logs`).

Each machine's log lives on its worker; placement asks every worker at once for the
bytes after the follower's cursor (the tail on a first read) and answers whole lines
per machine, with the cursor to pass back. A worker that does not answer costs its
machines' lines for this read only: they are listed as unreachable and the cursor
keeps their place.
"""

from __future__ import annotations

import asyncio

from ground.appconfig import AppConfig
from placement.api import LogsAnswer, MachineLog
from placement.core.logs import MAX_CURSOR_MACHINES, format_cursor, lines, parse_cursor, whole_lines
from placement.core.wake import GONE
from placement.fleet.fleet import Fleet
from placement.ports.workers import LogChunk, Workers

FOLLOW_CHUNK = 64 * 1024  # bytes per machine per read when following
MAX_TAIL = 1 << 20
DEFAULT_TAIL = 16 * 1024  # bytes of each log's tail on a first read
MAX_ANSWER = 4 << 20  # bytes of logs in one answer, shared by its machines


async def app_logs(fleet: Fleet, config: AppConfig, cursor: str,
                   tail_bytes: int, machine: str = "") -> LogsAnswer:
    """The newest MAX_CURSOR_MACHINES machines' logs (or only `machine`'s)."""
    offsets = parse_cursor(cursor)
    views = sorted((v for v in await fleet.own_machines(config)
                    if v.state not in GONE and machine in ("", v.id)),
                   key=lambda v: v.created_at)[-MAX_CURSOR_MACHINES:]
    urls = {w.id: w.url for w in await fleet.workers()}
    share = MAX_ANSWER // max(len(views), 1)
    reads = await asyncio.gather(*(
        _read(fleet.agents, urls.get(v.worker, ""), v.id, offsets.get(v.id, -1),
              min(tail_bytes if v.id not in offsets else FOLLOW_CHUNK, share))
        for v in views
    ))
    logs, unreachable, after = [], [], dict(offsets)
    for view, got in zip(views, reads, strict=True):
        if got is None:
            unreachable.append(view.id)
            continue
        start, chunk = got
        after[view.id] = start + len(chunk)
        logs.append(MachineLog(machine=view.id, worker=view.worker, state=view.state,
                               lines=lines(chunk)))
    live = {v.id for v in views}
    return LogsAnswer(logs=logs, unreachable=unreachable,
                      cursor=format_cursor({m: o for m, o in after.items() if m in live}))


async def _read(agents: Workers, url: str, mid: str, offset: int, max_bytes: int
                ) -> tuple[int, bytes] | None:
    """(where the chunk starts, its whole lines), or None if the worker did not answer."""
    if not url:
        return None
    chunk = await agents.logs(url, mid, offset, max_bytes)
    if not isinstance(chunk, LogChunk):
        return None
    return chunk.start, whole_lines(chunk.data, full=len(chunk.data) >= max_bytes)
