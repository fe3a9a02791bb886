"""The shell of the market: asks the core for a decision over the fleet index, sends offers.

The workers come from the `FleetIndex` (kept from the registry's change feed,
never read per decision). One `Round` is a wake's or deploy's run of placements:
the image, the app's machines per worker and the workers that declined. Every
offer (but a spare's, which holds no room) goes into the index's reservation
ledger when it is sent, and stays there if accepted: the next decision — of this
round or any other, made while the offer is out or after — sees it before the
worker's heartbeat does, and a herd of wakes spreads.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from agent.api import Guest, Health, MachineView, OfferRequest
from ground.appconfig import AppConfig
from ground.logs import event
from placement.api import DecisionView, FilteredWorker, OfferView, RankedWorker
from placement.core.market import Decision, MarketParams, PlacementRequest, decide
from placement.core.offers import Answer, NoCapacity, OfferTo, Placed, Reply, next_offer
from placement.core.wake import Machine
from placement.fleet.fleet import Fleet, ImageInfo, offer_ref
from placement.fleet.fleetindex import FleetIndex
from placement.metrics import PlacementMetrics
from placement.ports.workers import Unreachable, Workers

log = logging.getLogger("thaw.placement")
decision_log = logging.getLogger("thaw.placement.decision")

# When to re-send a timed-out offer in order to release what it may have created.
RELEASE_DELAYS_S = (0.5, 2.0, 5.0)


@dataclass
class Round:
    """A run of placements of one app in one region (mutated as machines are placed)."""

    config: AppConfig
    region: str
    image: ImageInfo
    app_machines: Counter[str]
    declined: set[str] = field(default_factory=set)
    sealed_env: str = ""  # the app's secrets, sealed for agents ("": none)


@dataclass(frozen=True)
class NewMachine:
    worker: str
    url: str
    view: MachineView


class Placer:
    def __init__(
        self,
        fleet: Fleet,
        agents: Workers,
        params: MarketParams,
        metrics: PlacementMetrics,
        *,
        max_offers: int,
        decisions_kept: int,
        rng: random.Random | None = None,
        index: FleetIndex | None = None,
        seal: Callable[[AppConfig], Awaitable[str]] | None = None,
    ) -> None:
        """`index`: the fleet index, started and stopped by its owner; without one the
        placer keeps its own (started by the first round, stopped by `close`); `seal`:
        an app's secrets sealed for agents (placement/appsecrets.py)."""
        self.seal = seal
        self.owns_index = index is None
        self.index = index or FleetIndex(fleet.registry, hold_s=params.heartbeat_freshness_s)
        self.fleet = fleet
        self.agents = agents
        self.params = params
        self.metrics = metrics
        self.max_offers = max_offers
        self.decisions_kept = decisions_kept
        self.rng = rng or random.Random()
        self.decisions: dict[str, deque[DecisionView]] = {}
        self.releases: set[asyncio.Task[None]] = set()

    async def round(
        self, config: AppConfig, region: str, machines: Sequence[Machine]
    ) -> Round:
        """`machines`: the app's machines, as their agents or the registry report them
        (for `spread`)."""
        await self.index.start()
        await self.index.catch_up()
        image = await self.fleet.image(config)
        on_workers = Counter(
            m.worker for m in machines if m.state not in ("destroying", "destroyed")
        )
        sealed = await self.seal(config) if self.seal is not None and config.secrets else ""
        return Round(config, region, image, on_workers, sealed_env=sealed)

    async def prewarm(self, configs: Iterable[AppConfig]) -> int:
        """Every region's top holders of these apps' images, computed before any decision
        needs them (at start, for the stored apps); the number of tops computed."""
        await self.index.start()
        seen: set[tuple[str, str]] = set()
        images: list[tuple[str, Mapping[str, int]]] = []
        for config in configs:
            image = await self.fleet.image(config)
            for region in config.regions:
                if (region, image.digest) not in seen:
                    seen.add((region, image.digest))
                    images.append((region, image.layers))
        return await self.index.prewarm(images, self.params.candidate_top_holders)

    def decide(self, rnd: Round, avoid: frozenset[str] = frozenset()) -> Decision:
        guest = rnd.config.guest
        region = self.index.region(rnd.region)
        # A worker marked failed (core/failures) while its heartbeat is still fresh is
        # offered nothing: an offer there would wait out offer_timeout_s.
        failed = {wid for wid, epoch in self.fleet.failures.standing().items()
                  if wid in region.workers and region.workers[wid].epoch <= epoch}
        request = PlacementRequest(
            app=rnd.config.name, region=rnd.region, cpus=guest.cpus, memory_mb=guest.memory_mb,
            image_layers=rnd.image.layers, declined=frozenset(rnd.declined | avoid | failed),
        )
        began = time.perf_counter()
        decision = decide(
            request, region, now=self.fleet.clock(),
            params=self.params, app_machines=rnd.app_machines, sampler=self.rng,
            ledger=self.index.ledger,
        )
        self.metrics.decision_seconds.observe(time.perf_counter() - began)
        self.metrics.decided(decision.app, decision.outcome)
        return decision

    async def place(
        self, rnd: Round, *, start: bool, avoid: frozenset[str] = frozenset(),
        spare: bool = False, for_spares: bool = False,
    ) -> NewMachine | NoCapacity:
        """Offer one machine down the ranking; `avoid` is a preference (spares elsewhere);
        a `spare` is a standby that needs no room until it starts; `for_spares`: made to
        keep the app's spares (the reconciler trims such standbys when spares is lowered)."""
        decision = self.decide(rnd, avoid)
        if not decision.ranked and avoid:
            decision = self.decide(rnd)
        placement_id = secrets.token_hex(6)
        answers: list[Answer] = []
        while True:
            step = next_offer(decision, answers, placement_id, self.max_offers)
            if isinstance(step, OfferTo):
                # Reserved while the offer is out, so that decisions made meanwhile (a herd
                # of wakes) count it; kept until a heartbeat carries it, if accepted.
                held = None if spare else self.index.ledger.reserve(
                    step.worker, rnd.config.guest.cpus, rnd.config.guest.memory_mb,
                    self.fleet.clock())
                answer, view = await self._offer(rnd, step, start, spare, for_spares)
                answers.append(answer)
                if answer.reply is not Reply.ACCEPTED and held is not None:
                    self.index.ledger.cancel(held)
                if answer.reply is not Reply.ACCEPTED:
                    rnd.declined.add(step.worker)
                elif view is not None:
                    self.record(decision, answers)
                    rnd.app_machines[step.worker] += 1
                    self.fleet.remember(rnd.config.name, view)
                    return NewMachine(step.worker, step.url, view)
            elif isinstance(step, Placed):  # accepted without a view: cannot happen
                raise AssertionError("accepted offer without a machine")
            else:
                self.record(decision, answers)
                return step

    def _release_later(self, url: str, offer: OfferRequest) -> None:
        task = asyncio.create_task(self._release(url, offer))
        self.releases.add(task)
        task.add_done_callback(self.releases.discard)

    async def _release(self, url: str, offer: OfferRequest) -> None:
        """An offer that timed out may have been accepted all the same (the worker was only
        slow): send it again with the same key — the worker answers with the machine it
        made, or makes it now, never a second one — and destroy what comes back."""
        again = msgspec.structs.replace(offer, start=False)
        for delay_s in RELEASE_DELAYS_S:
            await asyncio.sleep(delay_s)
            answer = await self.agents.offer(url, again)
            if isinstance(answer, Unreachable):
                continue
            if isinstance(answer, MachineView):
                await self.agents.destroy(url, answer.id)
                log.info("released machine %s of a timed-out offer", answer.id)
            return  # destroyed, or declined: nothing of ours is left there
        log.warning("offer %s to %s timed out and could not be released", offer.key, url)

    async def close(self) -> None:
        if self.owns_index:
            await self.index.stop()
        for task in list(self.releases):
            task.cancel()
        await asyncio.gather(*self.releases, return_exceptions=True)

    async def _offer(
        self, rnd: Round, step: OfferTo, start: bool, spare: bool, for_spares: bool = False
    ) -> tuple[Answer, MachineView | None]:
        offer = offer_request(rnd.config, step.key, start, spare, rnd.sealed_env)
        if for_spares:
            offer = msgspec.structs.replace(offer, for_spares=True)
        if self.fleet.routes.keys is not None:  # the machine's id, and its ticket there
            machine_id = secrets.token_hex(7)
            offer = msgspec.structs.replace(offer, id=machine_id, ticket=self.fleet.routes.ticket(
                rnd.config.uid, machine_id, step.worker))
        answer = await self.agents.offer(step.url, offer)
        if isinstance(answer, Unreachable):
            self.metrics.offers.labels(Reply.UNREACHABLE.value).inc()
            self._release_later(step.url, offer)
            return Answer(step.worker, Reply.UNREACHABLE, message=answer.message), None
        if isinstance(answer, MachineView):
            self.metrics.offers.labels(Reply.ACCEPTED.value).inc()
            return Answer(step.worker, Reply.ACCEPTED, machine_id=answer.id), answer
        result = OFFER_REFUSALS.get(answer.code, Reply.UNREACHABLE)
        self.metrics.offers.labels(result.value).inc()
        return Answer(step.worker, result, message=f"{answer.status} {answer.message}"), None

    def forget(self, app: str) -> None:
        """The app is deleted: its decisions are not a new app of the same name's."""
        self.decisions.pop(app, None)
        self.metrics.forget(app)

    def record(self, decision: Decision, answers: list[Answer]) -> None:
        """Keep a decision with its offers' answers (GET …/placements), and log its
        summary: one line per placement."""
        view = decision_view(decision, answers, self.fleet.clock())
        kept = self.decisions.setdefault(decision.app, deque(maxlen=self.decisions_kept))
        kept.append(view)
        chosen = next((a for a in answers if a.reply is Reply.ACCEPTED), None)
        score = next((s.score for s in decision.ranked
                      if chosen is not None and s.worker == chosen.worker), 0.0)
        event(decision_log, "placement", app=decision.app, region=decision.region,
              outcome=view.outcome, worker=chosen.worker if chosen else "",
              machine=chosen.machine_id if chosen else "", score=round(score, 4),
              candidates=len(decision.ranked), considered=decision.considered,
              fleet=decision.fleet, filtered=len(decision.filtered), offers=len(answers))


