"""The access log's two decisions: which answers are logged, and what a line says.

A line is one JSON object ending in a newline, its keys in the order of `line`'s
parameters. Every answer to a request that was held (cold) and every 5xx is
logged; other answers are logged with probability `sample_rate` (1: all, 0:
none of them). A request whose client went away before its answer is logged
with status 499, as nginx does. Times are milliseconds rounded to the
microsecond; `path` is the request target without its query string (queries
carry tokens too often to be written to disk by default). A line is a msgspec Struct
(edge/core/accessline.py), whose keys are encoded once, with its class; the lines kept
are encoded together (`encode`), one buffer a batch rather than one bytes object a line.

Pure: the caller gives every value, the wall time and the random draw included.
(Compiled with the edge's hot modules: a logged answer pays for its line.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edge.core.accessline import ENCODER, Line

CLIENT_GONE = 499  # the client closed its side before the answer (nginx's code)


def logged(status: int, cold: bool, sample_rate: float, draw: Callable[[], float]) -> bool:
    """Whether an answer is logged: cold and 5xx always, others with probability
    `sample_rate` in [0, 1] (`draw` is called only when it decides)."""
    if cold or status >= 500 or sample_rate >= 1.0:
        return True
    return sample_rate > 0.0 and draw() < sample_rate


def path_of(target: bytes) -> str:
    """The request target without its query string, as text."""
    text = target.decode("latin-1")  # (str's find is the compiled code's own, bytes' a call)
    end = text.find("?")
    return text[:end] if end >= 0 else text


def thousandths(value: float) -> float:
    """`value` to three decimals (a time's microseconds: times are never negative), at a
    fraction of `round`'s cost."""
    return int(value * 1000.0 + 0.5) / 1000.0


def line(*, ts: float, request_id: str, app: str, machine: str, worker: str, method: str,
         host: str, path: str, proto: str, status: int, code: str, bytes_in: int,
         bytes_out: int, duration_s: float, client: str,
         cold: tuple[float, float, float, float] | None) -> Line:
    """One line (`encode` writes it). `ts`: wall time the exchange ended (s since the
    epoch); `app`, `machine`, `worker`: "" where there is none (routed to no app;
    answered by the edge itself); `proto`: http/1.1, http/1.0 or h2; `code`: the edge's own answer
    (hold_timeout, no_capacity, …) or ""; `bytes_in`/`bytes_out`: request and response
    body bytes (a tunnel's bytes each way); `duration_s`: from the request's head to
    the end of its answer; `cold`: for a request that was held, its hold (s) and the
    place, pull and boot milliseconds of the wake whose machine took it, else None."""
    entry = Line(thousandths(ts), request_id, app, machine, worker, method, host, path,
                 proto, status, code, bytes_in, bytes_out, thousandths(duration_s * 1000.0),
                 client, cold is not None)
    if cold is not None:
        hold_s, place_ms, pull_ms, boot_ms = cold
        entry.hold_ms = thousandths(hold_s * 1000.0)
        entry.place_ms = thousandths(place_ms)
        entry.pull_ms = thousandths(pull_ms)
        entry.boot_ms = thousandths(boot_ms)
    return entry


def encode(lines: Sequence[Line]) -> bytes:
    """`lines` as JSON, each on a line of its own ending in a newline."""
    return ENCODER.encode_lines(lines)
