"""Schemathesis hooks (loaded through SCHEMATHESIS_HOOKS) for the fuzz of placement's API.

`no_internal_error`: the API never answers 500 (or any 5xx but its own 502/503/504),
and a 503 — no capacity right now — always says when to retry. Stricter than
"no 5xx" where it matters, and true to the API's contract where 503 is an answer.
"""

from __future__ import annotations

from typing import Any

import schemathesis

ANSWERS_5XX = {502, 503, 504}


@schemathesis.check
def no_internal_error(ctx: Any, response: Any, case: Any) -> bool | None:
    status = response.status_code
    if status >= 500 and status not in ANSWERS_5XX:
        raise AssertionError(f"internal error {status}: {response.text[:300]}")
    if status in ANSWERS_5XX:
        body = response.json()
        if not isinstance(body, dict) or not body.get("error") or body["error"] == "internal":
            raise AssertionError(f"{status} without an error code: {response.text[:300]}")
        if status == 503 and "retry-after" not in {k.lower() for k in response.headers}:
            raise AssertionError(f"503 {body['error']} without Retry-After")
    return None
