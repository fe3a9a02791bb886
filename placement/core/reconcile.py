"""The reconciler's decision: what an app declares and what its agents report -> actions.

Level-triggered and pure (no IO, no clock, no asyncio): given the app's declared
shape (its current release, `min_machines_running`, `spares`, `max_machines`, the
release's rollout strategy) and the machines as observed (their worker alive or
not, what the shell is already doing to them), it returns the actions that move
the app towards its shape, each with the reason the shell logs and keeps as an
app event. The shell carries them out and marks what it works on as busy: a
second pass over the same observation issues nothing.

Rules, in order:
1. A machine on a worker that is failed is lost: it is fenced (never counted,
   started or routed to again); once its worker is back it is destroyed, or taken back
   (unfenced, counted again) when the worker came back under the epoch it was fenced
   under: its agent never restarted, so the machine never stopped being its (a surplus
   made meanwhile is trimmed by rule 6). A worker in doubt (placement/core/liveness.py)
   is not failed: its machines are seen as they were last seen.
2. A release being rolled out fails when one of its machines failed; it is complete
   when no machine of an older release is left. Otherwise a failed machine, of any
   release, is destroyed (its failure, with its last output, is the reason kept in the
   app's events) and no longer counts: it never holds a place under `max_machines`,
   so the app is brought back to its shape by new machines (which the shell holds back
   while new machines keep failing: `held_back`).
3. Machines of an older release are replaced (a new one like it, started if it ran,
   then the old one destroyed), as many at a time as the strategy allows:
   `rolling` `max_unavailable`, `immediate` all, `canary` one until a machine of the
   release has started, then all.
4. `min_machines_running` machines of the current release run: a standby is started
   (on a worker without a running machine of the app, where there is one), else
   one is created.
5. `spares` standbys of the current release exist (created, stopped or suspended); with
   more, a never-started standby made for spares is destroyed (spares was lowered; a
   standby a wake or an owner made, or one left stopped, is not this rule's).
6. Never more than `max_machines` (a rollout may pass it by the replacements in
   flight): creates are capped, and a surplus is destroyed, standbys first.

New machines are placed by the market with `avoid` (the workers already holding
one of the app's machines that must run or stand by): a hard preference the shell
drops only when no other worker fits, and says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from ground.appconfig import Strategy

GONE = frozenset({"destroying", "destroyed"})
RUNNING = frozenset({"starting", "started"})
# Best standby to start first: resuming a frozen process is fastest, then a stopped
# machine (image and rootfs ready), then a spare never started.
STANDBY_ORDER = ("suspended", "stopped", "created")
STANDBY = frozenset(STANDBY_ORDER)



@dataclass(frozen=True)
class Seen:
    """One machine of the app as observed."""

    id: str
    worker: str
    state: str
    release: int  # the release it was created for
    live: bool = True  # its worker is not failed (fresh, or in doubt)
    same_epoch: bool = False  # fenced, its worker runs under the epoch it was fenced under
    reason: str = ""  # its last event's reason (why it failed, for one that did)
    for_spares: bool = False  # made to keep `spares` (not by a wake or by hand)


@dataclass(frozen=True)
class Declared:
    """The app's declared shape (its config and current release)."""

    release: int
    min_running: int = 0
    spares: int = 0
    max_machines: int = 3
    strategy: Strategy = "rolling"
    max_unavailable: int = 1
    rolling_out: bool = False  # the current release is not yet complete


@dataclass(frozen=True)
class Busy:
    """What the shell (or a wake) is already doing for the app."""

    machines: frozenset[str] = frozenset()  # being started, replaced or destroyed
    starting: frozenset[str] = frozenset()  # of those, being started: they count as running
    destroying: frozenset[str] = frozenset()  # of those, being destroyed: they count no more
    creating_running: int = 0  # new machines being placed to run
    creating_standby: int = 0  # new standbys being placed
    replacing: int = 0  # replacements in flight (counted in `machines` by their old one)


@dataclass(frozen=True)
class Start:
    machine: str
    reason: str


