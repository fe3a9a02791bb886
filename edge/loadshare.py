"""Requests in flight at each machine, shared by every edge; and each edge's demand.

An edge balances, enforces `hard_limit` and decides auto-stop from a machine's
`in_flight`. With several edges a machine also serves the others' requests, which
one edge alone never sees: two edges could each send it `hard_limit`, and one could
ask to stop a machine another keeps busy. So every `interval_s` each edge publishes
its own requests in flight per machine, with its demand per app (requests in flight
plus held: what placement sums when it sizes a wake, so warm traffic on one edge
counts in another's wake), and reads every other edge's; a machine's `in_flight` is
then the edge's own requests plus the others' (`elsewhere`), and a machine busy
elsewhere is not idle here (its `last_start` is kept current). Requests start and end
on the hot path as before (`in_flight` ± 1): only this loop touches `elsewhere`.

Entries expire after `TTL_INTERVALS` intervals: a dead edge's load stops counting
within about a second. The limits hold up to one interval's staleness: edges that
send to a machine's last free slots within one interval may together pass
`hard_limit` until the next. An idle edge — nothing of its own to publish or withdraw,
and none of the others' load on the machines it knows — shares once in `IDLE_EVERY`
intervals instead of every one (a round is a Lua script on Redis and its Python on
both sides): another edge's load that begins on its machines is seen up to
`IDLE_EVERY` intervals (a second) later, so for its first requests after idling the
staleness above is a second, not a quarter; once it has anything of its own (a
request, a held one, a withdrawal) or sees the others' load, it shares every interval.

An unused edge (no client, nothing held) that is idle rests instead: no round at all
until something it decided on changes. What it must not miss is another edge's load
beginning on its machines, so an edge whose share names a machine its last share did
not adds news to the board in the same call (`share(..., news=True)`; the board adds it
too when the edge's entry was lost or lapsed), and every edge
keeps one blocked read on the news (`news()`: a single long-lived call, nothing while
nothing happens). A rest ends on news, on the edge's first client, on a change in its
view (a machine another edge already loads may appear in it), on `refresh()`, when the
news cannot be read (the edge then goes back to rounds), and after `REST_MAX_S` in any
case. A round rests only if the news was being read before the round read the board,
so nothing written between the two is missed; the first requests of a resting edge's
next client are routed on loads as fresh as a busy edge's. Auto-stop never acts on an
older view: it asks for the others' loads as of now (`refresh`: the next round shares
whatever it has, unless the last was within an interval and a half) and stops nothing
when they cannot be read.
The board away (Redis down), each edge counts its own, as with one edge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from edge.core import balance
from edge.view import AppEntry, MachineSlot, View
from ground.periodic import Periodic
from ground.tasks import cancel_and_wait

log = logging.getLogger("thaw.edge")

INTERVAL_S = 0.25
TTL_INTERVALS = 4
# an idle edge (no requests of its own, no demand, none of the others' load on the
# machines it knows) shares once in this many intervals: once per its entries' TTL
IDLE_EVERY = TTL_INTERVALS
MAX_REQUESTS = 1_000_000  # requests at one machine, at most, as others report them
# a resting edge shares at least this often (a bound on what a lost stir could delay)
REST_MAX_S = 30.0
NEWS_BLOCK_S = 30.0  # one blocked read of the news lasts at most this long

Loads = dict[str, dict[str, int]]  # app -> machine id -> requests in flight


class LoadBoard(Protocol):
    """Where edges publish their loads and demand, and read the others'."""

    async def share(self, edge: str, loads: Loads, demand: dict[str, int],
                    ttl_s: float, news: bool = False) -> Loads:
        """Replace `edge`'s loads (and its demand of each app named: 0 withdraws it)
        for `ttl_s`; every other edge's unexpired loads, summed. `news`: add news (in the
        same step as the loads, so news read means the loads are there to read); never
        with no loads. News is added also when `loads` has any and `edge`'s entry was
        gone or lapsed (the board lost it: the others last read none of it, whatever this
        edge last shared)."""
        ...

    async def news(self, after: str, block_s: float) -> str:
        """The newest news's position as soon as there is news after position `after`
        (`after` itself if none within `block_s`); `after` "": the position now, at
        once. Positions only grow."""
        ...

    async def report(self, edge: str, app: str, demand: int, ttl_s: float) -> int:
        """Write `edge`'s demand of `app` for `ttl_s` (0 withdraws it), then read every
        edge's unexpired demand of it, this one's included, in one step (what a wake's
        sizing reads)."""
        ...

    async def close(self) -> None: ...


