"""Wiring of one agent: config -> cache, driver, agent, publisher, HTTP server.

Used by `thaw agent` (one agent per process) and later by `thaw up` (several
agents in one event loop), so it owns no global state.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from pathlib import Path

import yarl
from aiohttp import web

from agent.adapters.http import build_app
from agent.config import AgentConfig
from agent.drivers import make_driver
from agent.publisher import Publisher
from agent.service import Agent
from agent.supervisor import recover, watch
from ground.auth.signing import Verifier
from ground.registry import Registry
from ground.serving import app_runner
from ground.statefiles import private_dir, write_private
from ground.tasks import cancel_and_wait
from imagecache.api import LayerChange
from imagecache.cache import ImageCache

log = logging.getLogger("thaw.agent")


def load_worker_id(state_dir: Path) -> str:
    """A stable worker id, created on first start and kept in the state dir."""
    path = state_dir / "worker-id"
    if path.exists():
        return path.read_text().strip()
    worker_id = "w-" + secrets.token_hex(4)
    write_private(path, (worker_id + "\n").encode())
    return worker_id


def audience_of(url: str) -> str:
    """The Host a caller of `url` sends, as the signature covers it."""
    return (yarl.URL(url).host_port_subcomponent or "").lower()


class AgentRuntime:
    def __init__(self, config: AgentConfig, registry: Registry) -> None:
        self.config = config
        self.registry = registry
        self.url = ""
        self.agent: Agent | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._publisher: Publisher | None = None

    async def start(self) -> str:
        """Boot (replay + recover), serve the API, start heartbeats; return the API URL."""
        config = self.config
        private_dir(config.state_dir)
        private_dir(config.state_dir / "machines")
        worker_id = config.worker_id or load_worker_id(config.state_dir)
        cache = ImageCache(
            config.state_dir / "images",
            budget_bytes=config.cache_budget_bytes,
            on_change=self._layer_changed,
            policy=config.egress,
        )
        agent = Agent(config, cache=cache, driver=make_driver(config), worker_id=worker_id)
        agent.metrics.watch_cache(cache.stats)
        self.agent = agent
        epoch = agent.boot(repair=config.repair_log)
        assert config.cluster_keys is not None  # checked by the config
        verifier = Verifier(config.cluster_keys, not_before=time.time())
        self._runner = app_runner(build_app(agent, self._publisher_for(agent), verifier))
        await self._runner.setup()
        site = web.TCPSite(self._runner, config.host, config.port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = config.advertise_url or f"http://{config.host}:{port}"
        # Calls signed for another worker's address are refused here (no replay across agents).
        verifier.serve_as(audience_of(self.url))
        publisher = self._publisher_for(agent)
        publisher.url = self.url
        agent.on_change = publisher.machine_changed
        await recover(agent)
        self._tasks = [asyncio.create_task(publisher.run()), asyncio.create_task(watch(agent))]
        log.info("agent %s epoch %d serving %s (driver %s)", worker_id, epoch, self.url,
                 agent.driver.name)
        return self.url

    def _publisher_for(self, agent: Agent) -> Publisher:
        if self._publisher is None:
            self._publisher = Publisher(agent, self.registry, "")
        return self._publisher

    def _layer_changed(self, change: LayerChange) -> None:
        if self._publisher is not None:
            self._publisher.layers_changed()

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        if self.agent is not None:
            self.agent.end_waits()  # a caller's long wait must not hold the stop
        if self._runner is not None:
            await self._runner.cleanup()
        if self.agent is not None:
            await self.agent.close()
            await self.agent.cache.close()
