"""Secrets' cryptography: values encrypted at rest, sealed for agents, and their digests.

Each use has its own AES-256-GCM key, derived by HKDF-SHA256 from a key ring's key,
and its own associated data, so a ciphertext made for one use, app or name never
opens as another:
- at rest (placement's store): from the secrets key file (`SecretKeys`: the first
  key encrypts, every one decrypts); AAD binds the app's incarnation (uid) and the
  secret's name, so rows cannot be swapped between apps or names.
- sealed for an agent (an offer, then the agent's op log): from the cluster key
  placement and agents already share (`KeyRing`); AAD binds app, uid and release.
- digests (`thaw secrets list`): HMAC-SHA256 keyed from the secrets key over uid,
  name and value, DIGEST_CHARS hex: a low-entropy value cannot be tested against it
  without the key, and one value set in two apps does not look the same.
Pure: nonces are arguments (NONCE_BYTES random bytes from the caller); no IO.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ground.auth.signing import KeyRing, ring_keys

NONCE_BYTES = 12
DIGEST_CHARS = 12
MAX_KEYS = 4
SEALED_VERSION = "v1"
NO_SECRETS_KEY = ("secrets are not enabled: start placement with --secrets-key-file PATH "
                  "(thaw up makes one)")
_AT_REST = b"thaw-secret-at-rest-v1"
_DIGEST = b"thaw-secret-digest-v1"
_SEALED = b"thaw-sealed-env-v1"


class Unsealable(ValueError):
    """A ciphertext that does not open: its key is not in the ring, or it was altered or
    made for another app, name or release."""


@dataclass(frozen=True)
class SecretKeys:
    """The secrets key ring: the first key encrypts, every one decrypts (rotation)."""

    keys: tuple[bytes, ...]

    @classmethod
    def parse(cls, text: str) -> SecretKeys:
        """One key per line (at least MIN_KEY_CHARS characters each), the newest first."""
        return cls(ring_keys(text, "secrets key", MAX_KEYS))

    @property
    def primary_id(self) -> str:
        return key_id(self.keys[0])

    def by_id(self, kid: str) -> bytes | None:
        return next((k for k in self.keys if hmac.compare_digest(key_id(k), kid)), None)


def key_id(key: bytes) -> str:
    """A secrets key's id (12 hex): stored beside each ciphertext; says nothing of the key."""
    return hashlib.sha256(b"thaw-secrets-key-id:" + key).hexdigest()[:12]


def _derived(key: bytes, use: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=use).derive(key)


def _joined(*parts: str) -> bytes:
    return b"\0".join(part.encode() for part in parts)


def encrypt_value(keys: SecretKeys, uid: str, name: str, value: str, nonce: bytes
                  ) -> tuple[bytes, str]:
    """(ciphertext, key id) of `value` under the ring's first key."""
    _check_nonce(nonce)
    aead = AESGCM(_derived(keys.keys[0], _AT_REST))
    return aead.encrypt(nonce, value.encode(), _AT_REST + b"\0" + _joined(uid, name)), \
        keys.primary_id


def decrypt_value(keys: SecretKeys, uid: str, name: str, ciphertext: bytes, nonce: bytes,
                  kid: str) -> str:
    """The value; Unsealable when its key is not in the ring or the row was altered."""
    key = keys.by_id(kid)
    if key is None:
        raise Unsealable(f"secret {name}: its key {kid} is not in the secrets key file")
    try:
        plain = AESGCM(_derived(key, _AT_REST)).decrypt(
            nonce, ciphertext, _AT_REST + b"\0" + _joined(uid, name))
    except (InvalidTag, ValueError):
        raise Unsealable(f"secret {name}: does not decrypt (altered, or another app's)") \
            from None
    return plain.decode()


def digest(keys: SecretKeys, uid: str, name: str, value: str) -> str:
    """What `thaw secrets list` shows of a value: keyed, truncated, bound to app and name."""
    mac = hmac.new(_derived(keys.keys[0], _DIGEST), _joined(uid, name, value), "sha256")
    return mac.hexdigest()[:DIGEST_CHARS]


def _sealed_aad(app: str, uid: str, release: int) -> bytes:
    return _SEALED + b"\0" + _joined(app, uid, str(release))


def seal_env(ring: KeyRing, app: str, uid: str, release: int, env: dict[str, str],
             nonce: bytes) -> str:
    """`env` sealed for the agents of the cluster: `v1.<key id>.<base64 nonce+ciphertext>`
    (what an offer and the agent's op log carry); "" for no env."""
    if not env:
        return ""
    _check_nonce(nonce)
    key = ring.keys[0]
    sealed = AESGCM(_derived(key, _SEALED)).encrypt(
        nonce, msgspec.json.encode(env), _sealed_aad(app, uid, release))
    return ".".join((SEALED_VERSION, ring.key_id(key),
                     base64.urlsafe_b64encode(nonce + sealed).decode()))


def unseal_env(ring: KeyRing, app: str, uid: str, release: int, sealed: str
               ) -> dict[str, str]:
    """The env `seal_env` sealed for this app and release; Unsealable otherwise."""
    if not sealed:
        return {}
    version, _, rest = sealed.partition(".")
    kid, _, blob = rest.partition(".")
    if version != SEALED_VERSION:
        raise Unsealable(f"sealed secrets of an unknown version {version[:8]!r}")
    key = ring.by_id(kid)
    if key is None:
        raise Unsealable("sealed secrets: their cluster key is not in this agent's ring")
    try:
        raw = base64.urlsafe_b64decode(blob)
        plain = AESGCM(_derived(key, _SEALED)).decrypt(
            raw[:NONCE_BYTES], raw[NONCE_BYTES:], _sealed_aad(app, uid, release))
        return msgspec.json.decode(plain, type=dict[str, str])
    except (InvalidTag, ValueError, binascii.Error, msgspec.DecodeError):
        raise Unsealable("sealed secrets do not open (altered, or another app's or "
                         "release's)") from None


def _check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a nonce is {NONCE_BYTES} bytes")
