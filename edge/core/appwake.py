"""The cold path's policy, per app: held requests, the wake in flight, backoff, deadlines.

Events in, effects out. The cold path (edge/coldpath.py) calls a handler when
something happened — a request found no machine (`hold`), placement answered
(`on_wake_answer`, `on_wake_failed`), a machine appeared in the registry feed
or a request ended and left room (`on_capacity`, `on_machine_added`), a
machine was lost (`on_machine_lost`), a timer it armed fired (`on_timer`) —
and carries out the effects returned: `CallPlacement`, `Release`, `Fail`,
`ArmTimer`. Nothing here polls: a held request leaves when capacity appears
(an event) or when its deadline's timer fires.

How many machines a wake asks for: `ceil((in_flight + elsewhere + held) /
soft_limit) - started`, capped by `max_machines - started`, never below 0; one wake in flight
per app (when it answers the need is counted again, so a burst of 1,000 at
soft_limit 20 starts 50 machines, not 1,000 and not 1). The wake also says the
demand here (`in_flight + held`): placement sizes it from every edge's demand, since
an edge counts machines other edges' wakes started as its own. `elsewhere` (other
edges' requests at the app's machines, from the load share) makes an edge ask when
the machines are full of others' requests too: with only its own counted, two edges
whose first wakes were sized from a burst's first requests would each find the
machines enough for their half and never ask again. And since two edges admit on
each other's load as last shared, together they can put more than `hard_limit` on a
machine and hold nothing: requests past the hard limit (`Shape.over`, everyone's)
call for a wake as held ones do (one edge alone would have held them). A wake that adds
no machine, or fails, backs off `backoff_s` before the next (a machine appearing
ends the backoff); a failure other than `deadline` with no machine started
answers every held request with its code.

Deadline-aware admission: placement may tell, before any machine is ready, when
the wake's first machine is predicted ready (`on_wake_predicted`). A held
request whose deadline comes before that would only end in a 504: it is
answered at once (`Shed`: 503 with `Retry-After` = the predicted wait, rounded
up), and so is a request that arrives while that prediction stands. Requests
with enough time stay held. The wake goes on whatever is shed (a retry finds
its machines starting); a prediction already past sheds nothing; the answer
ends it.

It knows nothing of HTTP, sockets or clocks: `now` is an argument, items are
opaque, the app's machines come in as a `Shape`. The wake and the effects are in
edge/core/wakeeffects.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from edge.core.holdqueue import HoldQueues, Rejected
from edge.core.wakeeffects import (
    ArmTimer,
    CallPlacement,
    Effect,
    Fail,
    Release,
    Released,
    Wake,
    shed,
)

T = TypeVar("T")
WAKE_BACKOFF_S = 1.0


@dataclass(frozen=True)
class Shape:
    """An app at one instant, as the shell sees it."""

    started: int  # machines that can be routed to
    in_flight: int  # this edge's requests being forwarded to them
    free: int  # more requests they can take now (hard limits)
    soft_limit: int
    max_machines: int
    auto_start: bool = True
    hold_timeout_s: float = 30.0
    max_pending: int = 1000
    # other edges' requests at these machines (the load share): counted in whether the
    # machines are enough, never in the demand this edge reports (placement sums those)
    elsewhere: int = 0
    # everyone's requests past hard_limit at these machines: edges that admitted on a
    # stale count of each other's load (within one share interval) can together pass
    # it; those are requests one edge alone would have held, so they call for a wake
    # as held ones do
    over: int = 0


def machines_to_start(demand: int, started: int, soft_limit: int, max_machines: int) -> int:
    """Machines to ask for so that `demand` requests fit under `soft_limit` each."""
    if soft_limit <= 0:
        raise ValueError("soft_limit must be > 0")
    needed = -(-demand // soft_limit) - started
    return max(0, min(needed, max_machines - started))


class _AppState:
    __slots__ = ("armed", "backoff_until", "last", "wake")

    def __init__(self) -> None:
        self.wake: Wake | None = None  # in flight
        self.last: Wake | None = None  # the latest wake that produced a machine
        self.backoff_until = 0.0
        self.armed: float | None = None  # when this app's timer fires, if one is armed


class AppWakes(Generic[T]):
    """Every app's cold-path state; `total` is the number of requests held in all."""

    def __init__(self, max_held_total: int, backoff_s: float = WAKE_BACKOFF_S,
                 max_held_share: float = 1.0, max_held_per_client: int | None = None) -> None:
        self.holds: HoldQueues[T] = HoldQueues(max_held_total, max_held_share,
                                               max_held_per_client)
        self.backoff_s = backoff_s
        self._apps: dict[str, _AppState] = {}

    @property
    def total(self) -> int:
        return self.holds.total

    def held(self, app: str) -> int:
        return self.holds.held(app)

    def wake_in_flight(self, app: str) -> Wake | None:
        state = self._apps.get(app)
        return state.wake if state is not None else None

    def _state(self, app: str) -> _AppState:
        state = self._apps.get(app)
        if state is None:
            state = self._apps[app] = _AppState()
        return state

    # -- handlers ------------------------------------------------------------------------

    def hold(self, app: str, item: T, now: float, shape: Shape, since: float | None = None,
             client_timeout_s: float | None = None, client: bytes | None = None
             ) -> list[Effect[T]]:
        """`item` found no machine. `since`: when it was first held (a request held again
        keeps its first deadline); `client_timeout_s`: the client's own bound, if it gave
        one; `client`: whose it is, for the per-client bound (None: not bounded)."""
        if not shape.auto_start and shape.started == 0:
            return [Fail(app, [item], [0.0], "auto_start_off",
                         "auto_start is off and no machine is started")]
        first = now if since is None else since
        budget = shape.hold_timeout_s
        if client_timeout_s is not None:
            budget = min(budget, max(0.0, client_timeout_s))
        if first + budget <= now:
            return [Fail(app, [item], [now - first], "hold_timeout",
                         f"no machine could take the request within {now - first:.3f}s")]
        state = self._apps.get(app)
        wake = state.wake if state is not None else None
        if wake is not None and first + budget < wake.predicted_at and shape.free <= 0:
            return [shed(app, [item], [now - first], wake, now)]
        decision = self.holds.enqueue(app, item, first, budget, shape.max_pending,
                                      client=client)
        if isinstance(decision, Rejected):
            return [Fail(app, [item], [0.0], decision.reason,
                         f"{self.holds.held(app)} requests held for the app, "
                         f"{self.holds.total} in all, "
                         f"{self.holds.by_client.get(client, 0) if client else 0} for the "
                         "client")]
        state = self._state(app)
        effects: list[Effect[T]] = []
        if shape.free > 0:  # room appeared since the shell looked (it cannot, but be exact)
            shape = self._release(app, state, now, shape, effects)
        self._maybe_wake(app, state, now, shape, effects)
        self._arm(app, state, now, effects)
        return effects

    def forget(self, app: str, item: T) -> bool:
        """`item` left while held (its client went away): no answer is owed."""
        return self.holds.remove(app, item)

    def on_capacity(self, app: str, now: float, shape: Shape) -> list[Effect[T]]:
        """The app's machines may have room again (a request ended, a machine stopped
        draining) or carry more of other edges' requests: what fits is released, and what
        is still held may call for a wake (or, with none held, the machines past their hard
        limit with every edge's requests: `Shape.over`)."""
        if not self.holds.held(app) and shape.over <= 0:
            return []
        effects: list[Effect[T]] = []
        state = self._state(app)
        shape = self._release(app, state, now, shape, effects)
        self._maybe_wake(app, state, now, shape, effects)
        self._arm(app, state, now, effects)
        return effects

    def on_machine_added(self, app: str, now: float, shape: Shape,
                         boot_ms: float | None = None) -> list[Effect[T]]:
        """A machine became routable outside a wake answer (the registry feed). While a
        wake is in flight it is counted as that wake's (`boot_ms`: from its worker);
        otherwise it ends a backoff: requests still held after it may call for a wake (one
        that found another edge's wakes starting enough, say, is sized again)."""
        state = self._apps.get(app)
        if state is not None and state.wake is not None:
            state.wake.machine_seen(now, boot_ms)
            state.last = state.wake
        elif state is not None and state.backoff_until > now and self.holds.held(app):
            state.backoff_until = now
            effects: list[Effect[T]] = []
            shape = self._release(app, state, now, shape, effects)
            self._maybe_wake(app, state, now, shape, effects)
            self._arm(app, state, now, effects)
            return effects
        return self.on_capacity(app, now, shape)

    def on_machine_lost(self, app: str, now: float, shape: Shape) -> list[Effect[T]]:
        """A machine stopped serving: requests held for the app may need another one."""
        if not self.holds.held(app):
            return []
        effects: list[Effect[T]] = []
        state = self._state(app)
        self._maybe_wake(app, state, now, shape, effects)
        self._arm(app, state, now, effects)
        return effects

    def on_wake_answer(self, wake: Wake, now: float, shape: Shape, added: int,
                       place_ms: float, pull_ms: float, boot_ms: float) -> list[Effect[T]]:
        """Placement answered `wake`; `added`: machines the answer made routable that were
        not before (0: placement had nothing new, so back off before asking again)."""
        wake.answer(now, place_ms, pull_ms, boot_ms)
        app = wake.app
        state = self._state(app)
        if state.wake is wake:
            state.wake = None
        state.last = wake
        if added <= 0:
            state.backoff_until = now + self.backoff_s
        effects: list[Effect[T]] = []
        shape = self._release(app, state, now, shape, effects)
        self._maybe_wake(app, state, now, shape, effects)
        self._arm(app, state, now, effects)
        return effects

    def on_wake_predicted(self, wake: Wake, now: float, predicted_ms: float
                          ) -> list[Effect[T]]:
        """Placement predicts `wake`'s first machine ready `predicted_ms` after it was sent:
        the requests held that would expire first are shed now."""
        state = self._apps.get(wake.app)
        if state is None or state.wake is not wake:
            return []  # answered (or superseded) already: the prediction is moot
        wake.predicted_at = wake.sent_at + max(0.0, predicted_ms) / 1000.0
        effects: list[Effect[T]] = []
        # Past their deadline already (their timer is due): timed out, not shed.
        expired = self.holds.expire(now, wake.app)
        if expired:
            waits = [e.waited_s for e in expired]
            effects.append(Fail(wake.app, [e.item for e in expired], waits, "hold_timeout",
                                f"no machine could take the request within {max(waits):.3f}s"))
        late = self.holds.late(wake.app, wake.predicted_at, now)
        if late:
            effects.append(shed(wake.app, [e.item for e in late], [e.waited_s for e in late],
                                wake, now))
        if effects:
            self._arm(wake.app, state, now, effects)
        return effects

    def on_wake_failed(self, wake: Wake, now: float, shape: Shape, code: str,
                       detail: str) -> list[Effect[T]]:
        """`deadline` means machines are still booting (placement keeps them going): held
        requests wait out their own deadlines. Any other failure, with no machine
        started, is final for the requests held."""
        app = wake.app
        state = self._state(app)
        if state.wake is wake:
            state.wake = None
        state.backoff_until = now + self.backoff_s
        effects: list[Effect[T]] = []
        if shape.started == 0 and code != "deadline":
            self._fail_all(app, now, code, f"wake failed: {detail}", effects)
        else:
            self._release(app, state, now, shape, effects)
        self._arm(app, state, now, effects)
        return effects

    def on_timer(self, app: str, now: float, shape: Shape | None) -> list[Effect[T]]:
        """The app's timer fired: expire what is due, wake if the backoff is over. `shape`
        None: the app no longer exists (its held requests get 404)."""
        state = self._state(app)
        state.armed = None
        effects: list[Effect[T]] = []
        if shape is None:
            self._fail_all(app, now, "unknown_app", "the app was deleted", effects)
            self._apps.pop(app, None)
            return effects
        expired = self.holds.expire(now, app)
        if expired:
            waits = [e.waited_s for e in expired]
            effects.append(Fail(app, [e.item for e in expired], waits, "hold_timeout",
                                f"no machine could take the request within {max(waits):.3f}s"))
        shape = self._release(app, state, now, shape, effects)
        self._maybe_wake(app, state, now, shape, effects)
        self._arm(app, state, now, effects)
        if not self.holds.held(app) and state.wake is None and state.armed is None:
            self._apps.pop(app, None)
        return effects

    def app_deleted(self, app: str, now: float) -> list[Effect[T]]:
        effects: list[Effect[T]] = []
        self._fail_all(app, now, "unknown_app", "the app was deleted", effects)
        state = self._apps.pop(app, None)
        if state is not None and state.armed is not None:
            effects.append(ArmTimer(app, None))
        return effects

    def shutdown(self, now: float) -> list[Effect[T]]:
        """Answer every held request (the edge is stopping) and disarm every timer."""
        effects: list[Effect[T]] = []
        for app in self.holds.apps():
            self._fail_all(app, now, "shutting_down", "the edge is stopping", effects)
        for app, state in self._apps.items():
            if state.armed is not None:
                effects.append(ArmTimer(app, None))
        self._apps.clear()
        return effects

    # -- rules ---------------------------------------------------------------------------

    def _release(self, app: str, state: _AppState, now: float, shape: Shape,
                 effects: list[Effect[T]]) -> Shape:
        """Release what the machines can take; the shape with those requests in flight."""
        if shape.free <= 0 or not self.holds.held(app):
            return shape
        last = state.last
        out: list[Released[T]] = []
        for item, since in self.holds.release_since(app, shape.free):
            wake = last if last is not None and last.machine_at >= since else None
            out.append(Released(item, now - since, wake))
        effects.append(Release(app, out))
        return replace(shape, in_flight=shape.in_flight + len(out), free=shape.free - len(out))

    def _maybe_wake(self, app: str, state: _AppState, now: float, shape: Shape,
                    effects: list[Effect[T]]) -> None:
        held = self.holds.held(app)
        if (not shape.auto_start or (held == 0 and shape.over <= 0)
                or state.wake is not None or now < state.backoff_until):
            return
        demand = shape.in_flight + held
        count = machines_to_start(demand + shape.elsewhere, shape.started, shape.soft_limit,
                                  shape.max_machines)
        if count <= 0:
            return
        wake = state.wake = Wake(app, count, now)
        # at least 1 ms: placement refuses less, and the app would never start
        effects.append(CallPlacement(app, count, max(1, int(shape.hold_timeout_s * 1000)), wake,
                                     demand))

    def _fail_all(self, app: str, now: float, code: str, detail: str,
                  effects: list[Effect[T]]) -> None:
        held = self.holds.release_since(app, self.holds.held(app))
        if held:
            effects.append(Fail(app, [item for item, _ in held],
                                [now - since for _, since in held], code, detail))

    def _arm(self, app: str, state: _AppState, now: float, effects: list[Effect[T]]) -> None:
        """One timer per app at its earliest deadline, or when its backoff ends if requests
        wait for a wake; an earlier one armed already stays (it fires and re-arms)."""
        want = self.holds.next_deadline(app)
        if (state.wake is None and state.backoff_until > now and self.holds.held(app)
                and (want is None or state.backoff_until < want)):
            want = state.backoff_until
        if want is None:
            if state.armed is not None:
                state.armed = None
                effects.append(ArmTimer(app, None))
            return
        if state.armed is None or want < state.armed:
            state.armed = want
            effects.append(ArmTimer(app, want))
