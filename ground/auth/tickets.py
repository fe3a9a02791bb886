"""Route tickets: a worker may publish routes to the machines placed on it, and no others.

Machine records live in one Redis hash per app that every agent may write (Redis
ACLs check key names, not hash fields), so the records carry their own proof.
Placement and edges share a route key that agents never hold:

- When placement offers a machine to a worker, it gives the worker that machine's
  *ticket*: HMAC-SHA256(route key, "thaw-route-ticket-v1" | app uid | machine id |
  worker id), 16 bytes, base64url. The ticket is a secret of that worker (kept in
  its op log, never published).
- Each record the worker publishes carries a *seal*: HMAC-SHA256(ticket,
  "thaw-route-seal-v1" | state | address | updated_at), 16 bytes, base64url.
- An edge (or placement) derives the ticket again from the record's (app uid,
  machine id, worker) and checks the seal.

A compromised worker therefore learns the tickets of the machines placed on it
only: it can seal any address for those, but not a record of another worker's
machine (copying one onto another address breaks its seal), nor one of a machine
of its own choosing (it cannot make the ticket). The seal is over the routed
content, not the ticket itself, because a published ticket could be copied onto
another address.

Rotation: a ring of keys, the first makes tickets, every one verifies. Pure: keys
and records are arguments; the cache is memory only.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from ground.auth.signing import ring_keys
from ground.registry.types import MachineRecord

TICKET_TAG = b"thaw-route-ticket-v1"
SEAL_TAG = b"thaw-route-seal-v1"
ADVERT_TAG = b"thaw-placement-advert-v1"
MAC_BYTES = 16
MAX_KEYS = 2
MAX_TICKET_CHARS = 64  # what an offer may carry (a ticket is 22)
NO_SEAL = "no_seal"
BAD_SEAL = "bad_seal"


@dataclass(frozen=True)
class RouteKeys:
    """Route keys: the first makes tickets, every one verifies (at most two: rotation)."""

    keys: tuple[bytes, ...]

    @classmethod
    def parse(cls, text: str) -> RouteKeys:
        """Keys separated by newlines or commas; each at least MIN_KEY_CHARS characters."""
        return cls(ring_keys(text, "route key", MAX_KEYS))


def _fields(*values: str) -> bytes:
    """Each value length-prefixed: no two different tuples encode alike."""
    return b"".join(len(v.encode()).to_bytes(4, "big") + v.encode() for v in values)


def _mac(key: bytes, tag: bytes, message: bytes) -> str:
    digest = hmac.new(key, tag + message, hashlib.sha256).digest()[:MAC_BYTES]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def ticket_with(key: bytes, app_uid: str, machine_id: str, worker: str) -> str:
    return _mac(key, TICKET_TAG, _fields(app_uid, machine_id, worker))


def ticket(keys: RouteKeys, app_uid: str, machine_id: str, worker: str) -> str:
    """The ticket of machine `machine_id` of app incarnation `app_uid` placed on `worker`."""
    return ticket_with(keys.keys[0], app_uid, machine_id, worker)


def seal(ticket_text: str, state: str, address: str, updated_at: float) -> str:
    """What a record with this content carries, sealed with its machine's ticket."""
    return _mac(ticket_text.encode(), SEAL_TAG, _fields(state, address, repr(float(updated_at))))


def seal_record(ticket_text: str, record: MachineRecord) -> str:
    return seal(ticket_text, record.state, record.address, record.updated_at)


def refusal(keys: RouteKeys, record: MachineRecord) -> str | None:
    """None when `record`'s seal was made with the ticket of its (app uid, id, worker) under
    one of `keys`; else why not (NO_SEAL | BAD_SEAL)."""
    if not record.seal:
        return NO_SEAL
    for key in keys.keys:
        expected = seal_record(ticket_with(key, record.app_uid, record.id, record.worker), record)
        if hmac.compare_digest(expected, record.seal):
            return None
    return BAD_SEAL


def advert_seal(keys: RouteKeys, placement_id: str, url: str) -> str:
    """A placement's advert of its API URL (ground/registry/types.py PlacementAdvert), sealed
    with the route key: edges send wakes, and so the requests they hold, to the placement
    that answers them and then to the addresses it names, so only a holder of the route
    key (placements, edges; never agents) may add a placement to where wakes go."""
    return _mac(keys.keys[0], ADVERT_TAG, _fields(placement_id, url))


def advert_sealed(keys: RouteKeys, placement_id: str, url: str, seal_text: str) -> bool:
    return bool(seal_text) and any(
        hmac.compare_digest(_mac(key, ADVERT_TAG, _fields(placement_id, url)), seal_text)
        for key in keys.keys)


Content = tuple[str, str, str, str, str, float, str]


@dataclass(frozen=True)
class Verdict:
    reason: str | None  # None: the record verifies
    new: bool  # first time this exact record was judged (since the cache last filled)


class RecordCheck:
    """`refusal` remembered per distinct record (by content), so a resync that reads the
    same records again costs a dict lookup each. Without keys every record passes."""

    def __init__(self, keys: RouteKeys | None, capacity: int = 100_000) -> None:
        self.keys = keys
        self.capacity = capacity
        self._judged: dict[Content, str | None] = {}

    def judge(self, record: MachineRecord) -> Verdict:
        if self.keys is None:
            return Verdict(None, False)
        content: Content = (record.app_uid, record.id, record.worker, record.state,
                            record.address, record.updated_at, record.seal)
        if content in self._judged:
            return Verdict(self._judged[content], False)
        reason = refusal(self.keys, record)
        if len(self._judged) >= self.capacity:
            self._judged.clear()  # records change slowly: the live ones come back at once
        self._judged[content] = reason
        return Verdict(reason, True)

    def admits(self, record: MachineRecord) -> bool:
        return self.judge(record).reason is None

    def ticket(self, app_uid: str, machine_id: str, worker: str) -> str:
        """The ticket to offer with a machine ("" without keys)."""
        return "" if self.keys is None else ticket(self.keys, app_uid, machine_id, worker)

    def resealed(self, record: MachineRecord) -> str:
        """The seal of `record` as placement rewrites it ("" without keys)."""
        if self.keys is None:
            return ""
        return seal_record(ticket(self.keys, record.app_uid, record.id, record.worker), record)
