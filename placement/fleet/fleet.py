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
from typing import Protocol

from msgspec.structs import replace as replace_struct

from agent.api import HealthView, MachineView
from ground.appconfig import AppConfig, InvalidConfig
from ground.auth.tickets import RecordCheck, RouteKeys
from ground.periodic import Periodic
from ground.registry import MachineRecord, Registry, WorkerStatus
from ground.tasks import cancel_and_wait
from imagecache.errors import ImageError
from imagecache.resolver import ImageResolver
from placement.core.failures import WorkerFailures
from placement.core.liveness import Beat, Judgement, Liveness
from placement.errors import NotFound, PlacementError, Unavailable, worker_said
from placement.fleet.failuresync import FailureSync
from placement.ports.failures import FailureBook
from placement.ports.workers import Refused, Unreachable, Workers

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
        workers: Workers,
        resolver: ImageResolver,
        pinned: PinnedImages,
        freshness_s: float,
        pull_timeout_s: float,
        clock: Callable[[], float] = time.time,
        failure_book: FailureBook | None = None,
        route_keys: RouteKeys | None = None,
        failed_mark_s: float = 30.0,
    ) -> None:
        """`failure_book`: edges' reports and failure marks shared with other placements
        (placement/fleet/failuresync.py; None: this placement judges alone); `route_keys`: make
        machines' tickets, and read only machine records sealed with one (None: every
        record is taken, as before); `failed_mark_s`: how long a failure mark holds
        (core/failures.py)."""
        self.routes = RecordCheck(route_keys)
        self.registry = registry
        self.agents = workers  # the Workers port (placement/ports/workers.py)
        self.resolver = resolver
        self.pinned = pinned
        self.freshness_s = freshness_s
        self.pull_timeout_s = pull_timeout_s
        self.clock = clock
        # machine id -> (app, worker id, app uid): machines this placement made or saw
        self.known: dict[str, tuple[str, str, str]] = {}
        self._images: dict[tuple[str, str], ImageInfo] = {}  # bounded: MAX_IMAGES_KEPT
        self.failures = WorkerFailures(time.monotonic, failed_for_s=failed_mark_s)
        self.shared = FailureSync(self.failures, failure_book)
        # Heartbeats judged on evidence that the registry answered (core/liveness): its
        # reads are timed on placement's own clock, and read every half heartbeat.
        self.liveness = Liveness(freshness_s, max_gap_s=freshness_s / 2)
        self.statuses: dict[str, WorkerStatus] = {}  # every known worker, as last read
        self._answers: dict[str, tuple[int, float]] = {}  # worker -> (epoch, at) of probes
        self._watch = Periodic("registry not answering", self._look, freshness_s / 6, log)
        self._reading: asyncio.Task[list[WorkerStatus]] | None = None  # the read under way

    def watch(self) -> None:
        """Read the workers' heartbeats every half heartbeat: the registry's run of
        answers is the evidence a lapsed heartbeat is judged on."""
        self._watch.start()

    async def close(self) -> None:
        await self._watch.close()
        if self._reading is not None:
            await cancel_and_wait(self._reading, errors=False)

    async def _look(self) -> None:
        await self.workers()

    async def workers(self, region: str | None = None) -> list[WorkerStatus]:
        """The workers in the registry now (a read timed for `liveness`). Callers that ask
        while a read is under way share it: a herd of wakes and the passes after them
        asked ~3 times a wake, each a round trip and its decoding (docs/placement.md)."""
        if self._reading is None:
            self._reading = asyncio.create_task(self._read_workers())
            self._reading.add_done_callback(self._read_done)
        reading = self._reading
        try:
            found = await asyncio.shield(reading)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if reading.cancelled() and me is not None and not me.cancelling():
                # close() ended a read this caller shared; the caller was not cancelled
                raise Unavailable("placement is shutting down: the workers were not read"
                                  ) from None
            raise
        return [w for w in found if region is None or w.region == region]

    def _read_done(self, task: asyncio.Task[list[WorkerStatus]]) -> None:
        if self._reading is task:
            self._reading = None
        if not task.cancelled():
            task.exception()  # retrieved: each caller sharing it has it raised

    async def _read_workers(self) -> list[WorkerStatus]:
        started = time.monotonic()
        try:
            found = await self.registry.workers()
        except Exception:
            self.liveness.unanswered()
            raise
        self.liveness.answered((Beat(w.id, w.epoch, w.updated_at) for w in found),
                               started, time.monotonic())
        self.statuses.update((w.id, w) for w in found)
        return found

    async def judged(self) -> Judgement:
        """Every known worker live, in doubt or failed (core/liveness), read now."""
        await self.workers()
        judgement = self.liveness.judge(time.monotonic())
        for worker in set(self.statuses) - set(self.liveness.known):
            del self.statuses[worker]
        return judgement

    async def live_workers(self, region: str | None = None) -> dict[str, WorkerStatus]:
        """Workers where new machines may go: a fresh heartbeat, not draining, not failed,
        by id."""
        judgement = await self.judged()
        return {w: s for w in judgement.live if self._usable(s := self.statuses[w])
                and (region is None or s.region == region)}

    async def standing_workers(self) -> tuple[dict[str, WorkerStatus], dict[str, WorkerStatus]]:
        """(live, standing): the live workers, and those whose machines still count as they
        were last seen — live, in doubt (lapsed while the registry did not answer, or with
        many others at once), or lapsed while it answered but whose agent answers a probe
        under the same epoch. Only machines on a worker not standing are fenced."""
        judgement = await self.judged()
        live = {w: s for w in judgement.live if self._usable(s := self.statuses[w])}
        standing = {w: s for w in judgement.live | judgement.doubt
                    if self._usable(s := self.statuses[w])}
        lapsed = [self.statuses[w] for w in sorted(judgement.failed)
                  if self._usable(self.statuses[w])]
        answers = await asyncio.gather(*(self._answers_under(s) for s in lapsed))
        standing.update((s.id, s) for s, same in zip(lapsed, answers, strict=True) if same)
        return live, standing

    def _usable(self, w: WorkerStatus) -> bool:
        return not w.draining and self.failures.failed(w.id, w.epoch) is None

    async def _answers_under(self, status: WorkerStatus) -> bool:
        """Whether `status`'s agent answers /healthz under the epoch it had (asked at most
        once every `freshness_s`: a dead worker costs a pass no more than one timeout)."""
        epoch, at = self._answers.get(status.id, (-1, -self.freshness_s))
        if time.monotonic() - at >= self.freshness_s:
            health = await self.agents.health(status.url, PROBE_TIMEOUT_S)
            epoch = health.epoch if isinstance(health, HealthView) and health.ok else -1
            self._answers[status.id] = (epoch, time.monotonic())
            for worker in set(self._answers) - set(self.statuses):
                del self._answers[worker]
        return epoch == status.epoch

    async def suspect(self, worker_id: str, reporter: str,
                      machine: str) -> tuple[bool, bool, str]:
        """An edge could not connect to `machine` on `worker_id`: (failed, newly, why).
        Its heartbeat lapsed while the registry answered (core/liveness), placement's own
        probe of the agent failing, or two edges' reports about two machines (heard by
        any placement), confirm it (core/failures, failuresync)."""
        judgement = await self.judged()
        status = self.statuses.get(worker_id)
        if status is None or worker_id in judgement.failed:
            return True, False, "its heartbeat lapsed"
        mark = self.failures.failed(status.id, status.epoch)
        if mark is not None:
            return True, False, mark.reason
        health = await self.agents.health(status.url, PROBE_TIMEOUT_S)
        if isinstance(health, Unreachable):
            reason = f"its agent does not answer either: {health.message}"
        else:
            if not await self.shared.report(worker_id, status.epoch, reporter, machine):
                code = health.status if isinstance(health, Refused) else (
                    200 if health.ok else 503)
                return False, False, f"its agent answers ({code})"
            reason = "two edges could not connect to two of its machines"
        return True, await self.shared.fail(status.id, status.epoch, reason), reason

    async def worker_url(self, worker_id: str) -> str:
        """The worker's agent, as the registry last said (one in doubt is still asked)."""
        for worker in await self.workers():
            if worker.id == worker_id:
                return worker.url
        if worker_id in self.statuses:
            return self.statuses[worker_id].url
        raise Unavailable(f"worker {worker_id} is not available", code="worker_unavailable")

    def remember(self, app: str, view: MachineView) -> None:
        self.known[view.id] = (app, view.worker, view.app_uid)

    async def sealed_machines(self, app: str) -> list[MachineRecord]:
        """The app's machine records that are sealed by their worker's ticket (all of them
        without route keys): a worker's agent can write any app's records, but seal only
        those of machines placed on it (ground/auth/tickets.py)."""
        return [r for r in await self.registry.machines(app) if self.routes.admits(r)]

    async def app_workers(self, app: str) -> set[str]:
        """The workers to ask about `app`'s machines: those named by any record of it,
        sealed or not (a worker's answer is its own truth, so a forged record costs one
        more question; an unsealed record of a machine made before the route key, or of
        another incarnation of the name, still gets its machine found and destroyed)."""
        workers = {record.worker for record in await self.registry.machines(app)}
        workers.update(w for a, w, _ in self.known.values() if a == app)
        return workers

    async def registered_machines(self, config: AppConfig) -> list[MachineRecord]:
        """The app's machines as the registry last heard of them (no agent round trip).
        Advisory: a stale entry costs a refused start, never a wrong result."""
        return [r for r in await self.sealed_machines(config.name) if r.app_uid == config.uid]

    async def own_machines(self, config: AppConfig) -> list[MachineView]:
        """The machines of this app — this incarnation of the name — from their agents."""
        return [v for v in await self.app_machines(config.name) if v.app_uid == config.uid]

    async def app_machines(
        self, app: str, workers: dict[str, WorkerStatus] | None = None
    ) -> list[MachineView]:
        """Every machine named for `app` as their agents report them, whatever
        incarnation of the name made them (see `own_machines`)."""
        if workers is None:
            workers = {w.id: w for w in await self.workers()}
        asked = [workers[w] for w in sorted(await self.app_workers(app)) if w in workers]
        replies = await asyncio.gather(
            *(self._machines_on(w.url, app) for w in asked), return_exceptions=True
        )
        views: list[MachineView] = []
        for reply in replies:
            if isinstance(reply, list):
                views.extend(reply)
        for view in views:
            self.remember(app, view)
        return views

    async def _machines_on(self, url: str, app: str) -> list[MachineView]:
        answer = await self.agents.machines(url, app)
        return answer if isinstance(answer, list) else []

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

    async def destroy(self, mid: str, *, worker: str = "", url: str = ""
                      ) -> MachineView | Refused | Unreachable:
        """Destroy machine `mid` at its worker (by `url`, or the live `worker`'s); a worker
        not live now is Unreachable too."""
        try:
            url = url or await self.worker_url(worker)
        except Unavailable as exc:
            return Unreachable(exc.message)
        return await self.agents.destroy(url, mid)

    async def start(self, url: str, mid: str, wait_s: float,
                    slack_s: float = 1.0) -> MachineView | Refused | Unreachable:
        """Start machine `mid` at its worker and wait (at most `wait_s`) until it is
        started — one round trip: the worker answers once it is (or Refused `timeout`)."""
        return await self.agents.start(url, mid, wait_s, wait_s + slack_s)

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

    async def restore(self, app: str, view: MachineView) -> None:
        """A fenced machine taken back: its `lost` record (which outranks anything its
        agent publishes) replaced by what its agent says, so edges route to it again.
        Advisory like `mark`: the agent's next resync would not get past `lost`."""
        try:
            for record in await self.sealed_machines(app):
                if record.id == view.id:
                    back = replace_struct(record, state=view.state, address=view.address,
                                          updated_at=view.updated_at)
                    await self.registry.delete_machine(app, record.id)
                    await self.registry.put_machine(
                        replace_struct(back, seal=self.routes.resealed(back)))
        except Exception as exc:
            log.warning("could not restore machine %s in the registry: %s", view.id, exc)

    async def pull(self, url: str, ref: str) -> ImageInfo:
        answer = await self.agents.pull(url, ref, self.pull_timeout_s)
        if isinstance(answer, (Refused, Unreachable)):
            raise worker_said(answer)
        return ImageInfo(ref=ref, digest=answer.digest,
                         layers={layer.digest: layer.size for layer in answer.layers})

    async def held_bytes(self, image: ImageInfo) -> dict[str, int]:
        """worker id -> bytes of this image's layers it holds (the inverted index)."""
        held: dict[str, int] = {}
        for digest, size in image.layers.items():
            for worker in await self.registry.layer_holders(digest):
                held[worker] = held.get(worker, 0) + size
        return held

