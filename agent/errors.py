"""Agent errors: one base with an HTTP status, mapped to a JSON response in one place."""

from __future__ import annotations

from ground.errors import ServiceError


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


class DiskFull(AgentError):
    """The op log cannot take a record (no space, or an I/O error): nothing was changed,
    and nothing will be until it can. Offers and starts get this 503 meanwhile."""

    status = 503
    code = "disk_full"


class LogBroken(AgentError):
    """The op log can no longer be made durable (an fsync failed, or a partial write could
    not be cut back): the agent takes no change until it is restarted on a sound disk."""

    status = 503
    code = "log_broken"


class LogDamaged(ValueError):
    """The op log is damaged before its end: the agent does not start on a log that lies."""
