"""Wiring of placement: config -> store, fleet, market, waker, HTTP server.

Used by `thaw placement` and `thaw up` (with agents and the edge in one event
loop), so it owns no global state.
"""

from __future__ import annotations

import logging

from aiohttp import web

from placement.adapters.agents import AgentClient
from placement.adapters.http import build_app
from placement.adapters.store import AppStore
from placement.config import PlacementConfig
from placement.fleet import Fleet
from placement.metrics import PlacementMetrics
from placement.placer import Placer
from placement.service import Placement
from placement.waker import Waker
from thaw.registry import Registry

log = logging.getLogger("thaw.placement")


class PlacementRuntime:
    def __init__(self, config: PlacementConfig, registry: Registry) -> None:
        self.config = config
        self.registry = registry
        self.url = ""
        self.placement: Placement | None = None
        self._runner: web.AppRunner | None = None
        self._store: AppStore | None = None
        self._agents: AgentClient | None = None
        self._waker: Waker | None = None
        self._placer: Placer | None = None

    async def start(self) -> str:
        """Open the store, publish every stored app, serve HTTP; return the base URL."""
        config = self.config
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self._store = AppStore(config.state_dir / "apps.sqlite3")
        self._agents = AgentClient(config.offer_timeout_s)
        market = config.market()
        metrics = PlacementMetrics()
        fleet = Fleet(self.registry, self._agents, market.heartbeat_freshness_s,
                      config.pull_timeout_s)
        placer = Placer(fleet, self._agents, market, metrics, max_offers=config.max_offers,
                        decisions_kept=config.decisions_kept)
        self._placer = placer
        self._waker = Waker(fleet, self._agents, placer, config.wake_margin_ms)
        self.placement = Placement(self.registry, self._store, fleet, self._agents, placer,
                                   self._waker)
        published = await self.placement.publish_all()
        self._runner = web.AppRunner(build_app(self.placement, metrics), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, config.host, config.port).start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{config.host}:{port}"
        log.info("placement serving %s (%d apps published)", self.url, published)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._waker is not None:
            await self._waker.close()
        if self._placer is not None:
            await self._placer.close()
        if self._agents is not None:
            await self._agents.close()
        if self._store is not None:
            self._store.close()
