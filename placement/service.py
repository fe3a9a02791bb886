"""The placement shell: apps (stored, published), deploys, wake and autostop; an app's
machines and secrets as their owner acts on them are rooms of their own
(`appmachines.py`, `appsecrets.py`).

App configs live in the store (the truth) and are copied to the registry after
every change. An app's image is resolved and its digest pinned when the app is
created, when its image changes and at every deploy — never first on a request.
Changes of one app run one at a time (`AppLocks`) and are written only over the
config they were made from (the store checks uid and version). Each app is one
incarnation of its name (`uid`): a new app of a deleted app's name starts with
none of the old one's machines.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

import msgspec

from agent.api import MachineView
from ground.appconfig import (
    ROLLBACK_FIELDS,
    AppConfig,
    InvalidConfig,
    Strategy,
    check,
    machine_spec,
    parse,
    patched,
)
from ground.hostnames import within_domain
from ground.registry import Registry, facts_of
from ground.registry.readiness import registry_answers
from placement.api import (
    AppDeleted,
    AppEvent,
    DecisionView,
    DeployResult,
    JsonObject,
    LogsAnswer,
    Release,
    SuspectAnswer,
    SuspectReport,
    WakeRequest,
    WakeResponse,
    WorkerView,
)
from placement.applocks import AppLocks
from placement.appmachines import AppMachines
from placement.appsecrets import AppSecrets, SecretVault
from placement.core.wake import GONE
from placement.errors import (
    Conflict,
    NotFound,
    Unavailable,
)
from placement.fleet.fleet import Fleet
from placement.fleet.republish import Republisher
from placement.machinelogs import app_logs
from placement.placer import Placer
from placement.ports.leases import LeaseStore
from placement.reconciling.reconciler import Reconciler
from placement.store import AppStore, SecretWrites, StoreUnavailable
from placement.tokens import Tokens
from placement.wakes.autostop import autostop
from placement.wakes.waker import Waker

log = logging.getLogger("thaw.placement")
READ_ONLY_FIELDS = ("version", "image_digest", "uid", "release", "secrets")  # placement's
DEPLOY_SETTLE_S = 120.0  # a deploy answers once its first pass is done, at most this late
# A wake asks the store for its app's config this long at most before it takes the shared
# view's (a store stopped, not refusing, would otherwise hold every wake until its timeout)
WAKE_STORE_WAIT_S = 1.0


class Placement:
    def __init__(
        self,
        registry: Registry,
        store: AppStore,
        tokens: Tokens,
        fleet: Fleet,
        placer: Placer,
        waker: Waker,
        domain: str,
        vault: SecretVault,
        *,
        refill_bound_s: float = 30.0,
        leases: LeaseStore | None = None,
    ) -> None:
        """`vault`: apps' secrets; `leases`: where the reconcile leases live (Redis when
        placements are many); `refill_bound_s`: after a registry loss, the longest the
        reconciler waits for the workers to publish again (placement/fleet/republish.py)."""
        self.registry = registry
        self.store = store
        self.tokens = tokens
        self.fleet = fleet
        self.placer = placer
        self.waker = waker
        self.domain = domain
        self.locks = AppLocks()
        self.app_names: set[str] = set()  # the apps stored at the last look (`apps`)
        self._woken: dict[str, AppConfig] = {}  # each app's config its last wake here read
        self.republisher = Republisher(registry, store, self.locks, refill_bound_s,
                                       live_workers=fleet.live_workers)
        waker.view_whole = self.republisher.wait_trusted
        self.reconciler = Reconciler(store, fleet, placer, waker, self.locks, registry,
                                     self.republisher, leases=leases)
        self.secrets = AppSecrets(vault, store, self.locks, registry, self._store_change,
                                  self.reconciler.poke)
        self.machines = AppMachines(store, fleet, placer, self.locks)

    # -- apps ------------------------------------------------------------------

    async def create_app(self, body: bytes) -> AppConfig:
        config = self._routable(parse(body))
        config = msgspec.structs.replace(config, secrets={})  # set through …/secrets only
        async with self.locks.hold(config.name):
            if await self.store.holds(config.name):
                raise Conflict(f"app {config.name} exists", code="exists")
            await self._clear_leftovers(config.name)
            config = await self._pinned(
                msgspec.structs.replace(config, uid=secrets.token_hex(8), release=1))
            config = await self.store.create(config, self._release(config, 1, "created"))
            self.app_names.add(config.name)
            await self.republisher.publish(config)
        self.reconciler.poke(config.name)
        return config

    def _release(self, config: AppConfig, version: int, reason: str,
                 strategy: Strategy | None = None, replaces: int = 0,
                 rollback_to: int = 0) -> Release:
        return Release(app=config.name, version=version, image=config.image,
                       image_digest=config.image_digest, config=config,
                       strategy=strategy or config.deploy.strategy,
                       status="pending", created_at=self.fleet.clock(), reason=reason,
                       replaces=replaces, rollback_to=rollback_to)

    async def _store_change(self, current: AppConfig, config: AppConfig, reason: str,
                            strategy: Strategy | None = None, secrets: SecretWrites | None = None,
                            rollback_to: int = 0) -> tuple[AppConfig, Release | None]:
        """Store `config` (and `secrets`) over `current`; a change of what machines are
        made from is a new release (the next version), made in the same transaction. It
        replaces the release `current` runs (what a failed rollout goes back to)."""
        release = None
        if machine_spec(config) != machine_spec(current) or not current.release:
            version = await self.store.last_release(current.uid) + 1
            config = msgspec.structs.replace(config, release=version)
            release = self._release(config, version, reason, strategy, current.release,
                                    rollback_to)
        stored = await self.store.update(config, release, secrets)
        return stored, None if release is None else msgspec.structs.replace(
            release, config=stored)

    async def _clear_leftovers(self, name: str) -> None:
        """Machines an earlier app of this name left (an agent away when it was deleted):
        destroyed, as far as their agents answer, to give their capacity back. Those that
        cannot be are no harm: they carry the earlier app's uid, so they are never this
        one's (never listed, routed, started or stopped as its)."""
        views = [v for v in await self.fleet.app_machines(name) if v.state not in GONE]
        destroyed = await asyncio.gather(*(self._destroy(name, v) for v in views))
        for view, done in zip(views, destroyed, strict=True):
            if not done:
                log.warning("machine %s left by an earlier app %s could not be destroyed",
                            view.id, name)

    async def app(self, name: str) -> AppConfig:
        return await self.store.get(name)

    async def apps(self) -> list[AppConfig]:
        """Every stored app; their names are kept (`app_names`) for what must read them
        without waiting, as /metrics' collectors."""
        configs = await self.store.list()
        self.app_names = {config.name for config in configs}
        return configs

    async def update_app(self, name: str, patch: JsonObject) -> AppConfig:
        async with self.locks.hold(name):
            current = await self.store.get(name)
            patch = {k: v for k, v in patch.items() if k not in READ_ONLY_FIELDS}
            config = self._routable(patched(current, patch))
            if config.image != current.image:
                config = await self._pinned(config)
            if config == current:
                return current  # nothing changed: no version, no release
            config, _ = await self._store_change(current, config, "updated")
            await self.republisher.publish(config)
        self.reconciler.poke(name)
        return config

    def _routable(self, config: AppConfig) -> AppConfig:
        """`hosts` may not reach into the platform's own domain: names there are apps'."""
        for host in config.hosts:
            if within_domain(host, self.domain):
                raise InvalidConfig("hosts", f"{host} is under the platform's domain "
                                             f"{self.domain}; {config.name}'s name there is "
                                             f"{config.name}.{self.domain}")
        return config

    async def _pinned(self, config: AppConfig) -> AppConfig:
        """The config with its image resolved now and the digest pinned (422 for a
        refused reference, 424 for one that does not resolve)."""
        info = await self.fleet.resolve(msgspec.structs.replace(config, image_digest=""))
        pinned = msgspec.structs.replace(config, image_digest=info.digest)
        await self.fleet.keep(pinned, info)
        return pinned

    async def delete_app(self, name: str) -> AppDeleted:
        async with self.locks.hold(name):
            # Out of the store first: a wake that places a machine from now on finds the
            # app gone and destroys it; one placed before is among the machines listed next.
            await self.store.delete(name)
            self.app_names.discard(name)
            self._woken.pop(name, None)
            await self.tokens.app_deleted(name)
            self.placer.forget(name)
            self.waker.boots.forget(name)  # a new app of this name is not judged by its boots
            await self.registry.delete_app(name)
            views = await self.fleet.app_machines(name)
            destroyed = await asyncio.gather(
                *(self._destroy(name, v) for v in views if v.state not in GONE)
            )
        return AppDeleted(deleted=name, machines=[mid for mid in destroyed if mid])

    async def _destroy(self, app: str, view: MachineView) -> str:
        answer = await self.fleet.destroy(view.id, worker=view.worker)
        return view.id if isinstance(answer, MachineView) else ""

    # -- deploy ----------------------------------------------------------------

    async def deploy(self, name: str, image: str | None, strategy: Strategy | None = None,
                     patch: JsonObject | None = None) -> DeployResult:
        """Apply `patch` (the owner's fields, as update_app takes them), resolve the image
        (it may have moved) and pin it: a change of what machines are made from is one new
        release, rolled out by the reconciler. Answers once the first reconcile pass is
        done (the machines it made, and why any could not be)."""
        async with self.locks.hold(name):
            current = await self.store.get(name)
            config = current
            if patch:
                own = {k: v for k, v in patch.items() if k not in READ_ONLY_FIELDS}
                config = self._routable(patched(current, own))
            config = check(msgspec.structs.replace(config, image=image)) if image else config
            config = await self._pinned(config)
            release = None
            if config != current or not current.release:
                config, release = await self._store_change(current, config, "deployed",
                                                           strategy)
                await self.republisher.publish(config)
            region = config.regions[0]
            if not await self.fleet.live_workers(region):
                raise Unavailable(f"no live worker in region {region}", code="no_capacity")
        await self.reconciler.pass_now(name)  # or the lease's holder does, from the feed
        made, shortfall = await self.reconciler.settle(name, DEPLOY_SETTLE_S)
        return DeployResult(app=config, machines=made, shortfall=shortfall, release=release)

    async def rollback(self, name: str, version: int) -> Release:
        """A new release made from release `version`'s machine fields (image, env, guest,
        health, ...). The release it replaces is marked rolled_back once the new one's
        rollout completes; if that rollout fails, the app goes back to it."""
        async with self.locks.hold(name):
            current = await self.store.get(name)
            old = await self.store.release(current.uid, version)
            if old is None:
                raise NotFound(f"release {version} of app {name} not found")
            fields = {field: getattr(old.config, field) for field in ROLLBACK_FIELDS}
            config = msgspec.structs.replace(current, **fields)
            stored, release = await self._store_change(current, config, f"rollback to {version}",
                                                       rollback_to=version)
            if release is None:
                raise Conflict(f"app {name} already runs what release {version} ran",
                               code="conflict")
            await self.republisher.publish(stored)
        self.reconciler.poke(name)
        return release

    async def releases(self, name: str) -> list[Release]:
        return await self.store.releases((await self.store.get(name)).uid)

    async def events(self, name: str) -> list[AppEvent]:
        return await self.store.events((await self.store.get(name)).uid)

    # -- wake, autostop, introspection ------------------------------------------

    async def wake(self, app: str, request: WakeRequest) -> WakeResponse:
        return await self.waker.wake(await self._wake_config(app), request)

    async def _wake_config(self, name: str) -> AppConfig:
        """The app's config from the store (the truth); with the store down or not
        answering within WAKE_STORE_WAIT_S, the one in the shared view (the registry,
        which every placement publishes to), else the one the last wake here read. That
        is enough to start a stopped machine or a spare; a new machine waits for the
        store in the wake (placement/wakes/wakeparts.py store_retried). A stored app not known
        either way: StoreUnavailable (the edge may ask another placement)."""
        try:
            async with asyncio.timeout(WAKE_STORE_WAIT_S):
                config = await self.store.get(name)
        except (StoreUnavailable, TimeoutError) as exc:
            try:
                known = await self.registry.app(name)
            except Exception as registry_exc:  # Redis down too: memory's
                log.debug("app %s: registry unavailable too: %r", name, registry_exc)
                known = None
            known = known or self._woken.get(name)
            if known is None:
                raise exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(
                    f"no answer within {WAKE_STORE_WAIT_S}s") from None
            log.warning("app %s woken without the store (%s): its config from %s", name,
                        exc.message if isinstance(exc, StoreUnavailable) else "slow",
                        "memory" if known is self._woken.get(name) else "the registry")
            return known
        self._woken[name] = config
        return config

    async def autostop(self, app: str, mid: str) -> MachineView:
        return await autostop(self.fleet, await self.store.get(app), mid)

    async def suspect(self, worker: str, report: SuspectReport) -> SuspectAnswer:
        """An edge could not connect to `report.machine` on `worker`; a worker that is
        newly failed gets every app looked at again (its machines are lost)."""
        if not await self.republisher.trusted():
            return SuspectAnswer(worker=worker, failed=False,
                                 reason="the registry is being filled again: not judged now")
        failed, newly, reason = await self.fleet.suspect(worker, report.reporter,
                                                         report.machine)
        if newly:
            log.warning("worker %s failed: %s (reported by %s: %s to machine %s)", worker,
                        reason, report.reporter, report.error or "connect failed",
                        report.machine or "-")
            await self._look_again()
        return SuspectAnswer(worker=worker, failed=failed, reason=reason)

    async def workers_lost(self, workers: list[str]) -> None:
        """Other placements marked these workers failed: every app is looked at again
        here too (this placement may hold the lease of apps with machines there)."""
        log.warning("workers %s failed (marked by another placement)", ", ".join(workers))
        await self._look_again()

    async def _look_again(self) -> None:
        """Every app to its reconciler: machines on a failed worker are lost."""
        for config in await self.apps():
            self.reconciler.poke(config.name)

    async def ready(self) -> tuple[bool, str]:
        """Ready: the registry answers, and every stored app is published under its
        current generation (the views the edges and the reconciler read are filled)."""
        return await registry_answers(self.republisher.check())

    async def logs(self, app: str, cursor: str, tail_bytes: int, machine: str = ""
                   ) -> LogsAnswer:
        return await app_logs(self.fleet, await self.store.get(app), cursor,
                              tail_bytes, machine)

    async def placements(self, app: str) -> list[DecisionView]:
        await self.store.get(app)
        return list(reversed(self.placer.decisions.get(app, [])))

    async def workers(self) -> list[WorkerView]:
        """Every worker placement knows: in the registry, or missing from it while in doubt
        (healthy: live by core/liveness, and not marked failed)."""
        judgement = await self.fleet.judged()
        workers = sorted((w for w in self.fleet.statuses.values()
                          if w.id in judgement.doubt or self.fleet.liveness.known[w.id].present),
                         key=lambda w: w.id)
        return [
            WorkerView(
                **facts_of(w), layers=len(w.layers), layer_bytes=sum(w.layers.values()),
                updated_at=w.updated_at, healthy=w.id in judgement.live and mark is None,
                failed=mark.reason if mark is not None else "",
            )
            for w in workers
            for mark in [self.fleet.failures.failed(w.id, w.epoch)]
        ]

