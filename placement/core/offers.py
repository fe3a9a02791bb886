"""The offer loop: to whom the next offer goes, given the answers so far.

Decides, from a market `Decision` and the answers already received, whether to
offer to the next-best worker, to stop because one accepted, or to give up with
"no capacity" (immediate or cancel; at once when a worker said the offer's reconcile
lease has passed to another placement). Invariants: at most `max_offers` offers per
placement; a worker is offered at most once per placement; the idempotency key
of an offer depends only on the placement and the worker, so a retry of the same
offer carries the same key and cannot create a second machine. It must not know
about HTTP or the agents' wire format: the shell turns replies into `Answer`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from placement.core.market import Decision

REASONS_SHOWN = 3  # workers whose filter reason a "no capacity" names (the rest counted)


class Reply(StrEnum):
    ACCEPTED = "accepted"
    NO_CAPACITY = "no_capacity"  # the agent declined: full
    DRAINING = "draining"  # the agent declined: draining
    UNREACHABLE = "unreachable"  # transport failure or an unexpected status
    STALE_FENCE = "stale_fence"  # the agent saw a newer reconcile lease of the app


@dataclass(frozen=True)
class Answer:
    worker: str
    reply: Reply
    machine_id: str = ""
    message: str = ""


@dataclass(frozen=True)
class OfferTo:
    worker: str
    url: str
    key: str


@dataclass(frozen=True)
class Placed:
    worker: str
    machine_id: str


@dataclass(frozen=True)
class NoCapacity:
    reason: str


def offer_key(placement_id: str, worker: str) -> str:
    return f"{placement_id}.{worker}"


def next_offer(
    decision: Decision,
    answers: Sequence[Answer],
    placement_id: str,
    max_offers: int = 3,
) -> OfferTo | Placed | NoCapacity:
    """The next step of one placement."""
    for answer in answers:
        if answer.reply is Reply.ACCEPTED:
            return Placed(answer.worker, answer.machine_id)
    if any(a.reply is Reply.STALE_FENCE for a in answers):  # the lease went elsewhere
        return NoCapacity(no_capacity_reason(decision, answers))
    if len(answers) >= max_offers:
        return NoCapacity(no_capacity_reason(decision, answers))
    tried = {answer.worker for answer in answers}
    for candidate in decision.ranked:
        if candidate.worker not in tried:
            key = offer_key(placement_id, candidate.worker)
            return OfferTo(candidate.worker, candidate.url, key)
    return NoCapacity(no_capacity_reason(decision, answers))


def no_capacity_reason(decision: Decision, answers: Sequence[Answer]) -> str:
    parts = [f"{a.worker}: {a.reply.value}" for a in answers]
    if not answers:
        shown = ", ".join(f"{f.worker}: {f.reason}" for f in decision.filtered[:REASONS_SHOWN])
        more = len(decision.filtered) - REASONS_SHOWN
        shown += f", and {more} more" if more > 0 else ""
        parts.append(
            f"no worker in region {decision.region!r} fits "
            f"({len(decision.filtered)} of {decision.considered} filtered"
            + (f": {shown})" if shown else ")")
        )
    return "; ".join(parts)
