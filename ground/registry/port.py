"""The registry port: what services need of the shared view. Two backends implement it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Protocol

from ground.appconfig import AppConfig
from ground.registry.types import (
    ROUTES,
    Change,
    Feed,
    MachineRecord,
    PlacementAdvert,
    WorkerStatus,
)


class Registry(Protocol):
    """All writes are idempotent whole-record puts: a retried write changes nothing."""

    async def publish_worker(self, status: WorkerStatus, ttl_s: float) -> str:
        """Upsert a heartbeat that expires after `ttl_s` unless refreshed; answers the
        registry's generation (as `generation()` would), so that a worker notices a lost
        view on the heartbeat itself.

        A status whose epoch is lower than the stored one is ignored (fencing).
        """
        ...

    async def workers(self, region: str | None = None) -> list[WorkerStatus]: ...

    async def worker(self, worker_id: str) -> WorkerStatus | None:
        """One worker's live heartbeat (None: none, or it lapsed): what an edge reads to
        reach the agent of a machine it thaws itself. Changes nothing."""
        ...

    async def set_worker_layers(self, worker_id: str, layers: dict[str, int]) -> None:
        """Replace the layer set (digest -> bytes) a worker holds; updates the inverted index."""
        ...

    async def layer_holders(self, digest: str) -> dict[str, int]:
        """worker id -> size for every worker holding `digest`."""
        ...

    async def put_machine(self, record: MachineRecord) -> None:
        """Upsert; a record older (updated_at) than the stored one is ignored."""
        ...

    async def delete_machine(self, app: str, machine_id: str) -> None: ...

    async def machines(self, app: str) -> list[MachineRecord]: ...

    async def machines_of(self, apps: Iterable[str]) -> dict[str, list[MachineRecord]]:
        """`machines(app)` for each of `apps` that has any (an app with none is left out),
        read in a few round trips whatever their number: what a full load of the view
        reads."""
        ...

    async def put_app(self, config: AppConfig) -> None:
        """Upsert; a config with a lower `version` than the stored one is ignored."""
        ...

    async def put_apps(self, configs: Sequence[AppConfig]) -> None:
        """`put_app` of each, in a few round trips whatever their number (each guarded by
        its own `version`, each a change of its own): how placement refills a lost view."""
        ...

    async def app(self, name: str) -> AppConfig | None: ...

    async def apps(self) -> list[AppConfig]: ...

    async def delete_app(self, name: str) -> None: ...

    async def publish_placement(self, advert: PlacementAdvert, ttl_s: float) -> None:
        """Upsert a placement's advert, gone after `ttl_s` unless published again."""
        ...

    async def placements(self) -> list[PlacementAdvert]:
        """The adverts not expired, by id (not checked here: see PlacementAdvert.seal)."""
        ...

    async def generation(self) -> str:
        """The name of this incarnation of the shared view, created by the first call that
        finds none. It changes when the view was lost (a Redis restarted empty, or
        flushed): whoever sees a new one publishes again what it owns."""
        ...

    def on_connect(self, callback: Callable[[], None]) -> None:
        """Call `callback` (no arguments, at once, cheaply) each time a connection to the
        shared view is made or made again: after a restart the view may be a new, empty
        one, so whoever keeps something published there checks its generation then,
        instead of asking every second. The memory backend, never lost, never calls it."""
        ...

    async def mark_republished(self, generation: str) -> None:
        """Say that every stored app is published again under `generation` (a change of
        kind "republished"); nothing when `generation` is no longer the current one."""
        ...

    async def republished(self) -> str:
        """The generation last marked republished ("" when none: the view was just lost,
        or no placement has finished refilling it)."""
        ...

    async def feed_position(self, feed: Feed = ROUTES) -> str:
        """The position of `feed`'s newest change: take it *before* a full load, then
        follow `changes(after=position, feed=feed)` so that nothing written in between is
        missed."""
        ...

    def changes(self, after: str | None = None, block_s: float | None = None,
                feed: Feed = ROUTES) -> AsyncIterator[Change]:
        """`feed`'s changes after `after` (None: from when the iterator first runs),
        forever. `block_s`: how long one read waits for a change before it asks again
        (None: the backend's default, a second for Redis; longer costs a quiet follower
        fewer round trips, and an unanswering registry is noticed that much later).
        ROUTES carries app, machine and republished changes; WORKERS worker and layers
        changes (types.feed_of)."""
        ...

    def with_own_connections(self) -> Registry:
        """This registry on connections of its own, for a caller that must not queue
        behind everyone else's calls (placement's refill, with 2,000 apps' reconcile
        passes waiting for connections); closed apart. The memory backend: itself."""
        ...

    async def close(self) -> None: ...
