"""Which placement an edge asks first, and which next when one does not answer.

An edge knows several placements (given, and discovered from the registry). Any of them
can wake any app (they share the store and the registry), so a placement that is dead,
stopped or refusing must cost a wake one quick failed attempt, not the whole wake. Pure:
the edge's adapter (edge/adapters/placement.py) keeps the state and the clock.

The rule: the placement that answered last comes first (it is most likely alive, and
asking one placement keeps its wake claims and caches warm); then the others, in the
order given; placements that failed recently go last (they may be back, and asking one is
better than failing the wake), the least recently failed first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ground.auth.tickets import RouteKeys, advert_sealed
from ground.registry.types import PlacementAdvert

# a placement that did not answer is put last for this long
DOWN_FOR_S = 5.0


def try_order(urls: Sequence[str], last_ok: str, failed_at: Mapping[str, float],
              now: float) -> list[str]:
    """Every URL of `urls` once, in the order to try them (see the module's doc)."""
    unique = list(dict.fromkeys(urls))
    down = {u for u in unique if now - failed_at.get(u, -1e18) < DOWN_FOR_S}
    up = [u for u in unique if u not in down]
    if last_ok in up:
        up.remove(last_ok)
        up.insert(0, last_ok)
    return up + sorted(down, key=lambda u: (failed_at[u], unique.index(u)))


def answered(failed_at: dict[str, float], url: str) -> str:
    """`url` answered: it is no longer down, and it is the new `last_ok`."""
    failed_at.pop(url, None)
    return url


def trusted_urls(adverts: Iterable[PlacementAdvert], keys: RouteKeys | None) -> list[str]:
    """The URLs of the adverts sealed with the route key (by id), http(s) only. None
    without a route key: anyone who may write Redis could otherwise send wakes, and the
    requests held for them, anywhere (see ground/auth/tickets.py advert_seal)."""
    if keys is None:
        return []
    return [a.url.rstrip("/") for a in sorted(adverts, key=lambda a: a.id)
            if a.url.startswith(("http://", "https://"))
            and advert_sealed(keys, a.id, a.url, a.seal)]


def parse_urls(text: str | Sequence[str]) -> tuple[str, ...]:
    """`--placement` values: each one URL or several, comma-separated; duplicates and
    blanks dropped, trailing slashes too; the order kept."""
    items = [text] if isinstance(text, str) else list(text)
    urls = [u.strip().rstrip("/") for item in items for u in item.split(",")]
    return tuple(dict.fromkeys(u for u in urls if u))
