"""Hold queues: which held requests wait, expire or are released, and in what order.

One bounded FIFO per app plus a bound on the total held over all apps
(`max_held_total`). An app holds at most `max_pending` (its own setting) and at most
`max_share` of the total (the edge's, 10 % by default): one tenant's flood of held
requests fills its own queue (503 `queue_full`, for it alone) and leaves the rest of
the edge to others; it takes more than one app at its share to make anyone's cold start
`edge_full` (a static share, not a weighted fair queue: predictable for an owner, and
it needs no eviction of requests already held). A client (its address, or the one a
trusted proxy names) holds at most `max_per_client` over all apps (429
`too_many_held`, for it alone): one source cannot take an app's share from the app's
other users, nor the edge from every app. Each entry has a deadline: `now + min(hold
timeout, the client's timeout when it gave one)`. Invariants: release is FIFO
per app; an entry leaves exactly once (released, expired, removed or failed);
a full queue is a return value, not an exception; expiry costs O(expired *
log held), not a scan of everything held (a heap of deadlines per app, entries
that left by another way are skipped lazily), and so does taking out the items
whose deadline comes before a predicted start (`late`). It knows nothing of
sockets or clocks: `now` is an argument, items are opaque.

The client's own bound is `X-Request-Timeout: <seconds>` (`request_timeout_s`
reads it from the head's forwarded lines): a decimal number in (0, 3600];
anything else is ignored, as if the header were not there. A gRPC call's deadline,
`grpc-timeout` (1 to 8 digits and a unit, gRPC over HTTP/2), bounds it the same way
(`grpc_timeout_s`): no use holding a call its client has given up on.
"""

from __future__ import annotations

import heapq
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
MAX_REQUEST_TIMEOUT_S = 3600.0
_REQUEST_TIMEOUT = re.compile(rb"(?:^|\n)x-request-timeout:[ \t]*([^\r\n]*)")
_SECONDS = re.compile(rb"[0-9]{1,7}(?:\.[0-9]{1,6})?")
# the name in any case, the unit as it is (M is minutes, m milliseconds)
_GRPC_TIMEOUT = re.compile(
    rb"(?:^|\n)(?i:grpc-timeout):[ \t]*([0-9]{1,8})([HMSmun])[ \t]*(?:\r|\n|$)")
GRPC_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def request_timeout_s(header_lines: bytes) -> float | None:
    """The client's `X-Request-Timeout` in seconds, from `Name: value\r\n` lines (the
    first such header counts), or None: absent, not a plain decimal number, 0, or more
    than MAX_REQUEST_TIMEOUT_S."""
    found = _REQUEST_TIMEOUT.search(header_lines.lower())
    if found is None:
        return None
    value = found.group(1).strip()
    if not _SECONDS.fullmatch(value):
        return None
    seconds = float(value)
    return seconds if 0 < seconds <= MAX_REQUEST_TIMEOUT_S else None


def grpc_timeout_s(header_lines: bytes) -> float | None:
    """A gRPC call's `grpc-timeout` in seconds, from `Name: value\r\n` lines (the first
    such header counts), or None: absent or not one (then ignored)."""
    found = _GRPC_TIMEOUT.search(header_lines)
    if found is None:
        return None
    return int(found.group(1)) * GRPC_TIMEOUT_UNITS[found.group(2)]


@dataclass(frozen=True)
class Held:
    """The item waits; `deadline` is in the caller's clock (seconds)."""

    position: int
    deadline: float


@dataclass(frozen=True)
class Rejected:
    """`reason` is "too_many_held" (the client's own bound), "queue_full" (the app's
    max_pending or its share of the edge) or "edge_full" (max_held_total)."""

    reason: str


@dataclass(frozen=True)
class Expired(Generic[T]):
    app: str
    item: T
    waited_s: float


@dataclass
class _Entry(Generic[T]):
    item: T
    since: float
    deadline: float
    seq: int  # tells this entry from a later one of an item with the same identity
    client: bytes | None  # whose it is, for the per-client bound (None: not bounded)


