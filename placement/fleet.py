"""What placement knows of the fleet: live workers (registry), machines (agents), images.

Images are resolved here (manifest only, through the image cache's egress-checked
resolver) to pin digests and learn layer sizes for scoring; workers pull them.
The registry is advisory. Where it matters — which machines of an app exist and
in which state — the agents that hold them are asked; the registry only says
which agents to ask (plus the machines this placement created itself, which the
registry may not show yet).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from imagecache.errors import ImageError
from imagecache.resolver import ImageResolver
from placement.adapters.agents import AgentClient, AgentUnreachable
from placement.errors import AgentReplied, NotFound, PlacementError, Unavailable
from thaw.appconfig import AppConfig, InvalidConfig
from thaw.registry import Registry, WorkerStatus

REFUSED_IMAGE = frozenset({"bad_reference", "forbidden_host"})  # the owner's reference: 422


@dataclass(frozen=True)
class ImageInfo:
    ref: str
    digest: str
    layers: dict[str, int]  # layer digest -> compressed bytes


def offer_ref(config: AppConfig) -> str:
    """The image reference machines are created from: pinned to the digest where the
    reference syntax allows it (registry refs; OCI layout refs are addressed by tag)."""
    if config.image_digest and not config.image.startswith("oci:") and "@" not in config.image:
        return f"{config.image}@{config.image_digest}"
    return config.image


class Fleet:
    def __init__(
        self,
        registry: Registry,
        agents: AgentClient,
        resolver: ImageResolver,
        freshness_s: float,
        pull_timeout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.agents = agents
        self.resolver = resolver
        self.freshness_s = freshness_s
        self.pull_timeout_s = pull_timeout_s
        self.clock = clock
        self.known: dict[str, tuple[str, str]] = {}  # machine id -> (app, worker id)
        self._images: dict[tuple[str, str], ImageInfo] = {}

    async def workers(self, region: str | None = None) -> list[WorkerStatus]:
        return await self.registry.workers(region)

    async def live_workers(self, region: str | None = None) -> dict[str, WorkerStatus]:
        """Workers with a fresh heartbeat, not draining, by id."""
        now = self.clock()
        return {
            w.id: w
            for w in await self.registry.workers(region)
            if now - w.updated_at <= self.freshness_s and not w.draining
        }

    async def worker_url(self, worker_id: str) -> str:
        for worker in await self.registry.workers():
            if worker.id == worker_id:
                return worker.url
        raise Unavailable(f"worker {worker_id} is not available", code="worker_unavailable")

    def remember(self, app: str, view: dict[str, Any]) -> None:
        self.known[view["id"]] = (app, view["worker"])

    async def app_workers(self, app: str) -> set[str]:
        workers = {record.worker for record in await self.registry.machines(app)}
        workers.update(w for a, w in self.known.values() if a == app)
        return workers

    async def registered_machines(self, app: str) -> list[dict[str, Any]]:
        """The app's machines as the registry last heard of them (no agent round trip).
        Advisory: a stale entry costs a refused start, never a wrong result."""
        return [
            {"id": r.id, "worker": r.worker, "state": r.state, "address": r.address,
             "created_at": r.created_at}
            for r in await self.registry.machines(app)
        ]

    async def app_machines(
        self, app: str, workers: dict[str, WorkerStatus] | None = None
    ) -> list[dict[str, Any]]:
        """The app's machines as their agents report them (machine views, JSON)."""
        if workers is None:
            workers = {w.id: w for w in await self.registry.workers()}
        asked = [workers[w] for w in sorted(await self.app_workers(app)) if w in workers]
        replies = await asyncio.gather(
            *(self._machines_on(w.url, app) for w in asked), return_exceptions=True
        )
        views: list[dict[str, Any]] = []
        for reply in replies:
            if isinstance(reply, list):
                views.extend(reply)
        for view in views:
            self.remember(app, view)
        return views

    async def _machines_on(self, url: str, app: str) -> list[dict[str, Any]]:
        status, body = await self.agents.call("GET", url, "/v1/machines", params={"app": app})
        return body if status == 200 and isinstance(body, list) else []

    async def locate(self, app: str, machine_id: str) -> str:
        """The URL of the agent that owns `machine_id` of `app`; 404 for another app's."""
        worker = next(
            (r.worker for r in await self.registry.machines(app) if r.id == machine_id), None
        )
        if worker is None and self.known.get(machine_id, ("", ""))[0] == app:
            worker = self.known[machine_id][1]
        if worker is None:
            raise NotFound(f"machine {machine_id} of app {app} not found")
        return await self.worker_url(worker)

    async def image(self, config: AppConfig) -> ImageInfo:
        """The image's digest and layer list, resolved once and kept."""
        cached = self._images.get((offer_ref(config), config.image_digest))
        return cached if cached is not None else await self.resolve(config)

    async def resolve(self, config: AppConfig) -> ImageInfo:
        """Resolve the config's image now: 422 (InvalidConfig `image`) for a reference the
        egress policy refuses, 424 `image_unavailable` for one that does not resolve."""
        ref = offer_ref(config)
        try:
            resolved = await self.resolver.resolve(ref)
        except ImageError as exc:
            if exc.code in REFUSED_IMAGE:
                raise InvalidConfig("image", exc.message) from None
            raise PlacementError(f"image {config.image} cannot be resolved: {exc.message}",
                                 code="image_unavailable", status=424) from None
        info = ImageInfo(ref=ref, digest=resolved.digest,
                         layers={layer.digest: layer.size for layer in resolved.layers})
        self._images[(ref, config.image_digest)] = info
        self._images[(ref, info.digest)] = info
        return info

    def keep(self, config: AppConfig, info: ImageInfo) -> None:
        """Remember an image pulled elsewhere (deploy) under the config's pinned reference."""
        ref = offer_ref(config)
        self._images[(ref, config.image_digest)] = replace(info, ref=ref)

    async def pull(self, url: str, ref: str) -> ImageInfo:
        try:
            status, body = await self.agents.call(
                "POST", url, "/v1/images/pull", {"ref": ref}, timeout_s=self.pull_timeout_s
            )
        except AgentUnreachable as exc:
            raise Unavailable(exc.message, code="worker_unreachable") from None
        if status != 200:
            raise AgentReplied(status, body)
        layers = {layer["digest"]: int(layer["size"]) for layer in body.get("layers", [])}
        return ImageInfo(ref=ref, digest=body["digest"], layers=layers)

    async def held_bytes(self, image: ImageInfo) -> dict[str, int]:
        """worker id -> bytes of this image's layers it holds (the inverted index)."""
        held: dict[str, int] = {}
        for digest, size in image.layers.items():
            for worker in await self.registry.layer_holders(digest):
                held[worker] = held.get(worker, 0) + size
        return held
