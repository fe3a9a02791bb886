"""Why a machine's process ended, in the words the op log, the events and the metrics use:
`exited(N)`, `signalled(SIGNAME)`, `oom` (the kernel's OOM killer, within its memory limit),
or `exited(?)` when nobody here could see its status (it outlived an agent restart).
It must not know about processes: the wait status and the OOM count are arguments."""

from __future__ import annotations

import signal

OOM = "oom"
UNKNOWN = "exited(?)"


def describe_exit(wait_status: int | None, oom: bool) -> str:
    """`wait_status` as waitpid(2) returns it (None: not seen)."""
    if oom:
        return OOM
    if wait_status is None:
        return UNKNOWN
    if wait_status & 0x7F == 0:  # WIFEXITED
        return f"exited({(wait_status >> 8) & 0xFF})"
    return f"signalled({_signal_name(wait_status & 0x7F)})"


def describe_returncode(returncode: int | None) -> str:
    """The same from a subprocess return code (negative: the signal that ended it)."""
    if returncode is None:
        return UNKNOWN
    if returncode < 0:
        return f"signalled({_signal_name(-returncode)})"
    return f"exited({returncode})"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