@dataclass
class MemoryLoadBoard:
    """Several edges in one process (tests)."""

    clock: Callable[[], float] = time.monotonic
    loads: dict[str, tuple[float, Loads]] = field(default_factory=dict)
    demands: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)
    newest: int = 0  # news added so far
    _news: asyncio.Event | None = None  # set on news (made on first wait: needs a loop)

    async def share(self, edge: str, loads: Loads, demand: dict[str, int],
                    ttl_s: float, news: bool = False) -> Loads:
        now = self.clock()
        previous = self.loads.get(edge)
        lapsed = previous is None or previous[0] <= now or not previous[1]
        if loads and (news or lapsed):
            self.newest += 1
            if self._news is not None:
                self._news.set()
                self._news = None
        self.loads[edge] = (now + ttl_s, loads)
        for app, requests in demand.items():
            self._put_demand(edge, app, requests, now + ttl_s)
        others = [entry for other, (until, entry) in self.loads.items()
                  if other != edge and until > now]
        return summed(others)

    async def news(self, after: str, block_s: float) -> str:
        if after and int(after) >= self.newest:
            if self._news is None:
                self._news = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(block_s):
                    await self._news.wait()
        return str(self.newest)

    async def report(self, edge: str, app: str, demand: int, ttl_s: float) -> int:
        self._put_demand(edge, app, demand, self.clock() + ttl_s)
        return self.demand(app)

    def _put_demand(self, edge: str, app: str, requests: int, until: float) -> None:
        if requests > 0:
            self.demands.setdefault(app, {})[edge] = (until, requests)
        else:
            self.demands.get(app, {}).pop(edge, None)

    async def close(self) -> None:
        """Nothing is held open."""

    def demand(self, app: str) -> int:
        """Every edge's unexpired demand of `app` (what placement reads)."""
        now = self.clock()
        return sum(n for until, n in self.demands.get(app, {}).values() if until > now)


def crowded(entry: AppEntry) -> bool:
    """Whether a machine of the app has more requests than its hard limit, every edge's."""
    return balance.over_limit(entry.routable, entry.config.concurrency.hard_limit) > 0


def summed(boards: Iterable[Loads]) -> Loads:
    """Every edge's requests per machine, added up; an entry outside 1..`MAX_REQUESTS`
    (another edge's bug, or a damaged entry) counts as nothing or as that bound."""
    total: Loads = {}
    for loads in boards:
        for app, machines in loads.items():
            into = total.setdefault(app, {})
            for machine, requests in machines.items():
                if requests > 0:
                    into[machine] = min(MAX_REQUESTS, into.get(machine, 0) + requests)
    return total


