"""Agent errors: one base with an HTTP status, mapped to a JSON response in one place."""

from __future__ import annotations

from thaw.errors import ServiceError


class AgentError(ServiceError):
    pass


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