# what a worker's refusal of an offer is to the market (anything else: as if unreachable)
OFFER_REFUSALS = {"no_capacity": Reply.NO_CAPACITY, "disk_full": Reply.NO_CAPACITY,
                  "draining": Reply.DRAINING, "stale_fence": Reply.STALE_FENCE}


def offer_request(config: AppConfig, key: str, start: bool, spare: bool = False,
                  sealed_env: str = "") -> OfferRequest:
    """The offer of one machine: `start` it at once, or not; a `spare` (a standby) needs
    no room on the worker until it starts, any other must fit now. `sealed_env`: the
    app's secrets, sealed (never in clear) for the worker."""
    return OfferRequest(
        key=key, app=config.name, app_uid=config.uid, image=offer_ref(config),
        guest=Guest(cpus=config.guest.cpus, memory_mb=config.guest.memory_mb),
        env=dict(config.env), port=config.port, entrypoint=list(config.entrypoint),
        cmd=list(config.cmd),
        health=Health(path=config.health.path, timeout_s=config.health.timeout_s,
                      protocol=config.protocol),
        kill_signal=config.kill_signal, kill_timeout_s=config.kill_timeout_s,
        start=start, spare=spare, release=config.release, sealed_env=sealed_env,
    )


def decision_view(decision: Decision, answers: list[Answer], at: float) -> DecisionView:
    return DecisionView(
        at=at, app=decision.app, region=decision.region,
        outcome="placed" if any(a.reply is Reply.ACCEPTED for a in answers) else "no_capacity",
        fleet=decision.fleet, considered=decision.considered,
        ranked=[RankedWorker(s.worker, round(s.score, 4),
                             {k: round(v, 4) for k, v in s.terms.items()})
                for s in decision.ranked[:10]],
        filtered=[FilteredWorker(f.worker, f.stage, f.reason) for f in decision.filtered],
        offers=[OfferView(a.worker, a.reply.value, a.machine_id, a.message) for a in answers],
    )
