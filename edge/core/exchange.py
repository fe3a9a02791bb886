"""An exchange's life as one table, and the rules the shell asks it: retry, framing.

An exchange is one request and its answer. Its phase moves only by `advance`,
along `TRANSITIONS`; anything else raises `IllegalTransition`. The shell
(edge/service.py and the adapters) carries the bytes; this module decides:
whether a request that lost its machine may be sent again and where it goes
then (`after_connect_failure`, `after_loss`), and how a response is framed
to an HTTP/1.x client (`response_framing`). No IO, no clock.

    NEW ──PICK──▶ CONNECTING ──SEND──▶ FORWARDING ──HEAD──▶ RESPONDING ──END──▶ DONE
     │  ╲SEND (a pooled connection)──▶┘      │  ╲UPGRADE──▶ TUNNEL ──END──▶ DONE
     HOLD                      RETRY ◀───────┘
     ▼                           ▼
    HELD ──PICK/SEND──▶ …     RETRYING ──PICK/SEND/HOLD──▶ …
    any live phase ──FAIL──▶ FAILED, ──CLIENT_GONE──▶ GONE
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from edge.core.framing import BODY_LENGTH, BODY_NONE


class Phase(IntEnum):
    NEW = 0  # parsed and queued on its connection, not routed yet
    HELD = 1  # waiting for a machine (the app is cold or at its limits)
    RETRYING = 2  # lost its machine before any answer; goes out again or is held
    CONNECTING = 3  # a machine is chosen and a connection to it is being made
    FORWARDING = 4  # the request goes to the machine; no response head yet
    RESPONDING = 5  # the machine's response is going to the client
    TUNNEL = 6  # after a 101: bytes both ways until either side closes
    DONE = 7  # the machine's answer went out whole (or the tunnel closed)
    FAILED = 8  # the edge answered itself, or cut a response it could not finish
    GONE = 9  # the client went away first


class Event(IntEnum):
    HOLD = 0  # no machine can take it now
    PICK = 1  # a machine is chosen; its connection must be made
    SEND = 2  # a connection is ready: the head goes out
    RETRY = 3  # the connection failed or was lost before any response byte
    HEAD = 4  # the response head arrived
    UPGRADE = 5  # the machine switched protocols (101)
    END = 6  # the response (or the tunnel) ended
    FAIL = 7  # the edge ends it with its own answer, or cuts it
    CLIENT_GONE = 8  # the client's connection closed


TERMINAL = frozenset({Phase.DONE, Phase.FAILED, Phase.GONE})
_LIVE_ENDINGS = {Event.FAIL: Phase.FAILED, Event.CLIENT_GONE: Phase.GONE}
_ROUTABLE = {Event.HOLD: Phase.HELD, Event.PICK: Phase.CONNECTING, Event.SEND: Phase.FORWARDING}

TRANSITIONS: dict[Phase, dict[Event, Phase]] = {
    Phase.NEW: {**_ROUTABLE, **_LIVE_ENDINGS},
    Phase.HELD: {Event.PICK: Phase.CONNECTING, Event.SEND: Phase.FORWARDING, **_LIVE_ENDINGS},
    Phase.RETRYING: {**_ROUTABLE, **_LIVE_ENDINGS},
    Phase.CONNECTING: {Event.SEND: Phase.FORWARDING, Event.RETRY: Phase.RETRYING,
                       **_LIVE_ENDINGS},
    Phase.FORWARDING: {Event.HEAD: Phase.RESPONDING, Event.UPGRADE: Phase.TUNNEL,
                       Event.RETRY: Phase.RETRYING, **_LIVE_ENDINGS},
    Phase.RESPONDING: {Event.END: Phase.DONE, **_LIVE_ENDINGS},
    Phase.TUNNEL: {Event.END: Phase.DONE, **_LIVE_ENDINGS},
    # An ended exchange absorbs late endings (a watchdog, a wake failure or a closing
    # client racing the answer) and nothing else.
    Phase.DONE: {Event.FAIL: Phase.DONE, Event.CLIENT_GONE: Phase.DONE},
    Phase.FAILED: {Event.FAIL: Phase.FAILED, Event.CLIENT_GONE: Phase.FAILED},
    Phase.GONE: {Event.FAIL: Phase.GONE, Event.CLIENT_GONE: Phase.GONE},
}
# The same table as a flat tuple indexed by phase * len(Event) + event: the warm path's
# lookup (None: illegal).
_FLAT: tuple[Phase | None, ...] = tuple(
    TRANSITIONS[phase].get(event) for phase in Phase for event in Event
)
_EVENTS = len(Event)


# The warm path reads these rather than `Phase.X` / the table: an Enum member lookup
# costs ~50 ns on CPython 3.11, a module constant a few (and mypyc keeps Final ones static).
NEW: Final = Phase.NEW
FORWARDING: Final = Phase.FORWARDING
RESPONDING: Final = Phase.RESPONDING
TUNNEL: Final = Phase.TUNNEL


def _after(event: Event) -> tuple[Phase | None, ...]:
    """The phase `event` leads to from each phase (by value), None where illegal."""
    return tuple(TRANSITIONS[phase].get(event) for phase in Phase)


AFTER_SEND: Final = _after(Event.SEND)
AFTER_HEAD: Final = _after(Event.HEAD)
AFTER_END: Final = _after(Event.END)


class IllegalTransition(Exception):
    def __init__(self, phase: Phase, event: Event) -> None:
        super().__init__(f"exchange in phase {phase.name} cannot take event {event.name}")
        self.phase = phase
        self.event = event


def advance(phase: Phase, event: Event) -> Phase:
    nxt = _FLAT[phase * _EVENTS + event]
    if nxt is None:
        raise IllegalTransition(phase, event)
    return nxt


# -- retries ----------------------------------------------------------------------------

IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})
AGAIN, HOLD, GIVE_UP = 0, 1, 2  # where a request that lost its machine goes


def resendable(method: bytes, body: int, response_started: bool) -> bool:
    """May go out again after it may have been delivered: an idempotent method, no
    body (it was streamed, not kept), and no response byte seen."""
    return method in IDEMPOTENT and body == BODY_NONE and not response_started


def after_connect_failure(attempts: int, max_attempts: int) -> int:
    """Nothing was delivered, whatever the method: another machine (AGAIN) until
    `attempts` (this one counted) reaches `max_attempts`, then HOLD: the app is woken
    and the hold's deadline bounds the wait. Never a 502 while a machine may come."""
    return AGAIN if attempts < max_attempts else HOLD


