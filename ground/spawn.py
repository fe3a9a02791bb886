"""Short commands (the OCI runtime, `ip`, `nft`) run to their end off the event loop:
`subprocess.run` in a thread of a pool of its own.

Not asyncio's `create_subprocess_exec`: under uvloop that forks the whole process, page
tables and all, on the loop, where CPython's `subprocess` starts the child with vfork.
Measured with `loadtests/micro_spawn.py` (docs/benchmarks.md, "Spawning off the loop"):
in a process holding 100 MB, 7.3 ms of the caller's CPU and 16.6 ms a call against 0.6
and 1.5; an agent makes such calls for every start, stop and network step of a machine.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

SPAWN_THREADS = 32  # commands running at once; more wait for a thread (each only waits)

_pool: ThreadPoolExecutor | None = None


@dataclass(frozen=True)
class Finished:
    returncode: int
    out: bytes  # b"" when the output went to `output_fd` or nowhere
    err: bytes


async def run(argv: Sequence[str], *, timeout_s: float, input: bytes | None = None,
              output_fd: int | None = None, keep_out: bool = True) -> Finished:
    """Run `argv` to its end: stdin is `input` (None: /dev/null); stdout and stderr go to
    `output_fd` when given, else are kept (stdout dropped unless `keep_out`).
    TimeoutError after `timeout_s` from this call, waiting for a thread included (the
    command killed). A caller cancelled is answered once the command has ended (within
    `timeout_s`), or at once if it had not begun: it never outlives the descriptors its
    caller closes next."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(SPAWN_THREADS, thread_name_prefix="spawn")
    out_to: int = output_fd if output_fd is not None else (
        subprocess.PIPE if keep_out else subprocess.DEVNULL)
    err_to: int = output_fd if output_fd is not None else subprocess.PIPE

    deadline = time.monotonic() + timeout_s
    cancelled = threading.Event()

    def call() -> Finished:
        left = deadline - time.monotonic()
        if cancelled.is_set() or left <= 0:  # its caller gave up while it waited for a thread
            raise subprocess.TimeoutExpired(list(argv), timeout_s)
        done = subprocess.run(  # argv from the caller, never a shell
            list(argv), input=input, stdin=None if input is not None else subprocess.DEVNULL,
            stdout=out_to, stderr=err_to, timeout=left, check=False)
        return Finished(done.returncode, done.stdout or b"", done.stderr or b"")

    future = asyncio.get_running_loop().run_in_executor(_pool, call)
    try:
        return await asyncio.shield(future)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"{argv[0]} did not end within {timeout_s:g} s") from None
    except asyncio.CancelledError:
        cancelled.set()
        await asyncio.wait([future])  # the command ends (or never begins) first
        raise
