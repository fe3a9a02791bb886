"""Wiring of one edge: config + registry -> view, feed, Edge, proxy and admin listeners.

Runs on the current event loop (uvloop when the CLI picks it, the default loop
in `thaw up` and tests), and owns no global state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import cast

from aiohttp import web

from edge.adapters.admin import build_admin_app
from edge.adapters.http1 import ClientConnection
from edge.adapters.nftwall import NftWall, WallError
from edge.adapters.registry_feed import RegistryFeed
from edge.adapters.thaw import AgentThaw
from edge.adapters.tls import TlsDoor
from edge.config import EdgeConfig
from edge.core.forwarding import parse_networks
from edge.core.placementorder import trusted_urls
from edge.loadshare import LoadBoard, LoadShare
from edge.service import Edge
from edge.view import View
from ground.registry import Registry
from ground.registry.readiness import registry_answers
from ground.serving import app_runner
from ground.tasks import cancel_and_wait

log = logging.getLogger("thaw.edge")

STALE_SWEEP_S = 5.0
DISCOVER_INTERVAL_S = 5.0  # placements' adverts read again (they live 15 s)


class EdgeRuntime:
    def __init__(self, config: EdgeConfig, registry: Registry,
                 board: LoadBoard | None = None) -> None:
        """`board`: where edges share their machines' loads (edge/loadshare.py; None: one
        edge, which counts its own)."""
        self.config = config
        self.registry = registry
        self.board = board
        self.edge: Edge | None = None
        self._feed: RegistryFeed | None = None
        self._server: asyncio.Server | None = None
        self._tls_door: TlsDoor | None = None
        self._wall: NftWall | None = None
        self._tls_port = 0
        self._admin: web.AppRunner | None = None
        self._proxy_port = 0
        self._admin_port = 0
        self._janitor: asyncio.Task[None] | None = None
        self._discovery: asyncio.Task[None] | None = None

    @property
    def load_share(self) -> LoadShare | None:
        return self.edge.load_share if self.edge is not None else None

    @property
    def proxy_port(self) -> int:
        return self._proxy_port

    @property
    def tls_port(self) -> int:
        return self._tls_port

    @property
    def admin_port(self) -> int:
        return self._admin_port

    async def start(self) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        view = View(config.domain, loop.time)
        edge = Edge(config, view)
        if config.direct_thaw:
            assert config.cluster_keys is not None  # checked by the config
            edge.cold.thaw = AgentThaw(config.cluster_keys, self.registry.worker,
                                       edge.route_guard)
        if config.route_keys is None:
            log.warning("no route key: machine records are not verified (any agent's Redis "
                        "user can route any app); docs/security.md")
        self.edge = edge
        self._feed = RegistryFeed(view, self.registry, config.resync_interval_s)
        try:
            await self._feed.load()
        except Exception as exc:
            log.warning("registry unavailable at start, starting with an empty view: %s", exc)
        self._feed.start()
        self._server = await loop.create_server(
            lambda: cast(asyncio.Protocol, ClientConnection(edge)), config.host, config.port,
            backlog=4096, reuse_address=True,
        )
        self._proxy_port = self._server.sockets[0].getsockname()[1]
        if config.tls is not None:
            self._tls_door = TlsDoor(edge, config.tls, config.h2, config.host)
            self._tls_port = await self._tls_door.start()
        if config.nft_table:
            await self._raise_wall(edge)
        self._admin = app_runner(build_admin_app(edge, self.ready, self._feed.state))
        await self._admin.setup()
        site = web.TCPSite(self._admin, config.admin_host, config.admin_port)
        await site.start()
        self._admin_port = self._admin.addresses[0][1]
        edge.autostop.start()
        if self.board is not None:
            edge.share_loads(self.board).start()
        self._janitor = asyncio.create_task(self._sweep_stale())
        if config.discover_placements and config.route_keys is not None:
            self._discovery = asyncio.create_task(self._discover(edge))
        elif config.discover_placements:
            log.info("no route key: placements are not discovered from the registry (only "
                     "--placement URLs are asked)")
        log.info("edge proxy on %s:%d%s, admin on %s:%d", config.host, self._proxy_port,
                 f", TLS on :{self._tls_port}" if self._tls_door else "", config.admin_host,
                 self._admin_port)

    async def _raise_wall(self, edge: Edge) -> None:
        """The kernel drops barred clients and SYN floods to this edge's ports."""
        config = self.config
        wall = NftWall(config.nft_table)
        ports = [self._proxy_port] + ([self._tls_port] if self._tls_door else [])
        try:
            await wall.install(ports, config.new_conns_per_s, config.new_conns_burst,
                               parse_networks(config.trusted_proxies))
        except WallError:
            await self.stop()
            raise
        self._wall = wall
        edge.bar_in_kernel = wall.bar

    async def ready(self) -> tuple[bool, str]:
        """Ready to take traffic: not stopping, the view loaded from the registry, and the
        registry answering now. (Not ready, the edge still serves what its view routes.)"""
        if self.edge is None or self.edge.closing:
            return False, "stopping"
        if self._feed is None or not self._feed.loaded:
            return False, "the view is not loaded from the registry yet"
        return await registry_answers(self.registry.generation())

    async def _discover(self, edge: Edge) -> None:
        """Every DISCOVER_INTERVAL_S, the placements that advertise themselves in the
        registry, sealed with the route key, join those wakes may go to; one whose advert
        lapsed leaves (the given ones stay)."""
        while True:
            try:
                adverts = await self.registry.placements()
            except Exception as exc:  # the registry away: keep the last list
                log.debug("placements not discovered now: %s", exc)
            else:
                edge.placement.set_discovered(trusted_urls(adverts, self.config.route_keys))
            await asyncio.sleep(DISCOVER_INTERVAL_S)

    async def _sweep_stale(self) -> None:
        while True:
            await asyncio.sleep(STALE_SWEEP_S)
            if self.edge is not None:
                self.edge.pool.close_stale()

    async def stop(self) -> None:
        edge = self.edge
        if self._server is not None:
            self._server.close()
        if self._tls_door is not None:
            await self._tls_door.stop()
        if edge is not None:
            await edge.stop_serving()
            await self._drain(edge)
            await edge.close()
        await cancel_and_wait(self._janitor, self._discovery,
                              *(edge.tasks if edge else ()), errors=False)
        if edge is not None and edge.load_share is not None:
            await edge.load_share.close()
        if self.board is not None:
            await self.board.close()
        if self._feed is not None:
            await self._feed.stop()
        if self._admin is not None:
            await self._admin.cleanup()
        if edge is not None:
            edge.pool.close_all()
        await self._closed()

    async def _closed(self) -> None:
        """The listening sockets gone, then the kernel's wall in front of them."""
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
        if self._wall is not None:
            await self._wall.remove()
            self._wall = None

    async def _drain(self, edge: Edge) -> None:
        """Idle connections close now; busy ones get `shutdown_grace_s` to finish."""
        deadline = edge.loop.time() + self.config.shutdown_grace_s
        while True:
            busy = [c for c in list(edge.connections) if not c.close_if_idle()]
            if not busy or edge.loop.time() >= deadline:
                break
            await asyncio.sleep(0.02)
        for conn in list(edge.connections):
            conn.abort_transport()
