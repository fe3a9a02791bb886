"""Structured JSON logs, one object per line on stderr, with credentials scrubbed.

Lifecycle events (a wake, an auto-stop, a placement decision) are logged with
`event(logger, "wake", app=..., place_ms=...)`: one line whose message reads
`wake app=hello place_ms=12.5 …` and whose JSON object also carries each field
as its own key (`"event": "wake", "app": "hello", "place_ms": 12.5`), for log
pipelines to filter on without parsing the message.

Our own code logs token ids, never tokens; but a library may quote what it was
sent (aiohttp's parser logs a malformed header line whole), so every line and
traceback is scrubbed of bearer tokens, `Authorization` values and signatures
before it is written.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any

# A header as a line (`Authorization: …`) or in a repr (`'Authorization': '…'`); a bearer
# value long enough to be a credential (not the word in "a bearer token is required").
_SECRETS = (
    (re.compile(r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)[^\r\n'\"]*"), r"\1[redacted]"),
    (re.compile(r"(?i)(x-thaw-signature['\"]?\s*[:=]\s*['\"]?)[^\r\n'\"]*"), r"\1[redacted]"),
    (re.compile(r"(?i)(bearer\s+)[^\s'\"]{16,}"), r"\1[redacted]"),
    (re.compile(r"(thaw_[0-9a-f]{16}_)[A-Za-z0-9_-]+"), r"\1[redacted]"),
)


def scrubbed(text: str) -> str:
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(time.time(), 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": scrubbed(record.getMessage()),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                entry.setdefault(key, scrubbed(value) if isinstance(value, str) else value)
        if record.exc_info:
            entry["exc"] = scrubbed(self.formatException(record.exc_info))
        return json.dumps(entry)


def event(logger: logging.Logger, name: str, level: int = logging.INFO,
          **fields: Any) -> None:
    """Log lifecycle event `name` with its fields: `name k=v k=v` as the message, and the
    fields as keys of the JSON line (values as given: round floats before)."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{k}={_text(v)}" for k, v in fields.items())
    logger.log(level, "%s %s", name, text, extra={"fields": {"event": name, **fields}})


def _text(value: Any) -> str:
    """A value as key=value shows it: quoted when it has spaces (or is empty)."""
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() or c in "\"=" for c in text) \
        else text


def setup_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