@dataclass(frozen=True)
class Create:
    start: bool
    reason: str
    avoid: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Replace:
    machine: str
    start: bool  # the new one runs (the old one did) or stands by
    reason: str
    avoid: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Destroy:
    machine: str
    reason: str
    failed: bool = False  # it failed in the current release: new machines are held back


@dataclass(frozen=True)
class Fence:
    machine: str
    reason: str


@dataclass(frozen=True)
class Unfence:
    machine: str
    reason: str


@dataclass(frozen=True)
class CompleteRelease:
    release: int
    reason: str


@dataclass(frozen=True)
class FailRelease:
    release: int
    reason: str


Action = Start | Create | Replace | Destroy | Fence | Unfence | CompleteRelease | FailRelease


def reconcile(
    declared: Declared,
    machines: Sequence[Seen],
    busy: Busy = Busy(),
    fenced: Collection[str] = frozenset(),
    workers: Collection[str] = (),
) -> list[Action]:
    """The actions that move the app towards `declared` (empty: it has its shape).

    `workers`: the live workers of the app's region (where a new machine could go)."""
    actions: list[Action] = []
    present = [m for m in machines if m.state not in GONE]
    for m in present:
        if not m.live and m.id not in fenced:
            actions.append(Fence(m.id, f"worker {m.worker} is down: machine {m.id} is lost"))
        elif m.live and m.id in fenced and m.same_epoch:
            actions.append(Unfence(m.id, f"worker {m.worker} is back under the same epoch: "
                                         f"machine {m.id} is taken back"))
        elif m.live and m.id in fenced and m.id not in busy.machines:
            actions.append(Destroy(m.id, f"worker {m.worker} is back: machine {m.id} was "
                                         "lost and is not used again"))
    counted = [m for m in present if m.live and (m.id not in fenced or m.same_epoch)
               and m.id not in busy.destroying]
    current = [m for m in counted if m.release == declared.release]
    old = [m for m in counted if m.release != declared.release]

    failed_new = [m for m in current if m.state == "failed"]
    if declared.rolling_out and failed_new:
        why = f": {failed_new[0].reason}" if failed_new[0].reason else ""
        actions.append(FailRelease(declared.release, f"machine {failed_new[0].id} of release "
                                   f"{declared.release} failed{why}"))
        return actions  # the shell goes back to the previous release; no more for now
    for m in old:
        if m.state == "failed" and m.id not in busy.machines:
            actions.append(Destroy(m.id, f"machine {m.id} of release {m.release} failed; "
                                         f"release {declared.release} replaces it"))
    old = [m for m in old if m.state != "failed" or m.id in busy.machines]
    for m in failed_new:
        if m.id not in busy.machines:
            why = f": {m.reason}" if m.reason else ""
            actions.append(Destroy(m.id, f"machine {m.id} of release {m.release} failed"
                                         f"{why}; it is replaced", failed=True))
    current = [m for m in current if m.state != "failed"]
    actions += _replace_old(declared, current, old, busy)
    if declared.rolling_out and not old and busy.replacing == 0:
        actions.append(CompleteRelease(declared.release,
                                       f"every machine runs release {declared.release}"))
    actions += _shape(declared, current, old, busy, workers)
    return actions


def _replace_old(declared: Declared, current: Sequence[Seen], old: Sequence[Seen],
                 busy: Busy) -> list[Action]:
    idle_old = sorted((m for m in old if m.id not in busy.machines),
                      key=lambda m: (m.state not in RUNNING, m.id))
    if not idle_old:
        return []
    if declared.strategy == "immediate":
        allowed = len(idle_old)
    elif declared.strategy == "canary" and not any(m.state == "started" for m in current):
        allowed = 1 - busy.replacing
    elif declared.strategy == "canary":
        allowed = len(idle_old)
    else:
        allowed = max(1, declared.max_unavailable) - busy.replacing
    holding = _holding(current)
    actions: list[Action] = []
    for m in idle_old[:max(0, allowed)]:
        start = m.state in RUNNING
        actions.append(Replace(m.id, start, f"release {declared.release} replaces machine "
                                            f"{m.id} of release {m.release}", holding))
    return actions


def _holding(current: Sequence[Seen]) -> frozenset[str]:
    """Workers that already hold one of the app's machines of the current release that
    run or stand by (new ones go elsewhere where they can)."""
    return frozenset(m.worker for m in current if m.state in RUNNING | STANDBY)


