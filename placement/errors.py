"""Placement errors: one base with an HTTP status, mapped to a JSON response in one place."""

from __future__ import annotations

from typing import Any

from placement.ports.workers import Refused, Unreachable
from thaw.errors import ServiceError


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
    """An agent's error answer, passed through with its status and JSON body."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message", "") if isinstance(body, dict) else str(body)
        code = body.get("error", "agent_error") if isinstance(body, dict) else "agent_error"
        super().__init__(message, code=code, status=status)
        self.reply = body

    def body(self) -> dict[str, Any]:
        if isinstance(self.reply, dict):
            return self.reply
        return super().body()

    @classmethod
    def of(cls, refused: Refused) -> AgentReplied:
        """A worker's refusal (placement/ports/workers.py), passed through as it said it."""
        return cls(refused.status, {"error": refused.code, "message": refused.message})


def worker_said(answer: Refused | Unreachable) -> PlacementError:
    """A worker's no (placement/ports/workers.py) as placement's error: its refusal passed
    through (its status, code and message); no answer at all, 503
    `worker_unreachable`."""
    if isinstance(answer, Refused):
        return AgentReplied.of(answer)
    return Unavailable(answer.message, code="worker_unreachable")
