"""The base of every service's errors: an HTTP status, a code and a message.

Each service (agent, placement) derives its own errors from it and maps them
to `{"error": code, "message": text}` in one middleware.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.extra}
