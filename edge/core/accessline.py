"""The access log's line as a msgspec Struct (edge/core/accesslog.py writes it): the
keys are encoded once, with the class, not with every line. Not compiled: mypyc does
not compile a Struct's class, and the compiled caller only makes and encodes it."""

from __future__ import annotations

import msgspec


class Line(msgspec.Struct, omit_defaults=True):
    """One line's keys, in their order; the wake's phases only for a cold request."""

    ts: float
    request_id: str
    app: str
    machine: str
    worker: str
    method: str
    host: str
    path: str
    proto: str
    status: int
    code: str
    bytes_in: int
    bytes_out: int
    duration_ms: float
    client: str
    cold: bool
    hold_ms: float | None = None
    place_ms: float | None = None
    pull_ms: float | None = None
    boot_ms: float | None = None


ENCODER = msgspec.json.Encoder()
