"""The agent's record of its machines: the op log, and the state it replays to.

Every change is written to the op log, then applied to the in-memory state at
once (so the next decision sees it); whoever acts on a change awaits
`durable()` first. A change that cannot be written changes nothing: `DiskFull`
(503) while the disk has no room, `LogBroken` (503) once the log cannot be made
durable at all. A fact about what already happened — a process exited, a
machine became ready — is written `eventually`: retried until the log takes it,
never dropped. Boot replays the log and refuses one that would lie: damaged
before its end, or empty while this state dir has run machines before; the
boot epoch only ever rises, even across a repair (it is also kept in `epoch`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from agent.core.oplog_codec import CorruptLog, RecordTooLarge
from agent.core.records import Boot, Record
from agent.core.state import AgentState, replay, snapshot, unknown_machine
from agent.errors import AgentError, DiskFull, LogBroken, LogDamaged, NotFound
from agent.oplog import LogSyncFailed, LogWriteFailed, OpLog, RepairFailed
from ground.durable import fsync_dir
from ground.statefiles import open_private

log = logging.getLogger("thaw.agent")

RETRY_WRITE_S = 0.25  # how often a fact waiting for room in the op log is tried again
T = TypeVar("T")


class Journal:
    """`on_written(records)` is called after records are written and applied."""

    def __init__(self, state_dir: Path, *, compact_after_records: int,
                 disk_reserve_bytes: int, on_refused: Callable[[], None],
                 on_written: Callable[[tuple[Record, ...]], None]) -> None:
        self.state_dir = state_dir
        self.state = AgentState()
        self.oplog = OpLog(state_dir / "oplog")
        self.compact_after_records = compact_after_records
        self.disk_reserve_bytes = disk_reserve_bytes
        self.on_refused = on_refused
        self.on_written = on_written
        self.disk_full = False  # the last write could not be made (see disk_short)
        self.closing = False  # facts waiting for room give up (the agent is stopping)

    # -- boot ------------------------------------------------------------------------

    def boot(self, at: float, repair: bool = False) -> int:
        """Replay the log, write a boot record; return the new epoch. LogDamaged for a log
        that would lie, unless `repair` (a copy of the damaged log is kept)."""
        try:
            records = self.oplog.open() if not repair else self._open_repairing()
        except CorruptLog as exc:
            raise LogDamaged(
                f"op log {self.oplog.path} is damaged at byte {exc.offset} ({exc.reason}); "
                f"`thaw agent --repair` keeps a copy of it and starts from the "
                f"{len(exc.records)} valid records") from None
        except RepairFailed as exc:
            raise LogDamaged(f"op log {self.oplog.path}: {exc}") from None
        try:
            return self._start(records, at, repair)
        except BaseException:
            self.oplog.close()
            raise

    def _start(self, records: list[Record], at: float, repair: bool) -> int:
        last_epoch = self._last_epoch()
        if not records and not repair and (last_epoch or self._has_run_machines()):
            raise LogDamaged(
                f"op log {self.oplog.path} is missing or empty, but this state dir has run "
                f"machines before (epoch {last_epoch}): `thaw agent --repair` starts from "
                "an empty log (and kills the machine processes it does not record)")
        self.state = replay(records)
        if self.oplog.dropped_torn_tail:
            log.warning("op log: dropped a torn or zero-filled tail")
        epoch = max(self.state.epoch, last_epoch) + 1
        self.write(Boot(epoch=epoch, at=at))
        try:
            self.oplog.sync()  # the boot record first: an epoch file never outruns its log
        except LogSyncFailed as exc:
            raise LogBroken(str(exc)) from None
        self._keep_epoch(epoch)
        self.oplog.compact(snapshot(self.state))
        return epoch

    def _open_repairing(self) -> list[Record]:
        try:
            return self.oplog.open()
        except CorruptLog as exc:
            return self.oplog.repair(exc)

    def _last_epoch(self) -> int:
        try:
            return int((self.state_dir / "epoch").read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _keep_epoch(self, epoch: int) -> None:
        path = self.state_dir / "epoch"
        tmp = path.with_name("epoch.tmp")
        try:
            with os.fdopen(open_private(tmp), "w") as out:
                out.write(f"{epoch}\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
            fsync_dir(self.state_dir)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DiskFull(f"cannot record the boot epoch: {os.strerror(exc.errno or 0)}") \
                from None

    def _has_run_machines(self) -> bool:
        machines = self.state_dir / "machines"
        return machines.is_dir() and any(machines.iterdir())

    # -- writing ---------------------------------------------------------------------

    def write(self, *records: Record) -> None:
        """Write the records (one write: all or none), then apply them. Raises DiskFull,
        LogBroken, or a 422 for a record too large to write, and then nothing changed."""
        missing = unknown_machine(self.state, records)
        if missing:  # a late write about a destroyed machine: it would not replay
            raise NotFound(f"machine {missing} not found")
        try:
            self.oplog.append(*records)
        except RecordTooLarge as exc:
            raise AgentError(str(exc), code="too_large", status=422) from None
        except LogWriteFailed as exc:
            self.on_refused()
            if self.oplog.broken:
                raise LogBroken(self.oplog.broken) from None
            self.disk_full = True
            raise DiskFull(f"the op log cannot be written ({exc.reason}); no change made "
                           "until it can") from None
        self.disk_full = False
        for record in records:
            self.state.apply(record)
        if self.oplog.appended_since_compaction > self.compact_after_records:
            self.oplog.compact(snapshot(self.state))  # put off while an fsync runs
        self.on_written(records)

    async def eventually(self, write: Callable[[], T]) -> T:
        """Run `write` (it writes what already happened) until the log takes it: retried
        every RETRY_WRITE_S while the disk is full. LogBroken, or DiskFull once closing."""
        waited = False
        while True:
            try:
                return write()
            except DiskFull as exc:
                if self.closing:
                    raise
                if not waited:
                    log.warning("waiting for room to write what happened: %s", exc.message)
                    waited = True
            await asyncio.sleep(RETRY_WRITE_S)

    async def durable(self) -> None:
        """Return once every record written so far is on disk (effects wait for this)."""
        try:
            await self.oplog.durable()
        except LogSyncFailed as exc:
            raise LogBroken(str(exc)) from None

    def disk_short(self) -> bool:
        """The log cannot take changes now: broken, or the last write failed and the state
        dir has no room yet (free space below `disk_reserve_bytes`; clears itself)."""
        if self.oplog.broken:
            return True
        if self.disk_full and shutil.disk_usage(self.state_dir).free >= self.disk_reserve_bytes:
            self.disk_full = False
        return self.disk_full

    async def close(self) -> None:
        await self.oplog.settle()
        self.oplog.close()


def record_ids(records: Iterable[Record]) -> list[str]:
    """The machine ids the records are about, each once, in order."""
    ids: dict[str, None] = {}
    for record in records:
        mid = getattr(record, "id", None)
        if mid is not None:
            ids[mid] = None
    return list(ids)
