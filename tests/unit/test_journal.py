"""The agent's journal at boot: a log that would lie is refused, a repair keeps what it
can, the epoch never goes back; writes are all or nothing. (Real files, no event loop.)"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from agent.core import oplog_codec
from agent.core.oplog_codec import MAGIC
from agent.core.records import Created, Gone, MachineSpec, Record, Transition
from agent.errors import AgentError, DiskFull, LogDamaged, NotFound
from agent.journal import Journal
from agent.oplog import OpLog

SPEC = MachineSpec(app="hello", image="img")


def journal(state_dir: Path, written: list[tuple[Record, ...]] | None = None) -> Journal:
    return Journal(state_dir, compact_after_records=10_000, disk_reserve_bytes=0,
                   on_refused=lambda: None,
                   on_written=(written.append if written is not None else lambda r: None))


def booted(state_dir: Path, repair: bool = False) -> Journal:
    j = journal(state_dir)
    j.boot(at=1.0, repair=repair)
    return j


def close(j: Journal) -> None:
    j.oplog.close()


def test_each_boot_has_a_higher_epoch(tmp_path: Path) -> None:
    epochs = []
    for _ in range(3):
        j = booted(tmp_path)
        epochs.append(j.state.epoch)
        close(j)
    assert epochs == [1, 2, 3]
    assert (tmp_path / "epoch").read_text().strip() == "3"


def test_a_lost_log_is_refused_where_machines_ran_and_repair_starts_empty(
    tmp_path: Path,
) -> None:
    j = booted(tmp_path)
    j.write(Created("m1", SPEC, "k1", 1.0))
    close(j)
    (tmp_path / "oplog").unlink()  # lost: an operator, a bad restore, a wiped disk
    with pytest.raises(LogDamaged, match="missing or empty"):
        booted(tmp_path)
    (tmp_path / "oplog").write_bytes(bytes(4096))  # zero-filled: the same
    with pytest.raises(LogDamaged, match="missing or empty"):
        booted(tmp_path)
    j = booted(tmp_path, repair=True)
    assert j.state.machines == {} and j.state.epoch == 2  # still after the last boot
    close(j)


def test_an_empty_log_where_machine_dirs_exist_is_refused(tmp_path: Path) -> None:
    (tmp_path / "machines" / "m1").mkdir(parents=True)  # a state dir from before `epoch`
    with pytest.raises(LogDamaged):
        booted(tmp_path)


def test_a_repair_never_lowers_the_epoch(tmp_path: Path) -> None:
    for _ in range(5):
        close(booted(tmp_path))
    data = bytearray((tmp_path / "oplog").read_bytes())
    data[len(MAGIC) + 3] ^= 0xFF  # damage the first frame: a repair keeps nothing
    (tmp_path / "oplog").write_bytes(bytes(data) + oplog_codec.encode(Gone("m9", 1.0)))
    with pytest.raises(LogDamaged, match="damaged at byte"):
        booted(tmp_path)
    j = booted(tmp_path, repair=True)
    assert j.state.epoch == 6
    close(j)
    assert list(tmp_path.glob("oplog.damaged-*"))


def test_a_repair_of_a_damaged_magic_keeps_every_record(tmp_path: Path) -> None:
    j = booted(tmp_path)
    j.write(Created("m1", SPEC, "k1", 1.0), Transition("m1", "start", "starting", 2.0))
    close(j)
    data = bytearray((tmp_path / "oplog").read_bytes())
    data[2] ^= 0x01
    (tmp_path / "oplog").write_bytes(bytes(data))
    with pytest.raises(LogDamaged, match="format header"):
        booted(tmp_path)
    j = booted(tmp_path, repair=True)
    assert j.state.machines["m1"].state == "starting"
    close(j)


def test_records_written_together_are_kept_or_refused_together(tmp_path: Path) -> None:
    room = {"left": 1 << 20}

    def write(fd: int, data: bytes) -> int:
        part = data[: room["left"]]
        room["left"] -= len(part)
        return os.write(fd, part)

    written: list[tuple[Record, ...]] = []
    j = journal(tmp_path, written)
    j.boot(at=1.0)
    j.oplog.close()
    j.oplog = OpLog(tmp_path / "oplog", write=write)
    j.oplog.open()
    room["left"] = 50  # the first frame fits, the second does not
    pair = (Created("m1", SPEC, "k1", 1.0), Transition("m1", "start", "starting", 1.0))
    with pytest.raises(DiskFull):
        j.write(*pair)
    assert "m1" not in j.state.machines and written[-1] != pair
    room["left"] = 1 << 20
    j.write(*pair)
    assert written[-1] == pair and j.state.machines["m1"].state == "starting"
    close(j)
    records = oplog_codec.decode((tmp_path / "oplog").read_bytes()).records
    assert [r for r in records if getattr(r, "id", "") == "m1"] == list(pair)


def test_a_first_boot_that_could_not_write_its_record_leaves_a_bootable_state_dir(
    tmp_path: Path,
) -> None:
    """The epoch file is written only after the boot record is durable: a boot that
    failed never makes the next one see a lost log."""
    j = journal(tmp_path)

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    j.oplog = OpLog(tmp_path / "oplog", write=full)
    with pytest.raises(DiskFull):
        j.boot(at=1.0)
    assert not (tmp_path / "epoch").exists()
    j = booted(tmp_path)
    assert j.state.epoch == 1
    close(j)


def test_a_write_about_a_machine_that_is_gone_is_refused_and_would_not_replay(
    tmp_path: Path,
) -> None:
    j = booted(tmp_path)
    j.write(Created("m1", SPEC, "k1", 1.0), Transition("m1", "destroy", "destroying", 2.0))
    j.write(Transition("m1", "destroyed", "destroyed", 3.0))
    with pytest.raises(NotFound):  # a task that outlived its machine
        j.write(Gone("m1", 4.0))
    close(j)
    with open(tmp_path / "oplog", "ab") as out:  # as a log from before this rule may hold
        out.write(oplog_codec.encode(Gone("m1", 4.0)))
    j = booted(tmp_path)
    assert j.state.machines == {}
    close(j)


def test_a_record_too_large_for_the_log_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    j = booted(tmp_path)
    huge = MachineSpec(app="hello", image="img", env={"X": "\x01" * (1 << 20)})
    with pytest.raises(AgentError) as caught:
        j.write(Created("m1", huge, "k1", 1.0))
    assert caught.value.status == 422 and "m1" not in j.state.machines
    close(j)
    j = booted(tmp_path)
    assert j.state.epoch == 2  # still bootable
    close(j)