def _shape(declared: Declared, current: Sequence[Seen], old: Sequence[Seen],
           busy: Busy, workers: Collection[str]) -> list[Action]:
    """Min running, spares, and the max_machines cap, in that order (each rule sees what
    the one before it took). Machines of an older release still count while they serve
    or stand by: each is replaced one for one (rule 3)."""
    serving = [m for m in (*current, *old) if m.state in RUNNING or m.id in busy.starting]
    standby = sorted((m for m in current if m.state in STANDBY and m.id not in busy.machines),
                     key=lambda m: (STANDBY_ORDER.index(m.state), m.id))
    # What exists or is on its way counts against max_machines (a replacement in flight
    # is the one surge a rollout may take).
    exists = len(current) + len(old) + busy.creating_running + busy.creating_standby
    room = max(0, declared.max_machines - exists)
    holding = _holding(current)
    running, room, short = _to_min_running(declared, serving, standby, room, holding, busy,
                                           workers)
    # not while a rollout replaces machines (its replacement standbys stand in for old
    # ones, which count among `spares` until they are destroyed)
    rolling = bool(old) or busy.replacing > 0 or declared.rolling_out
    spares = _to_spares(declared, standby, old, room, holding, busy, short > 0 or rolling)
    gone = {a.machine for a in spares if isinstance(a, Destroy)}
    started = {a.machine for a in running if isinstance(a, Start)}
    return [*running, *spares,
            *_over_max(declared, current, old, busy, len(serving) + len(started), started,
                       gone)]


def _to_min_running(declared: Declared, serving: Sequence[Seen], standby: list[Seen],
                    room: int, holding: frozenset[str], busy: Busy, workers: Collection[str]
                    ) -> tuple[list[Start | Create], int, int]:
    """Starts and creates up to min_machines_running: a standby on a worker where none of
    the app's machines runs; failing that, a new machine on such a worker; only then a
    start beside a running machine. Takes the standbys it starts out of `standby`; the
    actions, the room left under max_machines, and how many are still short."""
    actions: list[Start | Create] = []
    running_workers = {m.worker for m in serving}
    running = len(serving) + busy.creating_running
    short = declared.min_running - running
    free = len(set(workers) - running_workers)  # workers where none of the app's runs
    reason = f"min_machines_running={declared.min_running}: {running} running"
    while short > 0:
        pick = next((m for m in standby if m.worker not in running_workers), None)
        if pick is None and (room == 0 or free == 0) and standby:
            pick = standby[0]
        if pick is not None:
            standby.remove(pick)
            free -= pick.worker not in running_workers and pick.worker in workers
            running_workers.add(pick.worker)
            actions.append(Start(pick.id, reason))
        elif room > 0:
            actions.append(Create(True, reason, holding))
            room -= 1
            free -= 1
        else:
            break
        short -= 1
    return actions, room, short


def _to_spares(declared: Declared, standby: Sequence[Seen], old: Sequence[Seen], room: int,
               holding: frozenset[str], busy: Busy, hold: bool) -> list[Create | Destroy]:
    """New standbys up to `spares` (within the `room` left), or the never-started ones
    made for it beyond it, unless `hold` (see `_trim_spares`). `standby`: the idle
    standbys of the current release left after the starts."""
    seen = len(standby) + sum(1 for m in old if m.state in STANDBY)
    spares = seen + busy.creating_standby
    actions: list[Create | Destroy] = [
        Create(False, f"spares={declared.spares}: {spares} standing by", holding)
        for _ in range(min(room, max(0, declared.spares - spares)))]
    # Only standbys seen make a surplus (as in `_over_max`): one being created may already
    # be among them (its agent reports it before the create answers its creator)
    return actions + _trim_spares(declared, standby, seen, hold)


