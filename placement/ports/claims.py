"""The claim book port: what every placement's wakes of an app are starting, and the
edges' demand (placement/wakes/wakeclaims.py says how wakes use it)."""

from __future__ import annotations

from typing import Protocol

from placement.core.claims import Claims


class ClaimBook(Protocol):
    """Where placements publish what their wakes of an app are starting."""

    async def others(self, app: str, me: str) -> Claims:
        """The unexpired claims of every placement but `me`."""
        ...

    async def publish(self, app: str, me: str, claims: Claims, ttl_s: float) -> None:
        """Replace `me`'s claims of `app` (empty: withdraw them)."""
        ...

    async def report(self, app: str, edge: str, demand: int, ttl_s: float) -> int:
        """Replace `edge`'s demand for `app` (requests it holds or has in flight; 0:
        withdraw it) for `ttl_s`; the sum of every edge's unexpired demand, this one's
        included."""
        ...

    async def lapse(self, app: str, edge: str, demand: int, ttl_s: float) -> None:
        """`edge`'s demand for `app` lapses `ttl_s` from now if it is still `demand` (what a
        wake of the edge's said); a value written since (by the edge's load share, as of
        now, or by a later wake) is left as it is, and so is no value."""
        ...
