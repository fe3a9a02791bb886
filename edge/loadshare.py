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
An edge with no client still shares once a second: sharing nothing until its first
client would route that client's first requests on the others' loads as last read,
however old (docs/edge.md). Auto-stop never acts on an older view: it asks for the
others' loads as of now (`refresh`: the next round shares whatever it has, unless the
last was within an interval and a half) and stops nothing when they cannot be read.
The board away (Redis down), each edge counts its own, as with one edge.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from edge.view import AppEntry, MachineSlot, View
from ground.periodic import Periodic

log = logging.getLogger("thaw.edge")

INTERVAL_S = 0.25
TTL_INTERVALS = 4
# an idle edge (no requests of its own, no demand, none of the others' load on the
# machines it knows) shares once in this many intervals: once per its entries' TTL
IDLE_EVERY = TTL_INTERVALS
MAX_REQUESTS = 1_000_000  # requests at one machine, at most, as others report them

Loads = dict[str, dict[str, int]]  # app -> machine id -> requests in flight


class LoadBoard(Protocol):
    """Where edges publish their loads and demand, and read the others'."""

    async def share(self, edge: str, loads: Loads, demand: dict[str, int],
                    ttl_s: float) -> Loads:
        """Replace `edge`'s loads (and its demand of each app named: 0 withdraws it)
        for `ttl_s`; every other edge's unexpired loads, summed."""
        ...

    async def close(self) -> None: ...


@dataclass
class MemoryLoadBoard:
    """Several edges in one process (tests)."""

    clock: Callable[[], float] = time.monotonic
    loads: dict[str, tuple[float, Loads]] = field(default_factory=dict)
    demands: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)

    async def share(self, edge: str, loads: Loads, demand: dict[str, int],
                    ttl_s: float) -> Loads:
        now = self.clock()
        self.loads[edge] = (now + ttl_s, loads)
        for app, requests in demand.items():
            if requests > 0:
                self.demands.setdefault(app, {})[edge] = (now + ttl_s, requests)
            else:
                self.demands.get(app, {}).pop(edge, None)
        others = [entry for other, (until, entry) in self.loads.items()
                  if other != edge and until > now]
        return summed(others)

    async def close(self) -> None:
        """Nothing is held open."""

    def demand(self, app: str) -> int:
        """Every edge's unexpired demand of `app` (what placement reads)."""
        now = self.clock()
        return sum(n for until, n in self.demands.get(app, {}).values() if until > now)


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
        self._quiet = 0  # idle rounds skipped since the last share
        # refresh() calls waiting for a round: the next round shares, whatever it has
        self._waiting: list[asyncio.Future[bool]] = []
        self._shared_at = float("-inf")  # view clock of the last share that answered
        self._rounds = Periodic("loads not shared with other edges", self.once, interval_s,
                                log, on_error=self._alone)

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

    def published(self, demand: dict[str, int]) -> None:
        """`demand` reached the board: the apps idle in it need no withdrawal again (until
        then, a round that failed sends it again); the others' loads are as of now (the
        refresh() calls waiting are answered: they go on once this round is applied)."""
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
        for; else once in IDLE_EVERY."""
        if loads or demand or self._loaded or self._waiting or self._quiet >= IDLE_EVERY - 1:
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

    async def refresh(self) -> bool:
        """The others' loads as of now: read by the next round (within an interval)
        unless `fresh()`; False if that round failed (the board away)."""
        if self.fresh():
            return True
        if not self._rounds.running:
            return False
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
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

    async def once(self) -> None:
        loads, demand = self.own()
        if not self.due(loads, demand):
            return
        others = await self.board.share(self.edge_id, loads, demand,
                                        self.interval_s * TTL_INTERVALS)
        self.published(demand)
        for entry in self.apply(others):
            if self.held(entry.name):  # room to release into, or more machines to ask for
                self.room(entry)

    def _alone(self) -> None:
        """The board away (Redis down): count this edge's own requests only."""
        self.apply({})
        self._answer(False)

    @property
    def failed_rounds(self) -> int:
        return self._rounds.failed_rounds

    def start(self) -> None:
        self._rounds.start()

    async def close(self) -> None:
        await self._rounds.close()
        self._answer(False)
