"""Lifecycle events are one line each: `name k=v …` as the message, each field its own
key in the JSON line (pure: a logger with a capturing handler and the formatter)."""

from __future__ import annotations

import json
import logging

from ground.logs import JsonFormatter, event


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(JsonFormatter().format(record))


def test_an_event_reads_as_key_value_and_carries_its_fields_as_json_keys() -> None:
    logger = logging.getLogger("thaw.test.lifecycle")
    logger.setLevel(logging.INFO)
    capture = Capture()
    logger.addHandler(capture)
    try:
        event(logger, "wake", app="hello", count=2, result="ok", place_ms=12.5,
              shortfall="", message='placement said "no"')
        event(logger, "autostop", logging.DEBUG, app="hello")  # below the level: nothing
    finally:
        logger.removeHandler(capture)
    [line] = capture.lines
    entry = json.loads(line)
    assert entry["msg"] == ('wake app=hello count=2 result=ok place_ms=12.5 shortfall="" '
                            'message="placement said \\"no\\""')
    assert (entry["event"], entry["app"], entry["count"], entry["place_ms"]) == (
        "wake", "hello", 2, 12.5)
    assert entry["level"] == "info" and entry["logger"] == "thaw.test.lifecycle"


def test_an_event_field_never_overwrites_the_lines_own_keys_or_carries_a_token() -> None:
    record = logging.LogRecord("thaw.edge", logging.INFO, __file__, 1, "x", None, None)
    record.fields = {"msg": "other", "level": "debug",  # type: ignore[attr-defined]
                     "detail": "Authorization: Bearer " + "s" * 40}
    entry = json.loads(JsonFormatter().format(record))
    assert entry["msg"] == "x" and entry["level"] == "info"
    assert "s" * 40 not in entry["detail"]
