"""A region's workers kept change by change, and placement's own reservations.

`RegionIndex` answers the questions a decision asks without scanning the fleet
or an image's holders: which workers hold most of this image's bytes (a cached,
bounded top per image, kept exact as holders change) and a few random workers
that can fit the guest (ids bucketed by free memory, drawn by index in O(1),
swap-removed on deletion). Invariants: every worker is in exactly one bucket
unless it is draining or its disk is full (then it is only drawn as a holder);
for every cached image top, each member holds at least `floor` bytes of the image
and no other worker holds more than `floor`. `ReservationLedger` adds the
reservations of placement's own recent offers to a worker's heartbeat until a
heartbeat produced after the offer carries them. Neither knows the registry,
clocks or random sources: `now` and the sampler are arguments.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections import Counter, OrderedDict, deque
from collections.abc import Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from msgspec.structs import replace

from ground.registry.types import WorkerStatus

IMAGES_CACHED = 4096  # image tops kept per region (least recently used dropped)
TOP_STEP = 4096  # holders summed per step of a top computed ahead (compute_top_steps)
TOP_SLACK = 2  # an image top is computed `TOP_SLACK` times k deep, so losing members is cheap
TOP_CAP = 4  # ... and trimmed when it grows past `TOP_CAP` times k
DRAW_ATTEMPTS = 4  # random draws per wanted worker before giving up


class Draw(Protocol):
    """A uniform source in [0, 1): `random.Random` is one."""

    def random(self) -> float: ...


ImageKey = frozenset[tuple[str, int]]  # the image's (layer digest, bytes) pairs


def image_key(layers: Mapping[str, int]) -> ImageKey:
    return frozenset(layers.items())


def free_memory_mb(worker: WorkerStatus) -> int:
    return worker.memory_mb - worker.reserved_memory_mb


def held_bytes(worker: WorkerStatus, image: Iterable[tuple[str, int]]) -> int:
    """Bytes of the image's layers the worker holds."""
    held = worker.layers
    return sum(size for digest, size in image if digest in held)


def _bucket(free_mb: int) -> int:
    """Buckets by powers of two: bucket b holds free memory in [2**(b-1), 2**b)."""
    return max(0, free_mb).bit_length()


@dataclass
class ImageTop:
    """The workers holding most of one image's bytes: worker id -> bytes held."""

    layers: tuple[tuple[str, int], ...]
    k: int  # the depth asked for when it was computed
    members: dict[str, int]
    floor: int  # no worker outside `members` holds more than this
    ranked: list[str] | None = None  # members best first, until one changes

    def update(self, worker: str, held: int) -> None:
        self.ranked = None
        if worker in self.members:
            if held < self.floor or held == 0:
                del self.members[worker]
            else:
                self.members[worker] = held
        elif held > self.floor:
            self.members[worker] = held
            if len(self.members) > TOP_CAP * self.k:
                self.trim()

    def trim(self) -> None:
        """Keep the best `TOP_SLACK` times k members (`trim_steps` in one go)."""
        for _ in self.trim_steps(max(1, len(self.members))):
            pass

    def trim_steps(self, step: int) -> Iterator[None]:
        """Keep the best `TOP_SLACK` times k members, going through `step` members at a
        time (the caller may yield between). Held bytes take few distinct values (sums of
        layer sizes), so the cut is found by counting them, not by sorting workers; ties
        at the cut go by lower id."""
        wanted = TOP_SLACK * self.k
        counts = Counter(self.members.values())
        kept_count, cut = 0, 0
        for value in sorted(counts, reverse=True):
            cut = value
            kept_count += counts[value]
            if kept_count >= wanted:
                break
        yield  # (counting is most of a step at 100,000 members)
        members = self.members
        ids = list(members)
        above: dict[str, int] = {}
        ties: list[str] = []
        for at in range(0, len(ids), step):
            part = ids[at:at + step]
            above.update((wid, members[wid]) for wid in part if members[wid] > cut)
            ties = heapq.nsmallest(wanted, [*ties, *(wid for wid in part if members[wid] == cut)])
            if at + step < len(ids):
                yield
        ties = ties[:max(0, wanted - len(above))]
        below = [value for value in counts if value < cut]
        floor = cut if kept_count > wanted else max(below, default=0)
        self.members = {**above, **dict.fromkeys(ties, cut)}
        self.floor = max(self.floor, floor)
        self.ranked = None

    def best(self, k: int) -> list[str] | None:
        """The k best holders, or None when the top lost too many members to know."""
        if len(self.members) < k and self.floor > 0:
            return None
        if self.ranked is None:
            self.ranked = sorted(self.members, key=lambda wid: (-self.members[wid], wid))
        return self.ranked[:k]


