"""Signed internal calls: HMAC-SHA256 over what a request does, with a cluster key.

What is signed (one line each): a version tag, the method, the Host header, the
request target exactly as sent (path and query, percent-encoding kept), SHA-256 of
the body, the Unix time in seconds and a random nonce. The signature travels in one
header: `X-Thaw-Signature: kid=<key id>,ts=<time>,nonce=<hex>,sig=<hex>`.

A verifier accepts a signature by any key of its ring (the first key signs; a
second one is accepted during rotation), within ±`window_s` of its clock, once:
a bounded cache of signatures seen inside the window rejects replays, and refuses
everything while it is full of live entries rather than forgetting one early.
The cache lives in memory, so a verifier also refuses signatures made before
it started (`not_before`): a call captured before a restart cannot be replayed
after it (a call in flight across the restart is refused: its caller sees one
failure, e.g. the edge answers that wake's held requests 503 with Retry-After).
`claim` checks what the header alone can show (form, key, time, audience), so a
server reads a body only for calls that may be genuine; `verify` does the rest.
`audiences`, when given, are the Host values the verifier answers to, so a call
signed for one agent cannot be replayed to another.

Pure: time, nonces and keys are arguments; the replay cache's clock is the `now`
of the last call.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass

from cachetools import TTLCache

HEADER = "X-Thaw-Signature"
VERSION = b"thaw-hmac-v1"
WINDOW_S = 30.0
MIN_KEY_CHARS = 32
MAX_KEYS = 2
NO_CLUSTER_KEY = "no cluster key: pass --cluster-key-file PATH or set THAW_CLUSTER_KEY"
_PARAM = re.compile(
    r"^kid=([0-9a-f]{12}),ts=(\d{1,12}),nonce=([0-9a-f]{16,64}),sig=([0-9a-f]{64})$")


def ring_keys(text: str, what: str, max_keys: int) -> tuple[bytes, ...]:
    """The keys of a ring given as text (newlines or commas between them, the newest
    first), each at least MIN_KEY_CHARS characters, none twice; ValueError naming `what`
    otherwise. The one parser of the cluster, route and secrets key rings."""
    keys = [k.strip() for k in re.split(r"[\n,]", text) if k.strip()]
    if not keys:
        raise ValueError(f"no {what} given")
    if len(keys) > max_keys:
        raise ValueError(f"at most {max_keys} {what}s (the newest first)")
    if any(len(k) < MIN_KEY_CHARS for k in keys):
        raise ValueError(f"a {what} must have at least {MIN_KEY_CHARS} characters")
    if len(set(keys)) != len(keys):
        raise ValueError(f"a {what} is listed twice")
    return tuple(k.encode() for k in keys)


@dataclass(frozen=True)
class KeyRing:
    """Cluster keys: the first signs, every one verifies (at most two: rotation)."""

    keys: tuple[bytes, ...]

    @classmethod
    def parse(cls, text: str) -> KeyRing:
        """Keys separated by newlines or commas; each at least MIN_KEY_CHARS characters."""
        return cls(ring_keys(text, "cluster key", MAX_KEYS))

    def key_id(self, key: bytes) -> str:
        return hashlib.sha256(b"thaw-key-id:" + key).hexdigest()[:12]

    def by_id(self, kid: str) -> bytes | None:
        return next((k for k in self.keys if hmac.compare_digest(self.key_id(k), kid)), None)


def canonical(method: str, host: str, target: str, body: bytes, ts: int, nonce: str) -> bytes:
    return b"\n".join((
        VERSION, method.upper().encode(), host.lower().encode(),
        target.encode("utf-8", "surrogateescape"), hashlib.sha256(body).hexdigest().encode(),
        str(ts).encode(), nonce.encode(),
    ))


def sign(ring: KeyRing, method: str, host: str, target: str, body: bytes, now: float,
         nonce: str) -> str:
    """The header value signing this request with the ring's first key."""
    key = ring.keys[0]
    ts = int(now)
    mac = hmac.new(key, canonical(method, host, target, body, ts, nonce), hashlib.sha256)
    return f"kid={ring.key_id(key)},ts={ts},nonce={nonce},sig={mac.hexdigest()}"


@dataclass(frozen=True)
class Unsigned:
    """Why a call is refused (for the log; the caller only sees 401)."""

    reason: str


@dataclass(frozen=True)
class Claim:
    """A signature header that passed the checks the header alone allows."""

    key: bytes
    ts: int
    nonce: str
    sig: str


class Verifier:
    def __init__(self, ring: KeyRing, *, window_s: float = WINDOW_S,
                 replay_capacity: int = 100_000, audiences: Iterable[str] = (),
                 not_before: float = 0.0) -> None:
        """`not_before`: the Unix time this verifier's replay cache starts from."""
        self.ring = ring
        self.window_s = window_s
        self.not_before = int(not_before)
        self.audiences = frozenset(a.lower() for a in audiences)
        self._now = 0.0
        # Entries live as long as a signature can be valid: window on both sides.
        self._seen: TTLCache[str, bool] = TTLCache(
            maxsize=replay_capacity, ttl=2 * window_s + 1, timer=lambda: self._now
        )

    def serve_as(self, *audiences: str) -> None:
        """The Host values this verifier answers to (known once the server is bound)."""
        self.audiences = frozenset(a.lower() for a in audiences)

    def verify(self, header: str | None, method: str, host: str, target: str, body: bytes,
               now: float) -> Unsigned | None:
        """None when the call is signed, fresh, meant for us and not seen before."""
        claim = self.claim(header, host, now)
        if isinstance(claim, Unsigned):
            return claim
        return self.verify_claim(claim, method, host, target, body, now)

    def claim(self, header: str | None, host: str, now: float) -> Claim | Unsigned:
        """What the header alone can show: its form, a known key, the time, the audience."""
        if not header:
            return Unsigned("no signature")
        found = _PARAM.match(header.strip())
        if found is None:
            return Unsigned("malformed signature header")
        kid, ts_text, nonce, sig = found.groups()
        key = self.ring.by_id(kid)
        if key is None:
            return Unsigned(f"unknown key id {kid}")
        ts = int(ts_text)
        if abs(now - ts) > self.window_s:
            return Unsigned(f"signature time {ts} is outside ±{self.window_s:g}s of {int(now)}")
        if ts < self.not_before:
            return Unsigned(f"signed at {ts}, before this service started ({self.not_before})")
        if self.audiences and host.lower() not in self.audiences:
            return Unsigned(f"signed for {host!r}, not for this service")
        return Claim(key, ts, nonce, sig)

    def verify_claim(self, claim: Claim, method: str, host: str, target: str, body: bytes,
                     now: float) -> Unsigned | None:
        """None when `claim` signs exactly this call and was not seen before."""
        expected = hmac.new(claim.key, canonical(method, host, target, body, claim.ts,
                                                 claim.nonce), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, claim.sig):
            return Unsigned("bad signature")
        return self._first_time(claim.sig, now)

    def _first_time(self, sig: str, now: float) -> Unsigned | None:
        self._now = max(self._now, now)
        self._seen.expire()
        if sig in self._seen:
            return Unsigned("replayed signature")
        if len(self._seen) >= self._seen.maxsize:
            return Unsigned("replay cache full")
        self._seen[sig] = True
        return None
