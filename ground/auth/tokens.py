"""Bearer tokens of the public API: their format, their hash, and who they let in.

A token is `thaw_<id>_<secret>`: the id (16 hex) names it in lists and logs, the
secret is 32 random bytes (256 bits) in base64url. Only SHA-256 of the whole token
is kept — enough for a random secret, which cannot be guessed from its hash — and
compared in constant time. A bootstrap admin token (from the operator's environment
or file) may have any form of at least 32 characters; it is never stored.

Pure: the caller passes the random bytes and `now`; nothing here reads a clock,
a file or a database.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

import msgspec

PREFIX = "thaw_"
BOOTSTRAP_ID = "bootstrap"
MIN_BOOTSTRAP_CHARS = 32
SECRET_BYTES = 32
_FORM = re.compile(r"^thaw_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: an admin, or a token scoped to some apps."""

    token_id: str
    admin: bool
    apps: frozenset[str] = frozenset()

    def may_act_on(self, app: str) -> bool:
        return self.admin or app in self.apps


@dataclass(frozen=True)
class Refused:
    """Why a presented token does not authenticate (for the log, never the client)."""

    token_id: str
    reason: str


class TokenRecord(msgspec.Struct, frozen=True):
    """A stored token: never the secret, only its hash."""

    id: str
    hash: str
    admin: bool
    apps: list[str]
    name: str
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None

    def principal(self) -> Principal:
        return Principal(self.id, self.admin, frozenset(self.apps))


def make_token(token_id: str, secret: bytes) -> str:
    """The token shown once to its owner; `token_id` is 16 hex, `secret` 32 random bytes."""
    if len(secret) != SECRET_BYTES or not re.fullmatch(r"[0-9a-f]{16}", token_id):
        raise ValueError("a token needs a 16-hex id and 32 secret bytes")
    encoded = base64.urlsafe_b64encode(secret).rstrip(b"=").decode()
    return f"{PREFIX}{token_id}_{encoded}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def token_id_of(token: str) -> str | None:
    """The id of a well-formed token, else None (then it can only be the bootstrap one)."""
    found = _FORM.match(token)
    return found.group(1) if found else None


def bearer_of(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme in any case)."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value or len(value) > 512:
        return None
    return value


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def check_stored(token: str, record: TokenRecord | None, now: float) -> Principal | Refused:
    """The principal of `token` given the record stored under its id (None: unknown id)."""
    token_id = token_id_of(token) or "?"
    if record is None:
        return Refused(token_id, "unknown token")
    if not same_hash(token_hash(token), record.hash):
        return Refused(token_id, "wrong secret")
    if record.revoked_at is not None:
        return Refused(token_id, "revoked")
    if record.expires_at is not None and now >= record.expires_at:
        return Refused(token_id, "expired")
    return record.principal()


def check_bootstrap(token: str, bootstrap_hash: str) -> Principal | None:
    """The admin principal when `token` is the bootstrap token (by its hash), else None."""
    if bootstrap_hash and same_hash(token_hash(token), bootstrap_hash):
        return Principal(BOOTSTRAP_ID, admin=True)
    return None