@dataclass
class RegionIndex:
    """The live workers of one region, by id, by free memory and by layer held."""

    workers: dict[str, WorkerStatus] = field(default_factory=dict)
    holders: dict[str, dict[str, int]] = field(default_factory=dict)  # digest -> id -> bytes
    _buckets: list[list[str]] = field(default_factory=list)
    _slot: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (bucket, index)
    _tops: OrderedDict[ImageKey, ImageTop] = field(default_factory=OrderedDict)
    _tops_by_layer: dict[str, set[ImageKey]] = field(default_factory=dict)
    _layer_changes: Counter[str] = field(default_factory=Counter)  # digest -> holder changes

    @classmethod
    def of(cls, workers: Iterable[WorkerStatus]) -> RegionIndex:
        index = cls()
        for worker in workers:
            index.upsert(worker)
        return index

    def __len__(self) -> int:
        return len(self.workers)

    def upsert(self, worker: WorkerStatus) -> None:
        old = self.workers.get(worker.id)
        self.workers[worker.id] = worker
        self._place(worker)
        before = old.layers if old is not None else {}
        if before != worker.layers:
            self._relayer(worker.id, before, worker.layers)

    def remove(self, worker_id: str) -> None:
        old = self.workers.pop(worker_id, None)
        if old is None:
            return
        self._unplace(worker_id)
        self._relayer(worker_id, old.layers, {})

    # -- drawing workers that fit --------------------------------------------------

    def _place(self, worker: WorkerStatus) -> None:
        eligible = not (worker.draining or worker.disk_full)
        wanted = _bucket(free_memory_mb(worker)) if eligible else -1
        slot = self._slot.get(worker.id)
        if slot is not None and slot[0] == wanted:
            return
        self._unplace(worker.id)
        if wanted < 0:
            return
        while len(self._buckets) <= wanted:
            self._buckets.append([])
        bucket = self._buckets[wanted]
        self._slot[worker.id] = (wanted, len(bucket))
        bucket.append(worker.id)

    def _unplace(self, worker_id: str) -> None:
        slot = self._slot.pop(worker_id, None)
        if slot is None:
            return
        bucket = self._buckets[slot[0]]
        last = bucket.pop()
        if last != worker_id:
            bucket[slot[1]] = last
            self._slot[last] = slot

    def draw(self, memory_mb: int, k: int, draw: Draw, exclude: frozenset[str] | set[str],
             fresh_since: float = -math.inf) -> list[WorkerStatus]:
        """Up to k distinct workers with at least `memory_mb` free (by their heartbeat),
        not draining, none of `exclude`, heard from at or after `fresh_since` (unix
        seconds; a stale one met is skipped); O(k + buckets)."""
        first = _bucket(memory_mb)
        pools = [b for b in self._buckets[first:] if b]
        total = sum(len(b) for b in pools)
        chosen: dict[str, WorkerStatus] = {}
        for _ in range(DRAW_ATTEMPTS * k):
            if len(chosen) >= k or total == 0:
                break
            at = int(draw.random() * total)
            for pool in pools:
                if at < len(pool):
                    break
                at -= len(pool)
            worker = self.workers[pool[at]]
            if (worker.id not in exclude and worker.id not in chosen
                    and free_memory_mb(worker) >= memory_mb
                    and worker.updated_at >= fresh_since):
                chosen[worker.id] = worker
        return list(chosen.values())

    # -- holders of an image's bytes ---------------------------------------------------

    def _relayer(self, worker_id: str, before: Mapping[str, int],
                 after: Mapping[str, int]) -> None:
        changed = before.keys() ^ after.keys()
        self._layer_changes.update(changed)
        for digest in changed:
            if digest in after:
                self.holders.setdefault(digest, {})[worker_id] = after[digest]
            else:
                holding = self.holders.get(digest)
                if holding is not None:
                    holding.pop(worker_id, None)
                    if not holding:
                        del self.holders[digest]
        touched = {key for d in changed for key in self._tops_by_layer.get(d, ())}
        worker = self.workers.get(worker_id)
        for key in touched:
            top = self._tops[key]
            held = held_bytes(worker, top.layers) if worker is not None else 0
            top.update(worker_id, held)

    def top_holders(self, layers: Mapping[str, int], k: int) -> list[WorkerStatus]:
        """The k workers holding most of the image's bytes (ties: lower id first)."""
        if not layers or k <= 0:
            return []
        key = image_key(layers)
        top = self._tops.get(key)
        best = top.best(k) if top is not None and top.k >= k else None
        if best is None:
            top = self._compute_top(key, k)
            best = top.best(k) or []
        self._tops.move_to_end(key)
        return [self.workers[wid] for wid in best]

    def knows_top(self, layers: Mapping[str, int], k: int) -> bool:
        """The image's top `k` holders are cached: the next `top_holders` scans nothing."""
        top = self._tops.get(image_key(layers))
        return top is not None and top.k >= k and top.best(k) is not None

    def _compute_top(self, key: ImageKey, k: int) -> ImageTop:
        """Once per image (and again only if the top lost too many members): every holder
        of every layer, summed, O(holders) with a dict update each; in one go."""
        steps = self._top_steps(tuple(sorted(key)), k, sys.maxsize)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                top: ImageTop = done.value
                break
        self._remember(key, top)
        return top

    def compute_top_steps(self, layers: Mapping[str, int], k: int,
                          step: int = TOP_STEP) -> Iterator[None]:
        """What `top_holders` computes for an image whose top is not cached, in steps of
        about `step` holders: the caller yields to its loop at each step. The top is
        kept only if no layer of the image changed holders meanwhile (else the next
        decision for it computes it whole)."""
        if not layers or self.knows_top(layers, k):
            return
        key = image_key(layers)
        ordered = tuple(sorted(key))
        seen = [self._layer_changes[digest] for digest, _ in ordered]
        top = yield from self._top_steps(ordered, k, step)
        if [self._layer_changes[digest] for digest, _ in ordered] == seen:
            self._remember(key, top)

    def _top_steps(self, layers: tuple[tuple[str, int], ...], k: int,
                   step: int) -> Generator[None, None, ImageTop]:
        """The image's top from every holder's bytes of it, summed and trimmed `step`
        holders at a time (yielding between steps); returned at the end."""
        held: dict[str, int] = {}
        for digest, size in layers:
            holders = list(self.holders.get(digest, ()))
            for at in range(0, len(holders), step):
                for wid in holders[at:at + step]:
                    held[wid] = held.get(wid, 0) + size
                yield
        top = ImageTop(layers, k, held, 0)
        if len(held) > TOP_SLACK * k:
            yield from top.trim_steps(step)
        return top

    def _remember(self, key: ImageKey, top: ImageTop) -> None:
        if key not in self._tops and len(self._tops) >= IMAGES_CACHED:
            old_key, _ = self._tops.popitem(last=False)
            for digest, _size in old_key:
                self._tops_by_layer.get(digest, set()).discard(old_key)
        self._tops[key] = top
        for digest, _size in key:
            self._tops_by_layer.setdefault(digest, set()).add(key)