def _over_max(declared: Declared, current: Sequence[Seen], old: Sequence[Seen], busy: Busy,
              running_left: int, started: set[str], gone: set[str]) -> list[Destroy]:
    """Destroys down to max_machines, never below min_machines_running: failed machines,
    never-started spares, stopped, suspended, then running ones, a crowded worker's
    first; not while old machines are replaced. `running_left`: machines running once
    the starts are done; `started`, `gone`: machines the rules before started, or
    destroyed as spares. Only machines seen make a surplus: one being created may
    already be among them (an agent reports it before its creator hears back), and a
    count twice is a machine destroyed for nothing."""
    seen = len(current) + len(old) - len(gone)
    surplus = seen - declared.max_machines
    if surplus <= 0 or old or busy.replacing > 0:
        return []
    actions: list[Destroy] = []
    idle = (m for m in current
            if m.id not in busy.machines and m.id not in started and m.id not in gone)
    crowd = Counter(m.worker for m in current)  # a crowded worker's machines go first
    for m in sorted(idle, key=lambda m: (_surplus_rank(m), -crowd[m.worker], m.id)):
        if surplus == 0:
            break
        if m.state in RUNNING:
            if running_left <= declared.min_running:
                break
            running_left -= 1
        actions.append(Destroy(m.id, f"max_machines={declared.max_machines}: {seen} machines"))
        surplus -= 1
    return actions


def _trim_spares(declared: Declared, standby: Sequence[Seen], spares: int,
                 hold: bool) -> list[Destroy]:
    """Never-started standbys made for `spares` beyond it (it was lowered), unless `hold`:
    the app is short of running machines (a standby may be about to be started for
    that), or a rollout is under way. `spares`: the standbys seen (none being created).
    `standby`: the idle standbys of the current release left after the starts."""
    extra = spares - declared.spares
    if extra <= 0 or hold:
        return []
    made = sorted((m for m in standby if m.state == "created" and m.for_spares),
                  key=lambda m: m.id)
    return [Destroy(m.id, f"spares={declared.spares}: {spares} standing by")
            for m in made[:extra]]


def _surplus_rank(m: Seen) -> int:
    """Which machines go first when there are too many: failed, never-started spares,
    stopped, suspended, then running ones."""
    return {"failed": 0, "created": 1, "stopped": 2, "suspended": 3}.get(m.state, 4)


# -- creates that found no room --------------------------------------------------------

NO_ROOM_FIRST_S, NO_ROOM_MAX_S = 1.0, 30.0


@dataclass(frozen=True)
class NoRoom:
    """Creates found no room among `workers`: none is tried again before `until` while
    those are the live workers (a level-triggered pass would otherwise retry at once,
    forever); `wait_s`: the wait that gave `until`, doubled by the next."""

    workers: frozenset[str]
    until: float
    wait_s: float


def found_no_room(last: NoRoom | None, workers: frozenset[str], now: float) -> NoRoom:
    """A create found no room at `now`: wait NO_ROOM_FIRST_S, doubling up to
    NO_ROOM_MAX_S while it keeps finding none among the same workers."""
    wait_s = NO_ROOM_FIRST_S
    if last is not None and last.workers == workers:
        wait_s = min(NO_ROOM_MAX_S, last.wait_s * 2)
    return NoRoom(workers, now + wait_s, wait_s)


def creates_held_back(stand: NoRoom | None, workers: frozenset[str], now: float) -> bool:
    """Creates wait: the last found no room among these same workers, and its wait has
    not passed (a worker that came or went may have room: no wait)."""
    return stand is not None and stand.workers == workers and now < stand.until



@dataclass(frozen=True)
class HeldBack:
    """New machines wait until `until`: creates, and replacements too when the wait is
    for machines that did not come up (a replacement would fail the same way)."""

    until: float
    replacements: bool


def held_back(no_room: NoRoom | None, failing: NoRoom | None, workers: frozenset[str],
              now: float) -> HeldBack | None:
    """Whether new machines wait: after a create that found no room (creates only), or
    after new machines that did not come up (creates and replacements: else a release
    that cannot start, with nothing to roll back to, makes and fails machines as fast as
    the host can). Both waits grow the same way (found_no_room)."""
    waits = [(w.until, w is failing) for w in (no_room, failing)
             if w is not None and creates_held_back(w, workers, now)]
    if not waits:
        return None
    return HeldBack(max(until for until, _ in waits), any(f for _, f in waits))
