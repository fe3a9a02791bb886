"""Structured JSON logs, one object per line on stderr, with credentials scrubbed.

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
        if record.exc_info:
            entry["exc"] = scrubbed(self.formatException(record.exc_info))
        return json.dumps(entry)


def setup_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
