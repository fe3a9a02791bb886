"""Wiring of placement: config -> store, fleet, market, waker, HTTP server.

Used by `thaw placement` and `thaw up` (with agents and the edge in one event
loop), so it owns no global state.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from imagecache.adapters.egress import Lookup
from imagecache.resolver import ImageResolver
from placement.adapters.agents import AgentClient
from placement.adapters.authn import Authenticator
from placement.adapters.http import build_app
from placement.adapters.store import AppStore, Database, ImageStore
from placement.adapters.tokenstore import TokenStore
from placement.config import PlacementConfig
from placement.fleet import Fleet
from placement.metrics import PlacementMetrics
from placement.placer import Placer
from placement.service import Placement
from placement.tokens import Tokens
from placement.waker import Waker
from thaw.auth.aiohttp_glue import Signer
from thaw.auth.signing import Verifier
from thaw.registry import Registry

log = logging.getLogger("thaw.placement")


class PlacementRuntime:
    def __init__(self, config: PlacementConfig, registry: Registry,
                 lookup: Lookup | None = None) -> None:
        """`lookup`: host name resolution for image registries (tests stub it; default DNS)."""
        self.config = config
        self.registry = registry
        self.lookup = lookup
        self.url = ""
        self.placement: Placement | None = None
        self._runner: web.AppRunner | None = None
        self._database: Database | None = None
        self._resolver: ImageResolver | None = None
        self._agents: AgentClient | None = None
        self._waker: Waker | None = None
        self._placer: Placer | None = None

    async def start(self) -> str:
        """Open the store, publish every stored app, serve HTTP; return the base URL."""
        config = self.config
        config.state_dir.mkdir(parents=True, exist_ok=True)
        assert config.cluster_keys is not None  # checked by the config
        self._database = database = Database(config.state_dir / "apps.sqlite3")
        store = AppStore(database)
        tokens = Tokens(TokenStore(database), store)
        self._agents = AgentClient(config.offer_timeout_s, Signer(config.cluster_keys),
                                   config.agent_connections)
        self._resolver = ImageResolver(config.egress, resolve_timeout_s=config.resolve_timeout_s,
                                       lookup=self.lookup)
        market = config.market()
        metrics = PlacementMetrics()
        fleet = Fleet(self.registry, self._agents, self._resolver, ImageStore(database),
                      market.heartbeat_freshness_s, config.pull_timeout_s)
        placer = Placer(fleet, self._agents, market, metrics, max_offers=config.max_offers,
                        decisions_kept=config.decisions_kept)
        self._placer = placer
        self._waker = Waker(fleet, self._agents, placer, config.wake_margin_ms, store.is_current)
        self.placement = Placement(self.registry, store, tokens, fleet, self._agents, placer,
                                   self._waker, config.domain,
                                   registry_grace_s=2 * market.heartbeat_freshness_s)
        metrics.watch(lambda: {config.name for config in store.list()},
                      self.placement.reconciler)
        published = await self.placement.republisher.check()
        self.placement.republisher.start()
        self.placement.reconciler.start()
        verifier = Verifier(config.cluster_keys, not_before=time.time())
        auth = Authenticator(tokens.store, config.admin_token, verifier)
        self._runner = web.AppRunner(build_app(self.placement, metrics, auth), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, config.host, config.port).start()
        port = self._runner.addresses[0][1]
        self.url = f"http://{config.host}:{port}"
        log.info("placement serving %s (%d apps published)", self.url, published)
        if not config.admin_token and not tokens.store.list():
            log.warning("no admin token and no stored token: the API refuses every call "
                        "(set THAW_ADMIN_TOKEN or --admin-token-file)")
        return self.url

    async def stop(self) -> None:
        if self.placement is not None:
            await self.placement.republisher.close()
            await self.placement.reconciler.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._waker is not None:
            await self._waker.close()
        if self._placer is not None:
            await self._placer.close()
        if self._agents is not None:
            await self._agents.close()
        if self._resolver is not None:
            await self._resolver.close()
        if self._database is not None:
            self._database.close()
