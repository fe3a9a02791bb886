"""Which apps the reconciler looks at when nothing asked: a lost worker's, and a slow sweep.

Passes are asked for by change (placement/reconciling/passes.py): the registry's feed, an action's
end, the reconciler's own retries. Two things change without a word in the feed, and
this decides what they cost:

- a worker whose heartbeats stop (a dead host writes nothing): the apps that had
  machines on it at their last pass are looked at again, not every app;
- anything missed (a bug, a lost write): every app is looked at once per sweep, spread
  evenly and never faster than a bounded rate, so idle costs a fixed few passes a
  second at any number of apps, not apps x time.

It must not know about the registry, the store, asyncio or the clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

SWEEP_S = 300.0  # every app looked at at least this often, while the rate allows
SWEEP_PER_S = 2.0  # never more sweep passes a second than this (10,000 apps: 83 min)


def sweep_gap_s(apps: int, sweep_s: float = SWEEP_S, per_s: float = SWEEP_PER_S) -> float:
    """Seconds between two apps' sweep passes: `sweep_s` spread over `apps`, but at
    least 1 / `per_s` (apps ≥ 0, both limits > 0)."""
    return max(sweep_s / max(apps, 1), 1.0 / per_s)


def on_gone_workers(observed: Mapping[str, Mapping[tuple[str, str], int]],
                    before: Iterable[str], live: Iterable[str]) -> tuple[set[str], list[str]]:
    """The workers live at the last look that no longer are, and the apps whose machines
    were on them at their last pass (`observed`: app -> (worker, state) -> machines)."""
    gone = set(before) - set(live)
    if not gone:
        return gone, []
    return gone, sorted(app for app, counts in observed.items()
                        if any(worker in gone for worker, _ in counts))
