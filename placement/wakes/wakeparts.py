"""The parts of one wake: its outcomes, its machines' slots in the forecast, and its new
machines' market round (placement/wakes/waker.py runs the wake with them).

`Slot`: one machine of the wake, its place in the wake's forecast (the prediction
goes to the sink set by `predictions_to`, the HTTP route's) and its start counted in
flight on its worker while it lasts. `NewMachines`: the wake's one market round,
made when the first new machine is needed, and how many it placed that still exist
(for `max_machines`). The functions below read agents' answers and tasks' ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeGuard, TypeVar

from agent.api import MachineView
from ground.appconfig import AppConfig
from ground.registry.types import boot_span_ms
from placement.api import WakePrediction, WakeTimings, WokenMachine
from placement.core.offers import NoCapacity
from placement.core.predict import StartKind, StartsInFlight, WakeForecast
from placement.core.wake import Machine, room_for_new, states_of
from placement.errors import PlacementError
from placement.placer import NewMachine, Placer, Round
from placement.store import StoreUnavailable

log = logging.getLogger("thaw.placement")
T = TypeVar("T")
# A wake that needs the store (a new machine: its image's layers, its secrets, whether
# the app still exists) while it is down asks again this often, until its answer is due.
STORE_RETRY_S = 0.5
PredictionSink = Callable[[WakePrediction], None]
# Where the wake running in this context sends its prediction: set by the HTTP route
# around its call, so the layers between (the service) need not carry it.
_prediction_sink: ContextVar[PredictionSink | None] = ContextVar("prediction_sink",
                                                                 default=None)


def prediction_sink() -> PredictionSink | None:
    """Where a wake running in this context sends its prediction (None: nowhere)."""
    return _prediction_sink.get()


@contextlib.contextmanager
def predictions_to(sink: PredictionSink) -> Iterator[None]:
    """Wakes run in this context (and tasks made in it) send their prediction to `sink`."""
    token = _prediction_sink.set(sink)
    try:
        yield
    finally:
        _prediction_sink.reset(token)


@dataclass(frozen=True)
class Ready:
    view: MachineView
    timings: WakeTimings


@dataclass(frozen=True)
class Failed:
    code: str  # no_capacity | start_failed | image_unavailable | deadline
    message: str


# An agent's answer to a pull that no retry will change (imagecache error codes).
IMAGE_REFUSALS = frozenset({"bad_reference", "forbidden_host", "not_found", "unauthorized",
                            "digest_mismatch", "size_mismatch", "unsafe_layer", "unsupported",
                            "image_unavailable"})


Outcome = Ready | Failed


class Slot:
    """One machine of a wake: its place in the wake's forecast, whose prediction, once
    made, goes to `sink`; and its start, counted in `in_flight` on its worker from when
    that is decided until the start ends (`ended`). A machine placed again after a
    declined start keeps its slot: counted on its new worker, its boot judged by the
    contention there, but the prediction (made already) is not changed."""

    def __init__(self, forecast: WakeForecast, index: int, sink: PredictionSink | None,
                 in_flight: StartsInFlight) -> None:
        self.forecast, self.index, self.sink, self.in_flight = forecast, index, sink, in_flight
        self.worker: str | None = None  # where its start is counted in flight
        self.stretch = 1.0  # the contention its boot was predicted to have

    def decided(self, kind: StartKind, worker: str,
                layers: Mapping[str, int] | None = None) -> None:
        self.ended()  # (placed again: the declined start is over)
        now = asyncio.get_running_loop().time()
        machine = self.forecast.machine(kind, worker, now, layers, self.in_flight.on(worker))
        if machine is not None:
            self.stretch = machine.stretch
            if kind != "starting":  # (counted by the start that began it)
                self.in_flight.began(worker)
                self.worker = worker
        self._send(self.forecast.report(self.index, machine))

    def failed(self) -> None:
        self.ended()
        self._send(self.forecast.failed(self.index))

    def ended(self) -> None:
        """Its start ended (ready, failed or declined): no longer in flight."""
        if self.worker is not None:
            self.in_flight.ended(self.worker)
            self.worker = None

    def _send(self, predicted_ms: float | None) -> None:
        if predicted_ms is not None and self.sink is not None:
            self.sink(WakePrediction(predicted_ms=round(predicted_ms, 1),
                                     machines=len(self.forecast.machines)))


class NewMachines:
    """The new machines of one wake: the market round, made once, when the first is
    needed (a planned one, or one replacing a stopped machine its worker has no room to
    start), and how many this wake has placed that still exist."""

    def __init__(self, placer: Placer, config: AppConfig, region: str,
                 views: Sequence[Machine], live_workers: Collection[str],
                 answer_by: float = float("inf")) -> None:
        """`views`: the app's machines the wake was planned from; `live_workers`: every
        live worker then, in any region (as `plan_wake` counts machines); `answer_by`:
        the loop time the wake answers at (the store is waited for until then)."""
        self.placer, self.config, self.region, self.views = placer, config, region, views
        self.answer_by = answer_by
        self.machines = states_of(views, config)
        self.live_workers = live_workers
        self.placed = 0  # placed by this wake, not destroyed since: not in `views`
        self.claimed: set[str] = set()  # machines this wake claimed (reused or placed)
        self.lock = asyncio.Lock()  # one offer at a time: each sees the last's reservations
        self._round: asyncio.Future[Round | Failed] | None = None

    async def round(self) -> Round | Failed:
        if self._round is None:
            self._round = asyncio.ensure_future(self._market_round())
        return await self._round

    async def _market_round(self) -> Round | Failed:
        try:
            return await store_retried(
                lambda: self.placer.round(self.config, self.region, self.views),
                self.answer_by, self.placer.metrics.waited)
        except TimeoutError:
            return Failed("deadline", "the store did not answer before the deadline")
        except PlacementError as exc:
            return Failed("no_capacity", f"cannot place: {exc.message}")

    async def place(self, rnd: Round) -> NewMachine | Failed:
        """One machine offered down the ranking of `rnd` (this wake's round), not started."""
        async with self.lock:
            placed = await self.placer.place(rnd, start=False)
        if isinstance(placed, NoCapacity):
            return Failed("no_capacity", placed.reason)
        self.placed += 1
        return placed

    def declined(self, rnd: Round, worker: str, *, destroyed: bool) -> None:
        """`worker` declined to start the machine placed there: that worker is offered
        nothing else in this wake, and the machine counts no more once `destroyed`."""
        rnd.declined.add(worker)
        if destroyed:
            self.placed -= 1

    def room(self, placing: int) -> int:
        """New machines `max_machines` still allows: the app's machines the wake was
        planned from, those this wake placed since, and `placing` (all wakes') count."""
        return room_for_new(self.config, self.machines, self.live_workers,
                            placing + self.placed)


async def store_retried(call: Callable[[], Awaitable[T]], answer_by: float,
                        waited: Callable[[str, float], None]) -> T:
    """`call()`, asked again every STORE_RETRY_S while the store is unavailable, until
    `answer_by` (a loop time): a store down for a while holds a wake that needs it
    within its budget instead of failing it at once. Each try is cut at `answer_by`
    (TimeoutError: the store still had not answered); StoreUnavailable when the store
    refused until too late to try again. `waited(on, seconds)` counts each wait."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            async with asyncio.timeout_at(answer_by):
                return await call()
        except StoreUnavailable:
            if answer_by - loop.time() <= STORE_RETRY_S:
                raise
            waited("store", STORE_RETRY_S)
            await asyncio.sleep(STORE_RETRY_S)


def outcome_of(task: asyncio.Task[Outcome]) -> Outcome:
    """A start that crashed is one failed start, not a failed wake."""
    exc = task.exception()
    if exc is None:
        return task.result()
    log.error("a start of this wake failed", exc_info=exc)
    return Failed("start_failed", f"internal error: {exc!r}")


def is_ready(task: asyncio.Task[Outcome]) -> bool:
    return not task.cancelled() and task.exception() is None and isinstance(task.result(),
                                                                             Ready)


def reuse_kind(state: str) -> StartKind:
    """How a machine reused in `state` starts (see placement/core/predict.py)."""
    if state == "suspended":
        return "resume"
    return "starting" if state == "starting" else "boot"


def is_declined(outcome: Outcome) -> TypeGuard[Failed]:
    """A worker refused to start the machine: no room for it there now."""
    return isinstance(outcome, Failed) and outcome.code == "declined"


def is_lost(outcome: Outcome) -> TypeGuard[Failed]:
    """The machine's worker stopped answering while it was pulled or started (its host
    died or was cut off mid-wake): nothing more will come of the machine there."""
    return isinstance(outcome, Failed) and outcome.code == "worker_lost"


def goes_elsewhere(outcome: Outcome) -> TypeGuard[Failed]:
    """A start that another worker may do instead: declined, or its worker lost."""
    return is_declined(outcome) or is_lost(outcome)


def woken(view: Machine) -> WokenMachine:
    """A machine for the edge (from its worker's answer, or its registry record)."""
    return WokenMachine(id=view.id, address=view.address, worker=view.worker)


def total_ms(timings: WakeTimings) -> float:
    return timings.place_ms + timings.pull_ms + timings.boot_ms


def ms_since(began: float) -> float:
    return (time.perf_counter() - began) * 1000


def boot_ms(view: MachineView) -> float:
    """From the worker's events: the last `starting` to the `started` after it."""
    return boot_span_ms((e.state, e.at) for e in view.events)


def message_of(body: Any) -> str:
    return str(body.get("message", body)) if isinstance(body, dict) else str(body)
