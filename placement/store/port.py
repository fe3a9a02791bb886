"""The store port: placement's durable state (app configs, releases, events, fenced
machines, pinned images' layer lists, the API's tokens), as the callers need it.

Two backends implement it (placement/store/sqlite.py, the embedded default, and
placement/store/postgres.py, shared by several placements), both through the one
SQL implementation of placement/store/apps.py and tokens.py; one contract suite
(tests/contract/test_store_contract.py) runs against both. Every change is one
transaction. Expected outcomes raise placement's errors: NotFound, Conflict,
HostTaken; a store that cannot be reached raises StoreUnavailable (503).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Protocol

from ground.appconfig import AppConfig
from ground.auth.tokens import TokenRecord
from placement.api import AppEvent, Release
from placement.core.releases import ReleaseStatus
from placement.errors import Conflict, Unavailable

EVENTS_KEPT = 500  # per app: older events are trimmed as new ones are added


class HostTaken(Conflict):
    """A routed name another app holds; the API shows the holder only to who may see it."""

    code = "host_taken"

    def __init__(self, host: str, holder: str) -> None:
        super().__init__(f"host {host} is taken")
        self.host = host
        self.holder = holder


class StoreUnavailable(Unavailable):
    """The store did not answer (its server is down or unreachable): retry later."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"placement's store is unavailable: {detail}",
                         code="store_unavailable")


@dataclass(frozen=True)
class StoredSecret:
    """One secret of an app as stored: encrypted (ground/auth/sealing.py), never in clear."""

    name: str
    ciphertext: bytes
    nonce: bytes
    key_id: str  # the secrets key it is encrypted with
    digest: str  # what `thaw secrets list` shows
    created_at: float  # unix seconds


@dataclass(frozen=True)
class SecretWrites:
    """Secrets written with a config (`AppStore.update`): set (or replaced), and removed."""

    put: tuple[StoredSecret, ...] = ()
    drop: tuple[str, ...] = ()


class AppStore(Protocol):
    """App configs by name; releases, events and fenced machines by the app's incarnation
    (`uid`: a new app of a deleted one's name starts with none of them)."""

    async def list(self) -> list[AppConfig]:
        """Every app, by name."""
        ...

    async def get(self, name: str) -> AppConfig:
        """NotFound when there is no such app."""
        ...

    async def holds(self, name: str) -> bool: ...

    async def holder(self, host: str) -> str | None:
        """The app that routes `host`, if any."""
        ...

    async def create(self, config: AppConfig, release: Release | None = None) -> AppConfig:
        """Store a new app (version 1), claim its hosts and add its first release, in one
        transaction: Conflict `exists`, HostTaken, or all of it."""
        ...

    async def is_current(self, config: AppConfig) -> bool:
        """`config`'s app still exists, as the same incarnation (not deleted, not re-made)."""
        ...

    async def update(self, config: AppConfig, release: Release | None = None,
                     secrets: SecretWrites | None = None) -> AppConfig:
        """Write `config` over the stored one, which must still be the one it was made from
        (same uid and version, else Conflict); the version becomes + 1, hosts are claimed
        again, `release` is added and `secrets` written, in one transaction."""
        ...

    async def delete(self, name: str) -> None:
        """The app, its hosts, releases, events, fenced machines and secrets; NotFound if
        none."""
        ...

    async def secrets(self, uid: str) -> builtins.list[StoredSecret]:
        """The app's secrets (encrypted), by name."""
        ...

    async def rewrap_secret(self, uid: str, was: StoredSecret, now: StoredSecret) -> bool:
        """Replace a secret's ciphertext (re-encrypted under another key, same value and
        digest) if the row is still `was`; False if it changed or went meanwhile."""
        ...

    async def releases(self, uid: str) -> builtins.list[Release]:
        """Newest first."""
        ...

    async def release(self, uid: str, version: int) -> Release | None: ...

    async def last_release(self, uid: str) -> int:
        """The highest release version (0: none)."""
        ...

    async def set_release_status(self, uid: str, version: int, status: ReleaseStatus,
                                 reason: str = "", config: AppConfig | None = None
                                 ) -> AppConfig | None:
        """Mark a release's status; with `config`, also write it (as `update` does, without
        a release) in the same transaction, and return it. A move the table refuses
        (placement/core/releases.py: an ended release) writes nothing and returns None."""
        ...

    async def add_event(self, uid: str, event: AppEvent) -> None:
        """Keep the newest EVENTS_KEPT events of the app."""
        ...

    async def events(self, uid: str, limit: int = EVENTS_KEPT) -> builtins.list[AppEvent]:
        """Newest first."""
        ...

    async def fence(self, uid: str, machine: str, at: float) -> None:
        """A machine lost with its worker: never counted again (`at`: unix seconds)."""
        ...

    async def fenced(self, uid: str) -> frozenset[str]: ...

    async def unfence(self, machine: str) -> None: ...


class ImageStore(Protocol):
    """The layer list (digest -> compressed bytes) of every pinned image, by digest."""

    async def layers(self, digest: str) -> dict[str, int] | None: ...

    async def keep(self, digest: str, layers: dict[str, int]) -> None: ...


class TokenStore(Protocol):
    """The API's tokens: hashes, never secrets."""

    async def get(self, token_id: str) -> TokenRecord | None: ...

    async def list(self) -> list[TokenRecord]:
        """By id."""
        ...

    async def add(self, record: TokenRecord) -> None: ...

    async def revoke(self, token_id: str, at: float) -> TokenRecord:
        """Revoked at `at` (unix seconds) unless it already was; NotFound if none."""
        ...

    async def revoke_scoped_to(self, app: str, at: float) -> builtins.list[str]:
        """Revoke every live token whose scope names `app`; their ids."""
        ...


class Store(Protocol):
    """One opened store: its three parts over one database."""

    @property
    def apps(self) -> AppStore: ...
    @property
    def images(self) -> ImageStore: ...
    @property
    def tokens(self) -> TokenStore: ...

    async def close(self) -> None: ...
