"""`/readyz`'s common part: whether the registry answers now (every service's readiness
needs it; each adds its own conditions)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

log = logging.getLogger("thaw.registry")

READY_CHECK_S = 2.0  # the registry must answer within this


async def registry_answers(call: Awaitable[object]) -> tuple[bool, str]:
    """(True, "") if `call` (a registry round trip) completes in time, else (False, why)."""
    try:
        await asyncio.wait_for(call, READY_CHECK_S)
    except Exception as exc:  # any failure to reach the registry: not ready
        log.debug("readiness check failed: %r", exc)
        return False, "the registry does not answer"
    return True, ""
