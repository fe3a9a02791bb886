"""The op log on disk: torn tails cut at open, repair, appends cut back on a full disk,
group commit, atomic compaction, migration from format 1. (The file system is real;
a full disk and a slow one are stood in by the writer and fsync the log is given.)"""

from __future__ import annotations

import asyncio
import errno
import os
import struct
import time
import zlib
from pathlib import Path

import pytest

from agent.core import oplog_codec
from agent.core.records import Boot, Created, MachineSpec, Record, Transition
from agent.core.state import replay, snapshot
from agent.oplog import LogWriteFailed, OpLog

SPEC = MachineSpec(app="hello", image="img")


def read_back(path: Path) -> list[Record]:
    """The records an agent would boot with (the log opened, and closed again)."""
    log = OpLog(path)
    try:
        return log.open()
    finally:
        log.close()


def test_a_log_with_a_torn_last_record_replays_to_the_state_before_that_record(
    tmp_path: Path,
) -> None:
    path = tmp_path / "oplog"
    log = OpLog(path)
    log.open()
    log.append(Created("m1", SPEC, "k", 1.0))
    log.append(Transition("m1", "start", "starting", 2.0))
    log.close()
    before = replay(read_back(path))
    torn = oplog_codec.encode(Transition("m1", "ready", "started", 3.0))
    with open(path, "ab") as out:
        out.write(torn[: len(torn) // 2])  # the agent died mid-append
    reopened = OpLog(path)
    records = reopened.open()
    assert reopened.dropped_torn_tail
    assert replay(records).machines["m1"].state == before.machines["m1"].state == "starting"
    reopened.append(Transition("m1", "ready", "started", 4.0))  # appends after the cut
    reopened.close()
    assert replay(read_back(path)).machines["m1"].state == "started"


def test_compaction_replaces_the_log_by_a_snapshot_with_the_same_state(tmp_path: Path) -> None:
    path = tmp_path / "oplog"
    log = OpLog(path)
    log.open()
    log.append(Boot(3, 0.0))
    for i in range(50):
        log.append(Created(f"m{i}", SPEC, f"k{i}", float(i)))
        log.append(Transition(f"m{i}", "destroy", "destroying", float(i)))
        if i % 2:
            log.append(Transition(f"m{i}", "destroyed", "destroyed", float(i)))
    state = replay(read_back(path))
    log.compact(snapshot(state))
    log.append(Transition("m0", "destroyed", "destroyed", 99.0))
    log.close()
    again = replay(read_back(path))
    assert again.epoch == 3
    assert set(again.machines) == set(state.machines) - {"m0"}
    assert not (tmp_path / "oplog.compact").exists()


def test_a_damaged_log_is_repaired_from_its_valid_prefix_keeping_a_copy(tmp_path: Path) -> None:
    path = tmp_path / "oplog"
    log = OpLog(path)
    log.open()
    for i in range(5):
        log.append(Created(f"m{i}", SPEC, f"k{i}", float(i)))
    log.close()
    data = bytearray(path.read_bytes())
    third = len(oplog_codec.MAGIC) + 2 * len(oplog_codec.encode(Created("m0", SPEC, "k0", 0.0)))
    data[third + 20] ^= 0x10
    path.write_bytes(bytes(data))
    damaged = OpLog(path)
    with pytest.raises(oplog_codec.CorruptLog) as caught:
        damaged.open()
    assert caught.value.offset == third
    records = OpLog(path).repair(caught.value)
    assert [r.id for r in records] == ["m0", "m1"]  # type: ignore[union-attr]
    [copy] = tmp_path.glob("oplog.damaged-*")
    assert copy.read_bytes() == bytes(data)  # the damaged log, kept as it was
    assert [r.id for r in read_back(path)] == ["m0", "m1"]  # type: ignore[union-attr]


def failing_write(after_bytes: int, error: int | None = errno.ENOSPC):
    """os.write that fails (or writes short, error None) once `after_bytes` were written."""
    budget = {"left": after_bytes}

    def write(fd: int, data: bytes) -> int:
        if budget["left"] >= len(data):
            budget["left"] -= len(data)
            return os.write(fd, data)
        if error is not None and budget["left"] == 0:
            raise OSError(error, os.strerror(error))
        part = os.write(fd, data[: budget["left"]])  # a partial frame lands on disk
        budget["left"] = 0
        if error is not None:
            raise OSError(error, os.strerror(error))
        return part

    return write, budget


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO, None])
def test_a_failed_or_short_append_is_cut_back_and_the_log_stays_bootable(
    tmp_path: Path, error: int | None
) -> None:
    path = tmp_path / "oplog"
    write, budget = failing_write(10_000, error)
    log = OpLog(path, write=write)
    log.open()
    log.append(Created("m1", SPEC, "k1", 1.0))
    budget["left"] = 30  # room for part of the next frame only
    with pytest.raises(LogWriteFailed) as caught:
        log.append(Transition("m1", "start", "starting", 2.0))
    assert caught.value.full == (error != errno.EIO)
    assert path.stat().st_size == log.size  # no partial frame left behind
    budget["left"] = 10_000  # space is back
    log.append(Transition("m1", "stop", "stopped", 3.0))
    log.close()
    records = read_back(path)
    assert [type(r).__name__ for r in records] == ["Created", "Transition"]
    assert replay(records).machines["m1"].state == "stopped"


