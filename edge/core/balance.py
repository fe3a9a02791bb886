"""Which started machine takes the next request, or none (hold it).

Prefer machines under `soft_limit`, the least loaded; with more than
`P2C_ABOVE` such machines, the less loaded of two random ones (power of two
choices), so cost stays flat. When every machine is at or over soft, the
least loaded one under `hard_limit`. Never above `hard_limit`: when no machine
has room the answer is None and the request is held, even if machines exist.
It does not know addresses or sockets; randomness is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

P2C_ABOVE = 4


class Loaded(Protocol):
    @property
    def in_flight(self) -> int: ...


class Tunnelled(Loaded, Protocol):
    @property
    def tunnels(self) -> int: ...


class RandomSource(Protocol):
    def random(self) -> float:
        """A float in [0, 1)."""
        ...


M = TypeVar("M", bound=Loaded)
T = TypeVar("T", bound=Tunnelled)


def pick(machines: Sequence[M], soft_limit: int, hard_limit: int, rand: RandomSource) -> M | None:
    """The machine for one request; `machines` are the routable ones, `soft_limit` <=
    `hard_limit`. The least loaded machine is under soft whenever any machine is, so one
    scan for it answers both tiers (a pick runs on every request: no lists are built)."""
    n = len(machines)
    if n > P2C_ABOVE:
        a = machines[int(rand.random() * n)]
        b = machines[int(rand.random() * n)]
        lighter = a if a.in_flight <= b.in_flight else b
        if lighter.in_flight < soft_limit:
            return lighter
    elif n == 1:
        only = machines[0]
        return only if only.in_flight < hard_limit else None
    best: M | None = None
    for machine in machines:
        if best is None or machine.in_flight < best.in_flight:
            best = machine
    return best if best is not None and best.in_flight < hard_limit else None


def pick_avoiding(machines: Sequence[M], soft_limit: int, hard_limit: int,
                  rand: RandomSource, avoid: Sequence[M]) -> M | None:
    """`pick` for a request sent again after machines lost it: among the machines not in
    `avoid` (those that lost it: a machine that just closed on it is likely dying, or
    the request is what kills machines), or among all when every one of them did."""
    others = [machine for machine in machines if machine not in avoid]
    return pick(others or machines, soft_limit, hard_limit, rand)


def tunnel_limit(hard_limit: int, share: float) -> int:
    """WebSocket tunnels one machine may hold: `share` of its `hard_limit` (at least one);
    the rest of its places are for requests, whatever tunnels sit idle."""
    return max(1, int(hard_limit * share))


def pick_tunnel(machines: Sequence[T], limit: int, hard_limit: int) -> T | None:
    """The machine for a WebSocket upgrade: the one with the fewest tunnels under `limit`
    that has room under `hard_limit`, or None (every machine at its tunnel limit, or
    full)."""
    best: T | None = None
    for machine in machines:
        if machine.tunnels < limit and machine.in_flight < hard_limit and (
                best is None or machine.tunnels < best.tunnels):
            best = machine
    return best


def free_slots(machines: Sequence[Loaded], hard_limit: int) -> int:
    """Requests the machines can still take before every one is at `hard_limit`."""
    return sum(max(0, hard_limit - m.in_flight) for m in machines)


def over_limit(machines: Sequence[Loaded], hard_limit: int) -> int:
    """Requests past `hard_limit` at the machines (edges' shares of load crossing)."""
    return sum(max(0, m.in_flight - hard_limit) for m in machines)
