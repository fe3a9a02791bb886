"""Agent errors: one base with an HTTP status, mapped to a JSON response in one place."""

from __future__ import annotations


class AgentError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status


class NotFound(AgentError):
    status = 404
    code = "not_found"


class BadRequest(AgentError):
    status = 400
    code = "bad_request"


class Conflict(AgentError):
    status = 409
    code = "illegal_transition"


class Declined(AgentError):
    """An offer the agent cannot honour (an expected outcome, sent as 409)."""

    status = 409


class WaitTimeout(AgentError):
    status = 408
    code = "timeout"
