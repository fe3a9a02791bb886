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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from msgspec.structs import replace as replace_struct

from imagecache.errors import ImageError
from imagecache.resolver import ImageResolver
from placement.adapters.agents import AgentClient, AgentUnreachable
from placement.core.failures import WorkerFailures
from placement.errors import AgentReplied, NotFound, PlacementError, Unavailable
from placement.failuresync import FailureBook, FailureSync
from thaw.appconfig import AppConfig, InvalidConfig
from thaw.auth.tickets import RecordCheck, RouteKeys
from thaw.registry import MachineRecord, Registry, WorkerStatus

REFUSED_IMAGE = frozenset({"bad_reference", "forbidden_host"})  # the owner's reference: 422
MAX_IMAGES_KEPT = 4096
PROBE_TIMEOUT_S = 1.0  # placement's own look at an agent an edge reported
log = logging.getLogger("thaw.placement")


class PinnedImages(Protocol):
    """Where the layer lists of pinned images are kept (placement's store)."""

    async def layers(self, digest: str) -> dict[str, int] | None: ...

    async def keep(self, digest: str, layers: dict[str, int]) -> None: ...


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
        pinned: PinnedImages,
        freshness_s: float,
        pull_timeout_s: float,
        clock: Callable[[], float] = time.time,
        failure_book: FailureBook | None = None,
        route_keys: RouteKeys | None = None,
    ) -> None:
        """`failure_book`: edges' reports and failure marks shared with other placements
        (placement/failuresync.py; None: this placement judges alone); `route_keys`: make
        machines' tickets, and read only machine records sealed with one (None: every
        record is taken, as before)."""
        self.routes = RecordCheck(route_keys)
        self.registry = registry
        self.agents = agents
        self.resolver = resolver
        self.pinned = pinned
        self.freshness_s = freshness_s
        self.pull_timeout_s = pull_timeout_s
        self.clock = clock
        # machine id -> (app, worker id, app uid): machines this placement made or saw
        self.known: dict[str, tuple[str, str, str]] = {}
        self._images: dict[tuple[str, str], ImageInfo] = {}  # bounded: MAX_IMAGES_KEPT
        self.failures = WorkerFailures(time.monotonic)
        self.shared = FailureSync(self.failures, failure_book)

    async def workers(self, region: str | None = None) -> list[WorkerStatus]:
        return await self.registry.workers(region)

    async def live_workers(self, region: str | None = None) -> dict[str, WorkerStatus]:
        """Workers with a fresh heartbeat, not draining, not failed, by id."""
        return {w.id: w for w in await self.registry.workers(region) if self._live(w)}

    def _live(self, w: WorkerStatus) -> bool:
        return (self.clock() - w.updated_at <= self.freshness_s and not w.draining
                and self.failures.failed(w.id, w.epoch) is None)

    async def suspect(self, worker_id: str, reporter: str,
                      machine: str) -> tuple[bool, bool, str]:
        """An edge could not connect to `machine` on `worker_id`: (failed, newly, why).
        Placement's own probe of the agent failing, or two edges' reports about two
        machines (heard by any placement), confirm it (core/failures, failuresync)."""
        status = next((w for w in await self.registry.workers() if w.id == worker_id), None)
        if status is None or self.clock() - status.updated_at > self.freshness_s:
            return True, False, "its heartbeat lapsed"
        mark = self.failures.failed(status.id, status.epoch)
        if mark is not None:
            return True, False, mark.reason
        try:
            code, _ = await self.agents.call("GET", status.url, "/healthz",
                                             timeout_s=PROBE_TIMEOUT_S)
        except AgentUnreachable as exc:
            reason = f"its agent does not answer either: {exc.message}"
        else:
            if not await self.shared.report(worker_id, status.epoch, reporter, machine):
                return False, False, f"its agent answers ({code})"
            reason = "two edges could not connect to two of its machines"
        return True, await self.shared.fail(status.id, status.epoch, reason), reason

    async def worker_url(self, worker_id: str) -> str:
        for worker in await self.registry.workers():
            if worker.id == worker_id:
                return worker.url
        raise Unavailable(f"worker {worker_id} is not available", code="worker_unavailable")

    def remember(self, app: str, view: dict[str, Any]) -> None:
        self.known[view["id"]] = (app, view["worker"], view.get("app_uid", ""))

    async def sealed_machines(self, app: str) -> list[MachineRecord]:
        """The app's machine records that are sealed by their worker's ticket (all of them
        without route keys): a worker's agent can write any app's records, but seal only
        those of machines placed on it (thaw/auth/tickets.py)."""
        return [r for r in await self.registry.machines(app) if self.routes.admits(r)]

    async def app_workers(self, app: str) -> set[str]:
        """The workers to ask about `app`'s machines: those named by any record of it,
        sealed or not (a worker's answer is its own truth, so a forged record costs one
        more question; an unsealed record of a machine made before the route key, or of
        another incarnation of the name, still gets its machine found and destroyed)."""
        workers = {record.worker for record in await self.registry.machines(app)}
        workers.update(w for a, w, _ in self.known.values() if a == app)
        return workers

    async def registered_machines(self, config: AppConfig) -> list[dict[str, Any]]:
        """The app's machines as the registry last heard of them (no agent round trip).
        Advisory: a stale entry costs a refused start, never a wrong result."""
        return [
            {"id": r.id, "worker": r.worker, "state": r.state, "address": r.address,
             "created_at": r.created_at, "release": r.release, "image_digest": r.image_digest}
            for r in await self.sealed_machines(config.name) if r.app_uid == config.uid
        ]

    async def own_machines(self, config: AppConfig) -> list[dict[str, Any]]:
        """The machines of this app — this incarnation of the name — from their agents."""
        return [v for v in await self.app_machines(config.name)
                if v.get("app_uid", "") == config.uid]

    async def app_machines(
        self, app: str, workers: dict[str, WorkerStatus] | None = None
    ) -> list[dict[str, Any]]:
        """Every machine named for `app` as their agents report them (machine views,
        JSON), whatever incarnation of the name made them (see `own_machines`)."""
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

    async def locate(self, config: AppConfig, machine_id: str) -> str:
        """The URL of the agent that owns `machine_id` of this app (this incarnation of
        the name); 404 for any other machine."""
        app = config.name
        worker = next((r.worker for r in await self.sealed_machines(app)
                       if r.id == machine_id and r.app_uid == config.uid), None)
        known_app, known_worker, known_uid = self.known.get(machine_id, ("", "", ""))
        if worker is None and (known_app, known_uid) == (app, config.uid):
            worker = known_worker
        if worker is None:
            raise NotFound(f"machine {machine_id} of app {app} not found")
        return await self.worker_url(worker)

    async def image(self, config: AppConfig) -> ImageInfo:
        """The pinned image's digest and layer list, for a wake: from memory, else from
        what was kept when it was pinned; never from a registry, which may be slow or down
        while workers hold the layers. Unknown (an app pinned before layers were kept),
        it is placed without the layers term; the worker's pull says if the image is gone."""
        ref = offer_ref(config)
        cached = self._images.get((ref, config.image_digest))
        if cached is not None:
            return cached
        layers = await self.pinned.layers(config.image_digest) if config.image_digest else None
        if layers is None:
            log.warning("image %s of app %s: layers unknown, placed by resources only",
                        ref, config.name)
        info = ImageInfo(ref=ref, digest=config.image_digest, layers=layers or {})
        self._remember_image((ref, config.image_digest), info)
        return info

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
        if not resolved.config.argv_with(config.entrypoint, config.cmd):
            raise InvalidConfig("image", f"{config.image} has no Entrypoint or Cmd, and the "
                                "app sets neither `entrypoint` nor `cmd`: nothing to run")
        return ImageInfo(ref=ref, digest=resolved.digest,
                         layers={layer.digest: layer.size for layer in resolved.layers})

    async def keep(self, config: AppConfig, info: ImageInfo) -> None:
        """Remember an image resolved at create or deploy under the config's pinned
        reference, durably, so that a wake never resolves it."""
        await self.pinned.keep(info.digest, info.layers)
        self._remember_image((offer_ref(config), config.image_digest), replace(
            info, ref=offer_ref(config)))

    def _remember_image(self, key: tuple[str, str], info: ImageInfo) -> None:
        if len(self._images) >= MAX_IMAGES_KEPT:
            self._images.pop(next(iter(self._images)))  # the oldest
        self._images[key] = info

    async def destroy(self, mid: str, *, worker: str = "", url: str = "") -> tuple[int, Any]:
        """DELETE machine `mid` at its agent (by `url`, or the live `worker`'s): the agent's
        (status, body), or (0, {"message": ...}) when no agent answers."""
        try:
            url = url or await self.worker_url(worker)
            return await self.agents.call("DELETE", url, f"/v1/machines/{mid}")
        except (AgentUnreachable, Unavailable) as exc:
            return 0, {"message": exc.message}

    async def start(self, url: str, mid: str, wait_s: float,
                    slack_s: float = 1.0) -> tuple[int, Any]:
        """Start machine `mid` at its agent and wait (at most `wait_s`) until it is started
        — one round trip: the agent answers once it is (or 408/409). The agent's
        (status, body), or (0, {"message": ...}) when no agent answers in time."""
        try:
            return await self.agents.call("POST", url, f"/v1/machines/{mid}/start",
                                          params={"wait_s": f"{min(wait_s, 300.0):.3f}"},
                                          timeout_s=wait_s + slack_s)
        except AgentUnreachable as exc:
            return 0, {"message": exc.message}

    async def mark(self, app: str, mid: str, state: str, at: float) -> None:
        """Rewrite the registry's record of `mid` as `state` (no address) as of `at`, so
        edges stop routing to it; advisory: a failure is logged, the caller goes on. Only a
        sealed record is rewritten (sealed again: placement holds the route keys)."""
        try:
            for record in await self.sealed_machines(app):
                if record.id == mid:
                    marked = replace_struct(record, state=state, address="", updated_at=at)
                    await self.registry.put_machine(
                        replace_struct(marked, seal=self.routes.resealed(marked)))
        except Exception as exc:
            log.warning("could not mark machine %s %s in the registry: %s", mid, state, exc)

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
