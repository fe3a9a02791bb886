"""The agent is a child subreaper: orphans of its machines (a sandbox's namespace init, an
OCI container's init once `runtime create` exits) come back to it, not to pid 1, so it
reaps them and learns how they ended."""

from __future__ import annotations

import ctypes

_PR_SET_CHILD_SUBREAPER = 36


def become_child_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