async def test_concurrent_appends_share_fsyncs_and_each_returns_once_durable(
    tmp_path: Path,
) -> None:
    syncs: list[int] = []

    def fsync(fd: int) -> None:
        syncs.append(log.appended)
        time.sleep(0.02)  # a slow disk: appends pile up behind the fsync in flight
        os.fsync(fd)

    log = OpLog(tmp_path / "oplog", fsync=fsync)
    log.open()

    async def one(i: int) -> int:
        log.append(Created(f"m{i}", SPEC, f"k{i}", float(i)))
        seq = log.appended
        await log.durable()
        assert log.synced >= seq  # never answered before its own record was synced
        return seq

    waiters = []
    for i in range(100):
        waiters.append(asyncio.ensure_future(one(i)))
        if i % 10 == 9:
            await asyncio.sleep(0.005)  # appends keep arriving while fsyncs run
    await asyncio.gather(*waiters)
    assert log.synced == 100
    assert len(syncs) < 25  # one fsync per batch, not per append
    log.close()


async def test_compaction_waits_while_an_fsync_of_the_current_file_runs(tmp_path: Path) -> None:
    log = OpLog(tmp_path / "oplog", fsync=lambda fd: (time.sleep(0.05), os.fsync(fd))[1])
    log.open()
    log.append(Created("m1", SPEC, "k1", 1.0))
    pending = asyncio.ensure_future(log.durable())
    await asyncio.sleep(0.01)  # the fsync is in flight
    assert log.compact(snapshot(replay(read_back(tmp_path / "oplog")))) is False
    await pending
    assert log.compact(snapshot(replay(read_back(tmp_path / "oplog")))) is True
    log.close()


def test_a_format_1_log_is_kept_and_rewritten_in_format_2_before_anything_is_appended(
    tmp_path: Path,
) -> None:
    path = tmp_path / "oplog"
    payloads = [oplog_codec._encoder.encode(r) for r in (Boot(2, 0.0),
                                                          Created("m1", SPEC, "k", 1.0))]
    v1 = b"".join(struct.pack(">II", len(p), zlib.crc32(p)) + p for p in payloads)
    path.write_bytes(v1)
    log = OpLog(path)
    records = log.open()
    assert log.migrated and replay(records).epoch == 2
    assert path.read_bytes().startswith(oplog_codec.MAGIC)  # before any append
    log.append(Transition("m1", "start", "starting", 2.0))
    log.close()
    [kept] = tmp_path.glob("oplog.format1-*")
    assert kept.read_bytes() == v1
    assert replay(read_back(path)).machines["m1"].state == "starting"


def test_the_bytes_of_a_torn_tail_are_kept_beside_the_log_and_zeros_are_not(
    tmp_path: Path,
) -> None:
    path = tmp_path / "oplog"
    log = OpLog(path)
    log.open()
    log.append(Created("m1", SPEC, "k1", 1.0))
    log.close()
    torn = oplog_codec.encode(Transition("m1", "start", "starting", 2.0))[:-3]
    with open(path, "ab") as out:
        out.write(torn)
    read_back(path)
    [tail] = tmp_path.glob("oplog.tail-*")
    assert tail.read_bytes() == torn
    with open(path, "ab") as out:
        out.write(bytes(512))  # what a power loss leaves: nothing worth keeping
    read_back(path)
    assert len(list(tmp_path.glob("oplog.tail-*"))) == 1
