"""An app's machines as its owner acts on them: list, create (running or a spare), read,
start, stop, suspend, destroy and wait. Each call is forwarded to the worker that owns the
machine; its answer — a refusal included — is passed through as the worker said it."""

from __future__ import annotations

from collections import Counter

from agent.api import MachineGone, MachineView
from ground.appconfig import AppConfig
from placement.api import CreateMachineRequest
from placement.applocks import AppLocks, TooMany
from placement.core.offers import NoCapacity
from placement.core.wake import GONE
from placement.errors import Conflict, Unavailable, worker_said
from placement.fleet.fleet import Fleet
from placement.placer import NewMachine, Placer, Round
from placement.store import AppStore

MAX_WAITS_PER_APP = 16  # long polls of one app's machines at once


class AppMachines:
    def __init__(self, store: AppStore, fleet: Fleet, placer: Placer, locks: AppLocks) -> None:
        self.store = store
        self.fleet = fleet
        self.placer = placer
        self.locks = locks
        self._waits: Counter[str] = Counter()

    async def list(self, app: str) -> list[MachineView]:
        config = await self.store.get(app)
        return sorted(await self.fleet.own_machines(config), key=lambda v: v.created_at)

    async def create(self, app: str, options: CreateMachineRequest) -> MachineView:
        async with self.locks.hold(app):
            return await self._create(await self.store.get(app), options)

    async def _create(self, config: AppConfig, options: CreateMachineRequest) -> MachineView:
        app = config.name
        region = options.region or config.regions[0]
        views = await self.fleet.own_machines(config)
        if sum(1 for v in views if v.state not in GONE) >= config.max_machines:
            raise Conflict(f"app {app} has max_machines={config.max_machines}",
                           code="max_machines")
        rnd = await self.placer.round(config, region, views)
        placed = await (self.placer.place(rnd, start=True) if options.start
                        else self._spare(rnd))
        if isinstance(placed, NoCapacity):
            raise Unavailable(placed.reason, code="no_capacity")
        return placed.view

    async def _spare(self, rnd: Round) -> NewMachine | NoCapacity:
        """A stopped machine, preferably on a worker without a running one, image pulled."""
        placed = await self.placer.place(rnd, start=False, spare=True)
        if isinstance(placed, NewMachine):
            await self.fleet.pull(placed.url, rnd.image.ref)
        return placed

    async def call(self, app: str, mid: str, action: str = "") -> MachineView:
        """One call on a machine at its worker: "" reads it, else "destroy", "start",
        "stop" or "suspend"; the worker's refusal passes through as it said it."""
        url = await self.fleet.locate(await self.store.get(app), mid)
        agents = self.fleet.agents
        if action == "destroy":
            answer = await agents.destroy(url, mid)
        elif action == "start":
            answer = await agents.start(url, mid, 0.0)
        elif action == "stop":
            answer = await agents.stop(url, mid)
        elif action == "suspend":
            answer = await agents.suspend(url, mid)
        else:
            answer = await agents.machine(url, mid)
        if isinstance(answer, MachineView):
            return answer
        raise worker_said(answer)

    async def wait(self, app: str, mid: str, state: str, timeout_s: float
                   ) -> MachineView | MachineGone:
        """Answer once the machine is in `state`: a long poll, at most MAX_WAITS_PER_APP
        of an app's at once."""
        url = await self.fleet.locate(await self.store.get(app), mid)
        if self._waits[app] >= MAX_WAITS_PER_APP:
            raise TooMany(f"too many waits on machines of app {app} at once")
        self._waits[app] += 1
        try:
            answer = await self.fleet.agents.wait(url, mid, state, timeout_s)
        finally:
            self._waits[app] -= 1
            if not self._waits[app]:
                del self._waits[app]
        if isinstance(answer, (MachineView, MachineGone)):
            return answer
        raise worker_said(answer)