@dataclass(frozen=True)
class Reservation:
    worker: str
    cpus: float
    memory_mb: int
    at: float  # unix seconds of the offer


class ReservationLedger:
    """Placement's own accepted offers, counted on top of each worker's heartbeat until
    a heartbeat produced after the offer (`updated_at` ≥ `at`) carries them, or
    `hold_s` has passed (a heartbeat that never comes, or a clock skewed behind)."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._by_worker: dict[str, list[Reservation]] = {}
        self._order: deque[Reservation] = deque()

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_worker.values())

    def reserve(self, worker: str, cpus: float, memory_mb: int, at: float) -> Reservation:
        entry = Reservation(worker, cpus, memory_mb, at)
        self._by_worker.setdefault(worker, []).append(entry)
        self._order.append(entry)
        self.expire(at)
        return entry

    def cancel(self, entry: Reservation) -> None:
        """The offer it was made for was declined (or never answered): it holds nothing."""
        entries = self._by_worker.get(entry.worker)
        if entries is not None and entry in entries:
            entries.remove(entry)
            if not entries:
                del self._by_worker[entry.worker]

    def expire(self, now: float) -> None:
        while self._order and self._order[0].at + self.hold_s <= now:
            entry = self._order.popleft()
            entries = self._by_worker.get(entry.worker)
            if entries is not None and entry in entries:
                entries.remove(entry)
                if not entries:
                    del self._by_worker[entry.worker]

    def view(self, worker: WorkerStatus, now: float) -> WorkerStatus:
        """The worker as its heartbeat says plus what it has not yet reported."""
        entries = self._by_worker.get(worker.id)
        if not entries:
            return worker
        pending = [e for e in entries
                   if e.at > worker.updated_at and e.at + self.hold_s > now]
        if len(pending) != len(entries):
            if pending:
                self._by_worker[worker.id] = pending
            else:
                del self._by_worker[worker.id]
        if not pending:
            return worker
        return replace(
            worker,
            reserved_cpus=worker.reserved_cpus + sum(e.cpus for e in pending),
            reserved_memory_mb=worker.reserved_memory_mb + sum(e.memory_mb for e in pending),
            machines_starting=worker.machines_starting + len(pending),
        )
