"""Commands run off the loop (ground/spawn.py) with real processes: input, output kept or
sent to a file, exit codes and errors, and the time bound (the command killed)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from ground import spawn


async def test_input_goes_in_and_the_output_comes_back() -> None:
    done = await spawn.run(["cat"], input=b"hello\n", timeout_s=10)
    assert (done.returncode, done.out, done.err) == (0, b"hello\n", b"")


async def test_without_input_stdin_is_empty_and_stdout_may_be_dropped() -> None:
    done = await spawn.run(["sh", "-c", "cat; echo said; echo oops >&2; exit 3"],
                           keep_out=False, timeout_s=10)
    assert (done.returncode, done.out, done.err) == (3, b"", b"oops\n")


async def test_output_to_a_descriptor_takes_stdout_and_stderr(tmp_path: Path) -> None:
    path = tmp_path / "out"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        done = await spawn.run(["sh", "-c", "echo one; echo two >&2"], output_fd=fd,
                               timeout_s=10)
    finally:
        os.close(fd)
    assert (done.returncode, done.out, done.err) == (0, b"", b"")
    assert path.read_bytes() == b"one\ntwo\n"


async def test_a_command_over_its_time_is_killed_and_raises_timeout(tmp_path: Path) -> None:
    with pytest.raises(TimeoutError, match=r"did not end within 0\.3 s"):
        await spawn.run(["sh", "-c", f"echo $$ > {tmp_path / 'pid'}; exec sleep 30"],
                        timeout_s=0.3)
    pid = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_many_at_once_all_finish() -> None:
    done = await asyncio.gather(*(spawn.run(["echo", str(i)], timeout_s=10)
                                  for i in range(3 * spawn.SPAWN_THREADS)))
    assert [d.out for d in done] == [f"{i}\n".encode() for i in range(3 * spawn.SPAWN_THREADS)]


async def test_a_cancelled_caller_is_answered_once_its_command_has_ended(
        tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    call = asyncio.create_task(spawn.run(
        ["sh", "-c", f"echo $$ > {pid_file}; exec sleep 0.5"], timeout_s=10))
    for _ in range(1000):  # until the command runs (its pid written)
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    with pytest.raises(ProcessLookupError):  # ended and reaped before the answer
        os.kill(int(pid_file.read_text()), 0)


async def test_a_call_cancelled_while_waiting_for_a_thread_never_begins(
        tmp_path: Path) -> None:
    busy = [asyncio.create_task(spawn.run(["sleep", "0.5"], timeout_s=10))
            for _ in range(spawn.SPAWN_THREADS)]
    await asyncio.sleep(0.1)
    queued = asyncio.create_task(spawn.run(["touch", str(tmp_path / "ran")], timeout_s=10))
    await asyncio.sleep(0.05)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    await asyncio.gather(*busy)
    assert not (tmp_path / "ran").exists()
