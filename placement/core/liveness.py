"""Which workers are live, in doubt or failed by their heartbeats (pure: no IO, no clock).

A heartbeat that looks old proves nothing when the registry it is read from was itself
stalled or away: the agents' writes waited as placement's reads did, and Redis expires
their keys on its own clock when it comes back (a 10 s SIGSTOP made every worker look
lapsed, and healthy machines were fenced, then destroyed). So a worker is judged on
evidence that the registry was answering: placement times its own reads of it, and an
unbroken run of answers (no gap longer than `max_gap_s`, no failed read) is the
registry's "healthy since". A worker is *failed* only when its heartbeat has not changed
for more than `allowed_s` counted from the later of the last change placement saw and
healthy since; and when more than `correlated_fraction` of the known workers (at least
`correlated_min` of them) look lapsed at once, the fault is shared (the registry, the
network), not theirs, and nobody is failed (Kubernetes stops evicting above 55 %).

A lapsed worker not judged failed is *in doubt*: no new machine goes there, but its
machines are not fenced and count as they were last seen (when in doubt, keep what
runs). A worker missing from a read (its key expired) stays known as it was last seen,
and is forgotten only once it has been missing and unheard of for `forget_s`.

Times are placement's own clock, passed in: a heartbeat's `updated_at` is stamped by its
agent's clock, another host's, so it is compared only with itself (has it changed?), and
a heartbeat counts from when placement first saw it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

CORRELATED_FRACTION = 0.55
CORRELATED_MIN = 2
FORGET_S = 600.0  # a worker missing from the registry this long is no longer known


@dataclass(frozen=True)
class Beat:
    """A worker's heartbeat as read: its epoch and its agent's stamp."""

    worker: str
    epoch: int
    updated_at: float  # the agent's clock: compared only with the worker's own stamps


@dataclass(frozen=True)
class Judgement:
    live: frozenset[str]  # fresh: machines go there
    doubt: frozenset[str]  # lapsed, not failed: nothing new goes there, nothing is fenced
    failed: frozenset[str]  # lapsed while the registry was answering
    correlated: bool = False  # too many lapsed at once: nobody failed
    healthy_since: float | None = None  # the registry's unbroken run of answers (None: none)


@dataclass
class _Known:
    epoch: int
    updated_at: float
    seen_at: float  # placement's clock when this heartbeat was first read
    present: bool  # in the last read


class Liveness:
    def __init__(self, allowed_s: float, *, max_gap_s: float,
                 correlated_fraction: float = CORRELATED_FRACTION,
                 correlated_min: int = CORRELATED_MIN, forget_s: float = FORGET_S) -> None:
        """`allowed_s`: how long a heartbeat may stay unchanged while the registry answers
        (the heartbeat freshness, seconds); `max_gap_s`: a longer silence between two
        answers of the registry (or one read taking longer) breaks its run of answers."""
        self.allowed_s = allowed_s
        self.max_gap_s = max_gap_s
        self.correlated_fraction = correlated_fraction
        self.correlated_min = correlated_min
        self.forget_s = forget_s
        self.healthy_since: float | None = None
        self.last_answer: float | None = None
        self.known: dict[str, _Known] = {}

    def answered(self, beats: Iterable[Beat], started: float, at: float) -> None:
        """A read of every worker's heartbeat, sent at `started`, answered at `at`."""
        if (self.last_answer is None or at - self.last_answer > self.max_gap_s
                or at - started > self.max_gap_s):
            self.healthy_since = at
        self.last_answer = at
        for entry in self.known.values():
            entry.present = False
        for beat in beats:
            known = self.known.get(beat.worker)
            if known is None or (beat.epoch, beat.updated_at) != (known.epoch, known.updated_at):
                self.known[beat.worker] = _Known(beat.epoch, beat.updated_at, at, True)
            else:
                known.present = True

    def unanswered(self) -> None:
        """A read failed or timed out: the run of answers starts again at the next one."""
        self.healthy_since = None
        self.last_answer = None

    def judge(self, now: float) -> Judgement:
        """Every known worker's verdict at `now` (one missing from the registry and unheard
        of for `forget_s` is forgotten first: neither live nor in doubt, as if failed)."""
        for worker in [w for w, k in self.known.items()
                       if not k.present and now - k.seen_at > self.forget_s]:
            del self.known[worker]
        lapsed = {w for w, k in self.known.items() if now - k.seen_at > self.allowed_s}
        live = frozenset(self.known) - lapsed
        correlated = (len(self.known) >= self.correlated_min
                      and len(lapsed) > self.correlated_fraction * len(self.known))
        since = self.healthy_since
        failed: set[str] = set()
        if since is not None and not correlated:
            failed = {w for w in lapsed
                      if now - max(self.known[w].seen_at, since) > self.allowed_s}
        return Judgement(live=live, doubt=frozenset(lapsed - failed),
                         failed=frozenset(failed), correlated=correlated,
                         healthy_since=since)
