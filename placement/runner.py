"""Wiring of placement: config -> store, fleet, market, waker, HTTP server.

Used by `thaw placement` and `thaw up` (with agents and the edge in one event
loop), so it owns no global state.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from aiohttp import web

from ground.appconfig import AppConfig
from ground.auth.aiohttp_glue import Signer
from ground.auth.signing import Verifier
from ground.auth.tickets import RouteKeys, advert_seal
from ground.registry import PlacementAdvert, Registry
from ground.serving import app_runner
from ground.statefiles import private_dir
from ground.tasks import cancel_and_wait
from ground.tlscontexts import server_context
from imagecache.adapters.egress import Lookup
from imagecache.resolver import ImageResolver
from placement.adapters.admin import build_admin_app
from placement.adapters.agents import AgentClient, HttpWorkers
from placement.adapters.authn import Authenticator
from placement.adapters.coordination import RedisCoordination
from placement.adapters.http import build_app
from placement.appsecrets import SecretVault
from placement.config import PlacementConfig
from placement.fleet.fleet import Fleet
from placement.fleet.fleetindex import FleetIndex
from placement.metrics import PlacementMetrics
from placement.placer import Placer
from placement.service import Placement
from placement.store import SqlStore, open_store
from placement.tokens import Tokens
from placement.wakes.wakeclaims import WakeClaims
from placement.wakes.waker import Waker

log = logging.getLogger("thaw.placement")
# After a registry loss, the longest the reconciler waits for every worker live before it
# to publish again (a worker that died meanwhile never does): Kubernetes waits ~40 s.
REFILL_BOUND_S = 30.0


class PlacementRuntime:
    def __init__(self, config: PlacementConfig, registry: Registry,
                 lookup: Lookup | None = None,
                 coordination: RedisCoordination | None = None) -> None:
        """`lookup`: host name resolution for image registries (tests stub it; default DNS);
        `coordination`: leases, wake claims and worker failures shared with other
        placements (None: this process's memory, for a platform with one placement)."""
        self.config = config
        self.coordination = coordination
        self.registry = registry
        self.lookup = lookup
        self.url = ""
        self.admin_port = 0
        self.placement: Placement | None = None
        self._runner: web.AppRunner | None = None
        self._admin: web.AppRunner | None = None
        self._store: SqlStore | None = None
        self._resolver: ImageResolver | None = None
        self._agents: AgentClient | None = None
        self._waker: Waker | None = None
        self._placer: Placer | None = None
        self._prewarm: asyncio.Task[None] | None = None
        self._index: FleetIndex | None = None
        self._advert: asyncio.Task[None] | None = None
        self.instance = secrets.token_hex(8)  # this process's id (claims, advert)

    async def start(self) -> str:
        """Open the store, publish every stored app, serve HTTP(S) and the admin listener;
        return the API's base URL."""
        config = self.config
        tls = server_context(config.tls_cert, config.tls_key) if config.tls_cert else None
        private_dir(config.state_dir)
        assert config.cluster_keys is not None  # checked by the config
        metrics = PlacementMetrics()
        self._store = opened = await open_store(
            config.store, config.state_dir, pool_size=config.store_pool_size,
            on_wait=lambda seconds: metrics.waited("store_pool", seconds))
        store = opened.apps
        tokens = Tokens(opened.tokens, store)
        self._agents = AgentClient(config.offer_timeout_s, Signer(config.cluster_keys),
                                   config.agent_connections)
        self._resolver = ImageResolver(config.egress, resolve_timeout_s=config.resolve_timeout_s,
                                       lookup=self.lookup)
        market = config.market()
        workers = HttpWorkers(self._agents)
        fleet = Fleet(self.registry, workers, self._resolver, opened.images,
                      market.heartbeat_freshness_s, config.pull_timeout_s,
                      failure_book=self.coordination, route_keys=config.route_keys,
                      failed_mark_s=config.failed_mark_s)
        self._index = FleetIndex(self.registry, hold_s=market.heartbeat_freshness_s)
        await self._index.start()  # every worker, then the feed: never read per decision
        vault = SecretVault(store, config.secret_keys, config.cluster_keys, time.time)
        placer = Placer(fleet, workers, market, metrics, max_offers=config.max_offers,
                        decisions_kept=config.decisions_kept, index=self._index,
                        seal=vault.sealed_for)
        self._placer = placer
        claims = WakeClaims(self.coordination, self.coordination, self.instance) \
            if self.coordination is not None else WakeClaims()
        self._waker = Waker(fleet, placer, config.wake_margin_ms, store.is_current, claims)
        self.placement = Placement(self.registry, store, tokens, fleet, placer,
                                   self._waker, config.domain, vault,
                                   refill_bound_s=max(REFILL_BOUND_S,
                                                      2 * market.heartbeat_freshness_s),
                                   leases=self.coordination)
        placement = self.placement
        # The stored apps' image tops, computed beside serving (one image per loop turn):
        # at 100,000 workers they take a minute, and a decision meanwhile computes its own.
        stored_apps = await placement.apps()
        self._prewarm = asyncio.create_task(self._prewarmed(placer, stored_apps))
        if rewrapped := await vault.rewrap(stored_apps):
            log.info("secrets: %d re-encrypted under the first key of the secrets key file",
                     rewrapped)
        metrics.watch(lambda: placement.app_names, placement.reconciler)
        self._index.on_worker = self.placement.republisher.heard
        published = await self.placement.republisher.check()
        self.placement.republisher.start()
        self.placement.reconciler.start()
        fleet.shared.start(self.placement.workers_lost)  # marks other placements made
        fleet.watch()  # the registry's run of answers, which lapsed heartbeats are judged on
        verifier = Verifier(config.cluster_keys, not_before=time.time())
        auth = Authenticator(tokens.store, config.admin_token, verifier)
        self._runner = app_runner(build_app(self.placement, metrics, auth))
        await self._runner.setup()
        await web.TCPSite(self._runner, config.host, config.port, ssl_context=tls).start()
        port = self._runner.addresses[0][1]
        self.url = f"{'https' if tls else 'http'}://{config.host}:{port}"
        self._admin = app_runner(build_admin_app(self.placement, metrics))
        await self._admin.setup()
        await web.TCPSite(self._admin, config.admin_host, config.admin_port).start()
        self.admin_port = self._admin.addresses[0][1]
        advertised = advertised_url(config, self.url)
        if advertised and config.route_keys is not None:
            self._advert = asyncio.create_task(self._advertise(advertised, config.route_keys))
        log.info("placement serving %s (%d apps published), admin on %s:%d", self.url,
                 published, config.admin_host, self.admin_port)
        if not config.admin_token and not await tokens.store.list():
            log.warning("no admin token and no stored token: the API refuses every call "
                        "(set THAW_ADMIN_TOKEN or --admin-token-file)")
        return self.url

    async def _advertise(self, url: str, keys: RouteKeys) -> None:
        """This placement's API URL in the registry, sealed, every third of its TTL: edges
        discover it and send it wakes another placement did not answer."""
        advert = PlacementAdvert(self.instance, url, advert_seal(keys, self.instance, url))
        ttl_s = self.config.advertise_ttl_s
        while True:
            try:
                await self.registry.publish_placement(advert, ttl_s)
            except Exception as exc:  # the registry away: the next round publishes it
                log.debug("placement advert not published now: %s", exc)
            await asyncio.sleep(ttl_s / 3)

    @staticmethod
    async def _prewarmed(placer: Placer, configs: list[AppConfig]) -> None:
        began = time.perf_counter()
        try:
            warmed = await placer.prewarm(configs)
        except Exception as exc:  # (the registry away): decisions compute their own
            log.warning("image tops not computed ahead: %s", exc)
            return
        log.info("image tops of %d stored images computed in %.2fs", warmed,
                 time.perf_counter() - began)

    async def stop(self) -> None:
        await cancel_and_wait(self._advert, self._prewarm)
        if self.placement is not None:
            await self.placement.fleet.shared.close()
            await self.placement.fleet.close()
            await self.placement.republisher.close()
            await self.placement.reconciler.close()
        for runner in (self._runner, self._admin):
            if runner is not None:
                await runner.cleanup()
        if self._waker is not None:
            await self._waker.close()
        if self._placer is not None:
            await self._placer.close()
        if self._index is not None:
            await self._index.stop()
        if self._agents is not None:
            await self._agents.close()
        if self._resolver is not None:
            await self._resolver.close()
        if self._store is not None:
            await self._store.close()
        if self.coordination is not None:
            await self.coordination.close()


def advertised_url(config: PlacementConfig, serving: str) -> str:
    """What edges are told to reach this placement at: `advertise_url`, else the URL it
    serves, unless that names a wildcard address (no edge can reach "0.0.0.0")."""
    if config.advertise_url:
        return config.advertise_url.rstrip("/")
    if config.host in ("", "0.0.0.0", "::", "[::]"):  # a wildcard: compared, not bound
        return ""
    return serving