class LoadShare:
    def __init__(self, view: View, board: LoadBoard, edge_id: str,
                 held: Callable[[str], int], held_apps: Callable[[], Iterable[str]],
                 room: Callable[[AppEntry], None], interval_s: float = INTERVAL_S,
                 unused: Callable[[], bool] = lambda: False) -> None:
        """`held(app)`/`held_apps()`: the requests this edge holds; `room(app)`: others' load
        on an app's machines changed: release what now fits, ask for machines if the held
        requests need more; `unused()`: true when the edge has no client connection and
        holds nothing, so no app has a request of its own (a round need not look)."""
        self.view = view
        self.board = board
        self.edge_id = edge_id
        self.held = held
        self.held_apps = held_apps
        self.room = room
        self.interval_s = interval_s
        self.unused = unused
        self._loaded: set[MachineSlot] = set()  # slots with others' load on them
        self._demanded: set[str] = set()  # apps whose demand was last published non-zero
        self._sent: Loads = {}  # this edge's loads as last published
        self._quiet = 0  # idle rounds skipped since the last share (a rest sets it due)
        # while the news is being read, the number of the read that began then (a round
        # rests only if the same read went on through it); 0 while it cannot be read
        self.listening = 0
        self._listens = 0
        # refresh() calls waiting for a round: the next round shares, whatever it has
        self._waiting: list[asyncio.Future[bool]] = []
        self._shared_at = float("-inf")  # view clock of the last share that answered
        self._rounds = Periodic("loads not shared with other edges", self.once, interval_s,
                                log, on_error=self._alone)
        self._listener: asyncio.Task[None] | None = None

    def collect(self) -> tuple[Loads, dict[str, int]]:
        """This edge's own requests in flight per machine, and its demand per app (0 for
        an app published before and idle now)."""
        loads: Loads = {}
        demand: dict[str, int] = {}
        apps = self.view.apps
        for name in {*self.held_apps(), *(n for n, e in apps.items() if e.in_flight)}:
            entry = apps.get(name)
            own = entry.in_flight if entry is not None else 0
            wanted = own + self.held(name)
            if wanted > 0:
                demand[name] = wanted
            if entry is not None and own:
                mine = {m.id: m.in_flight - m.elsewhere for m in entry.machines.values()
                        if m.in_flight > m.elsewhere}
                if mine:
                    loads[name] = mine
        for name in self._demanded - demand.keys():
            demand[name] = 0
        return loads, demand

    def news(self, loads: Loads) -> bool:
        """Whether sharing `loads` is news to resting edges: it names a machine this
        edge's last share did not."""
        sent = self._sent
        return any(app not in sent or not machines.keys() <= sent[app].keys()
                   for app, machines in loads.items())

    def published(self, loads: Loads, demand: dict[str, int]) -> None:
        """`loads` and `demand` reached the board: the apps idle in it need no withdrawal
        again (until then, a round that failed sends it again); the others' loads are as
        of now (the refresh() calls waiting are answered: they go on once this round is
        applied)."""
        self._sent = loads
        self._demanded = {name for name, n in demand.items() if n > 0}
        self._shared_at = self.view.clock()
        self._answer(True)

    def apply(self, others: Loads) -> list[AppEntry]:
        """Count the other edges' requests at each machine; the apps whose machines now
        carry more or less of them than before."""
        changed: dict[str, AppEntry] = {}
        loaded: set[MachineSlot] = set()
        apps = self.view.apps
        now = self.view.clock()
        for name, machines in others.items():
            entry = apps.get(name)
            if entry is None:
                continue
            for machine, requests in machines.items():
                slot = entry.machines.get(machine)
                if slot is not None and requests > 0:
                    if requests != slot.elsewhere:
                        changed[name] = entry
                    slot.in_flight += requests - slot.elsewhere
                    slot.elsewhere = requests
                    slot.last_start = now  # busy: its idle time counts from when it is not
                    loaded.add(slot)
        for slot in self._loaded - loaded:
            slot.in_flight -= slot.elsewhere
            slot.elsewhere = 0
            entry = apps.get(slot.app)
            if entry is not None:
                changed[slot.app] = entry
        self._loaded = loaded
        return list(changed.values())

    def due(self, loads: Loads, demand: dict[str, int]) -> bool:
        """Whether this round shares: always while this edge has something to publish or
        withdraw, or the others have load on its machines, or a fresh read was asked
        for, or the last round rested; else once in IDLE_EVERY."""
        if (loads or demand or self._loaded or self._waiting
                or self._quiet >= IDLE_EVERY - 1):
            self._quiet = 0
            return True
        self._quiet += 1
        return False

    def fresh(self) -> bool:
        """Whether the others' loads were read within the last interval (and a half)."""
        return self.view.clock() - self._shared_at <= self.interval_s * 1.5

    def quiet(self) -> bool:
        """Nothing of this edge's own and none of the others' load on its machines."""
        return not self._loaded and not self._demanded and self.unused()

    def rest(self, listened: int) -> float | None:
        """After a round: how long to rest (None: no rest, the next round comes in an
        interval). Only a quiet edge with no refresh() waiting rests, and only if the
        news was read without a break from before this round read the board
        (`listening` then was `listened`) until now."""
        if listened and listened == self.listening and self.quiet() and not self._waiting:
            self._quiet = IDLE_EVERY - 1  # the round after a rest shares
            return REST_MAX_S
        return None

    def stir(self) -> None:
        """Something a rest was decided without changed (a client, the view): a round now."""
        self._rounds.stir()

    async def refresh(self) -> bool:
        """The others' loads as of now: read by the next round (within an interval)
        unless `fresh()`; False if that round failed (the board away)."""
        if self.fresh():
            return True
        if not self._rounds.running:
            return False
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._rounds.stir()
        return await waiter

    def _answer(self, read: bool) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(read)

    def own(self) -> tuple[Loads, dict[str, int]]:
        """`collect()`, but for an unused edge with no withdrawal due: nothing of its own,
        known without a look at every app."""
        return ({}, {}) if self.unused() and not self._demanded else self.collect()

    async def once(self) -> float | None:
        """One round: share if due; how long to rest after it (None: an interval)."""
        listened = self.listening
        loads, demand = self.own()
        if not self.due(loads, demand):
            return None
        others = await self.board.share(self.edge_id, loads, demand,
                                        self.interval_s * TTL_INTERVALS, self.news(loads))
        self.published(loads, demand)
        for entry in self.apply(others):
            # room to release into, or more machines to ask for: for what is held, or for
            # requests the edges together put past a machine's hard limit (edge/core/appwake.py)
            if self.held(entry.name) or crowded(entry):
                self.room(entry)
        return self.rest(listened)

    async def _listen(self) -> None:
        """Read the news for ever: each stirs the rounds. While it cannot be read, no round
        rests (each failure stirs a resting one back to rounds)."""
        position = ""
        while True:
            try:
                newer = await self.board.news(position, NEWS_BLOCK_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the board away: the rounds report it
                log.debug("the edges' load news not read: %s", exc)
                self.listening, position = 0, ""
                self._rounds.stir()
                await asyncio.sleep(self.interval_s * IDLE_EVERY)
                continue
            if not position:
                self._listens += 1
                self.listening = self._listens
            elif newer != position:
                self._rounds.stir()
            position = newer

    def _alone(self) -> None:
        """The board away (Redis down): count this edge's own requests only."""
        self.apply({})
        self._answer(False)

    @property
    def failed_rounds(self) -> int:
        return self._rounds.failed_rounds

    def start(self) -> None:
        self._rounds.start()
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def close(self) -> None:
        await cancel_and_wait(self._listener)
        self._listener = None
        await self._rounds.close()
        self._answer(False)