class HoldQueues(Generic[T]):
    """Items are keyed by identity: the same object may not be held twice."""

    def __init__(self, max_total: int, max_share: float = 1.0,
                 max_per_client: int | None = None) -> None:
        if max_total < 0:
            raise ValueError("max_total must be >= 0")
        if not 0.0 < max_share <= 1.0:
            raise ValueError("max_share must be in (0, 1]")
        if max_per_client is not None and max_per_client < 1:
            raise ValueError("max_per_client must be >= 1")
        self.max_total = max_total
        self.app_cap = max(1, int(max_total * max_share))  # what one app may hold
        self.client_cap = max_per_client
        self.by_client: dict[bytes, int] = {}  # items held per client (none: absent)
        self.total = 0
        self._queues: dict[str, OrderedDict[int, _Entry[T]]] = {}
        # per app, a heap of (deadline, seq, key): an app's timer looks at its own only
        self._deadlines: dict[str, list[tuple[float, int, int]]] = {}
        self._heaped = 0
        self._seq = 0

    def enqueue(
        self,
        app: str,
        item: T,
        now: float,
        hold_timeout_s: float,
        max_pending: int,
        client_timeout_s: float | None = None,
        client: bytes | None = None,
    ) -> Held | Rejected:
        if client is not None and self.client_cap is not None \
                and self.by_client.get(client, 0) >= self.client_cap:
            return Rejected("too_many_held")
        queue = self._queues.setdefault(app, OrderedDict())
        if len(queue) >= max_pending or len(queue) >= self.app_cap:
            return Rejected("queue_full")
        if self.total >= self.max_total:
            return Rejected("edge_full")
        budget = hold_timeout_s
        if client_timeout_s is not None:
            budget = min(budget, max(client_timeout_s, 0.0))
        self._seq += 1
        entry = _Entry(item, now, now + budget, self._seq, client)
        queue[id(item)] = entry
        if client is not None:
            self.by_client[client] = self.by_client.get(client, 0) + 1
        heapq.heappush(self._deadlines.setdefault(app, []), (entry.deadline, entry.seq, id(item)))
        self.total += 1
        self._heaped += 1
        if self._heaped > 2 * self.total + 64:
            self._compact()
        return Held(len(queue), entry.deadline)

    def _left(self, entry: _Entry[T]) -> None:
        """`entry` left the queue (any way): the totals without it."""
        self.total -= 1
        client = entry.client
        if client is not None:
            count = self.by_client[client] - 1
            if count:
                self.by_client[client] = count
            else:
                del self.by_client[client]

    def _live(self, app: str, key: int, seq: int) -> _Entry[T] | None:
        queue = self._queues.get(app)
        entry = queue.get(key) if queue else None
        return entry if entry is not None and entry.seq == seq else None

    def _compact(self) -> None:
        """Drop heap entries whose item already left (released, removed)."""
        for app, heap in list(self._deadlines.items()):
            live = [d for d in heap if self._live(app, d[2], d[1])]
            if live:
                heapq.heapify(live)
                self._deadlines[app] = live
            else:
                del self._deadlines[app]
        self._heaped = sum(len(heap) for heap in self._deadlines.values())

    def held(self, app: str) -> int:
        queue = self._queues.get(app)
        return len(queue) if queue else 0

    def apps(self) -> list[str]:
        """Apps with at least one held item."""
        return [app for app, queue in self._queues.items() if queue]

    def release(self, app: str, capacity: int) -> list[T]:
        """Up to `capacity` items of `app`, oldest first."""
        return [item for item, _ in self.release_since(app, capacity)]

    def release_since(self, app: str, capacity: int) -> list[tuple[T, float]]:
        """Up to `capacity` (item, time it was held) of `app`, oldest first."""
        queue = self._queues.get(app)
        out: list[tuple[T, float]] = []
        while queue and len(out) < capacity:
            _, entry = queue.popitem(last=False)
            self._left(entry)
            out.append((entry.item, entry.since))
        return out

    def expire(self, now: float, app: str | None = None) -> list[Expired[T]]:
        """Every item (of `app`, or of all) whose deadline is at or before `now`, earliest
        deadline first within an app."""
        out: list[Expired[T]] = []
        for name in [app] if app is not None else list(self._deadlines):
            out += self._take_due(name, now, now, inclusive=True)
        return out

    def late(self, app: str, ready_at: float, now: float) -> list[Expired[T]]:
        """Every item of `app` whose deadline comes before `ready_at` (a predicted start:
        it would expire first), earliest deadline first; `waited_s` as of `now`."""
        return self._take_due(app, ready_at, now, inclusive=False)

    def _take_due(self, app: str, by: float, now: float, inclusive: bool) -> list[Expired[T]]:
        """Take out the items of `app` whose deadline is before `by` (or at it)."""
        out: list[Expired[T]] = []
        heap = self._deadlines.get(app)
        while heap and (heap[0][0] <= by if inclusive else heap[0][0] < by):
            _, seq, key = heapq.heappop(heap)
            self._heaped -= 1
            entry = self._live(app, key, seq)
            if entry is not None:
                del self._queues[app][key]
                self._left(entry)
                out.append(Expired(app, entry.item, now - entry.since))
        if heap is not None and not heap:
            del self._deadlines[app]
        return out

    def remove(self, app: str, item: T) -> bool:
        """Forget `item` (its client went away); False if it was not held."""
        queue = self._queues.get(app)
        entry = queue.pop(id(item), None) if queue is not None else None
        if entry is None:
            return False
        self._left(entry)
        return True

    def fail_all(self, app: str) -> list[T]:
        """Every held item of `app`, oldest first (the wake failed)."""
        return self.release(app, self.held(app))

    def waited_s(self, app: str, item: T, now: float) -> float | None:
        queue = self._queues.get(app)
        entry = queue.get(id(item)) if queue else None
        return None if entry is None else now - entry.since

    def next_deadline(self, app: str | None = None) -> float | None:
        """The earliest deadline of an item still held (of `app`, or of all)."""
        found: float | None = None
        for name in [app] if app is not None else list(self._deadlines):
            heap = self._deadlines.get(name)
            while heap and self._live(name, heap[0][2], heap[0][1]) is None:
                heapq.heappop(heap)
                self._heaped -= 1
            if heap and (found is None or heap[0][0] < found):
                found = heap[0][0]
        return found
