"""Placement errors: one base with an HTTP status, mapped to a JSON response in one place."""

from __future__ import annotations

from ground.errors import ServiceError
from placement.ports.workers import Refused, Unreachable


class PlacementError(ServiceError):
    pass


class NotFound(PlacementError):
    status = 404
    code = "not_found"


class Conflict(PlacementError):
    status = 409
    code = "conflict"


class BadRequest(PlacementError):
    status = 400
    code = "bad_request"


class Unavailable(PlacementError):
    """No capacity, a failed start, a worker that cannot be reached."""

    status = 503
    code = "unavailable"


class AgentReplied(PlacementError):
    """A worker's refusal (placement/ports/workers.py), passed through as it said it: its
    status, code and message."""

    @classmethod
    def of(cls, refused: Refused) -> AgentReplied:
        return cls(refused.message, code=refused.code, status=refused.status)


def worker_said(answer: Refused | Unreachable) -> PlacementError:
    """A worker's no (placement/ports/workers.py) as placement's error: its refusal passed
    through (its status, code and message); no answer at all, 503
    `worker_unreachable`."""
    if isinstance(answer, Refused):
        return AgentReplied.of(answer)
    return Unavailable(answer.message, code="worker_unreachable")