def after_loss(resendable_now: bool, got_bytes: bool, reused: bool, attempts: int,
               max_attempts: int, resends: int, max_resends: int) -> tuple[int, bool]:
    """The machine's connection closed mid-exchange. Returns (where, counts): GIVE_UP
    (a 502, or a cut if the response started) unless the request may go out again;
    a *reused* pooled connection lost before any byte says nothing of the machine (an
    idle keep-alive it closed), so it does not count as an attempt. Whatever the
    connection, a request already sent again `max_resends` times after such losses
    gives up: a request that crashes every machine it reaches (a request of death) takes
    down at most `max_resends + 1` of them, not one after another until its hold ends."""
    if got_bytes or not resendable_now or resends >= max_resends:
        return GIVE_UP, False
    counts = not reused
    total = attempts + 1 if counts else attempts
    return (AGAIN if total < max_attempts else HOLD), counts


# -- response framing to an HTTP/1.x client ---------------------------------------------


def response_framing(body: int, content_length: int, http10: bool, request_done: bool,
                     close_after: bool) -> tuple[bytes, bool, bool]:
    """(framing and Connection header lines, rechunk, close_after) for a response with
    `body` framing (framing.BODY_*). A body of unknown length goes out chunked to an
    HTTP/1.1 client and until close to an HTTP/1.0 one; a request whose body was not
    read whole closes the connection (its rest cannot be skipped safely)."""
    rechunk = False
    if body == BODY_LENGTH:
        framing = b"Content-Length: %d\r\n" % content_length
    elif body == BODY_NONE:
        framing = b""
    elif http10:
        framing = b""
        close_after = True
    else:
        framing = b"Transfer-Encoding: chunked\r\n"
        rechunk = True
    if not request_done:
        close_after = True
    if close_after:
        return framing + b"Connection: close\r\n", rechunk, True
    if http10:
        return framing + b"Connection: keep-alive\r\n", rechunk, False
    return framing, rechunk, False
