"""Hearing a lease's release (placement/leases.py `watch`) in tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any


async def released_heard(leases: Any, name: str, holder: str) -> asyncio.Event:
    """Take and release `name` until a watcher hears a release (a subscriber may still be
    subscribing when the first is published); the event it heard."""
    deadline = time.monotonic() + 5
    while True:
        event = leases.watch(name)
        try:
            token = await leases.acquire(name, holder, 5)
            assert isinstance(token, int)
            await leases.release(name, holder, token)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), 0.2)
            if event.is_set():
                return event
            assert time.monotonic() < deadline, "no release was heard"
        finally:
            leases.unwatch(name, event)
