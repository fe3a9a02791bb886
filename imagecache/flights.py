"""Single flight: one run of a piece of work per key at a time, shared by its callers.

One download per blob digest, one build per manifest digest: a caller that
finds a run in flight awaits that run instead of starting another. A caller
that is cancelled stops waiting; the run goes on for the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Flights = dict[str, asyncio.Future[None]]  # key -> the run in flight


async def single_flight(flights: Flights, key: str, start: Callable[[], Awaitable[None]]) -> None:
    """Run `start()` once per key at a time; every concurrent caller awaits the same run."""
    flight = flights.get(key)
    if flight is None:
        flight = asyncio.ensure_future(start())
        flights[key] = flight
        flight.add_done_callback(lambda _: flights.pop(key, None))
    await asyncio.shield(flight)
