"""Apps' secrets: set, listed and unset through the API; encrypted at rest; sealed for
the agents that start the app's machines.

`SecretVault` is the only holder of values in placement: it encrypts them for the store
with the secrets keys (ground/auth/sealing.py) and, for an offer, decrypts them and seals
them with the cluster key for the agent, which opens them only to build the machine's
environment. The app's config (store, registry, releases, `apps show`) carries names
and digests only. `AppSecrets` is the API's flow: a change is decided by the core
(placement/core/secrets.py), written with the new config and its release in one
transaction, published, and rolled out by the reconciler like any release.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable

import msgspec

from ground.appconfig import AppConfig, Strategy
from ground.auth.sealing import (
    NO_SECRETS_KEY,
    NONCE_BYTES,
    SecretKeys,
    Unsealable,
    decrypt_value,
    digest,
    encrypt_value,
    seal_env,
)
from ground.auth.signing import KeyRing
from ground.registry import Registry
from placement.api import Release, SecretsChanged, SecretsRequest, SecretView
from placement.applocks import AppLocks
from placement.core.secrets import UnknownSecret, plan_secrets
from placement.errors import Conflict, NotFound, Unavailable
from placement.store import AppStore, SecretWrites, StoredSecret

log = logging.getLogger("thaw.placement")
StoreChange = Callable[[AppConfig, AppConfig, str, Strategy | None, SecretWrites],
                       Awaitable[tuple[AppConfig, Release | None]]]


class SecretVault:
    def __init__(self, store: AppStore, keys: SecretKeys | None, cluster: KeyRing,
                 clock: Callable[[], float]) -> None:
        """`keys`: the secrets key ring (None: secrets disabled, every change refused)."""
        self.store, self.keys, self.cluster, self.clock = store, keys, cluster, clock

    def _ring(self) -> SecretKeys:
        if self.keys is None:
            raise Conflict(NO_SECRETS_KEY, code="secrets_disabled")
        return self.keys

    async def values(self, config: AppConfig) -> dict[str, str]:
        """The app's secrets in clear (for a change's plan, or to seal); 503 when one does
        not decrypt (its key left the key file)."""
        rows = await self.store.secrets(config.uid)
        if not rows:
            return {}
        ring = self._ring()
        try:
            return {r.name: decrypt_value(ring, config.uid, r.name, r.ciphertext, r.nonce,
                                          r.key_id) for r in rows}
        except Unsealable as exc:
            raise Unavailable(f"app {config.name}: {exc}", code="secrets_unreadable") from None

    def encrypted(self, config: AppConfig, name: str, value: str) -> StoredSecret:
        ring = self._ring()
        nonce = os.urandom(NONCE_BYTES)
        ciphertext, kid = encrypt_value(ring, config.uid, name, value, nonce)
        return StoredSecret(name, ciphertext, nonce, kid, digest(ring, config.uid, name, value),
                            self.clock())

    async def sealed_for(self, config: AppConfig) -> str:
        """The app's secrets sealed for an agent, for machines of `config.release` ("" for
        an app without secrets)."""
        if not config.secrets:
            return ""
        return seal_env(self.cluster, config.name, config.uid, config.release,
                        await self.values(config), os.urandom(NONCE_BYTES))

    async def rewrap(self, configs: list[AppConfig]) -> int:
        """Re-encrypt under the first key every secret encrypted under another (a key
        rotation: run at start); the number re-encrypted. A row changed meanwhile is left
        (its new ciphertext is under the first key already)."""
        if self.keys is None:
            return 0
        done = 0
        for config in configs:
            for row in await self.store.secrets(config.uid):
                if row.key_id == self.keys.primary_id:
                    continue
                try:
                    value = decrypt_value(self.keys, config.uid, row.name, row.ciphertext,
                                          row.nonce, row.key_id)
                except Unsealable as exc:  # its machines cannot be made: say so, go on
                    log.error("app %s: %s", config.name, exc)
                    continue
                nonce = os.urandom(NONCE_BYTES)
                ciphertext, kid = encrypt_value(self.keys, config.uid, row.name, value, nonce)
                now = dataclasses.replace(row, ciphertext=ciphertext, nonce=nonce, key_id=kid)
                done += await self.store.rewrap_secret(config.uid, row, now)
        return done


class AppSecrets:
    """The API's secrets routes (see the module's docstring)."""

    def __init__(self, vault: SecretVault, store: AppStore, locks: AppLocks,
                 registry: Registry, store_change: StoreChange,
                 poke: Callable[[str], None]) -> None:
        """`store_change(current, config, reason, strategy, writes)`: store a config with
        its release (placement/service.py); `poke(app)`: ask for a reconcile pass."""
        self.vault, self.store, self.locks, self.registry = vault, store, locks, registry
        self._store_change, self._poke = store_change, poke

    async def list(self, app: str) -> list[SecretView]:
        config = await self.store.get(app)
        return [SecretView(r.name, r.digest, r.created_at)
                for r in await self.store.secrets(config.uid)]

    async def change(self, app: str, request: SecretsRequest) -> SecretsChanged:
        """Set and unset in one release (none when nothing changes); names only are
        logged."""
        async with self.locks.hold(app):
            current = await self.store.get(app)
            try:
                plan = plan_secrets(await self.vault.values(current), request.secrets,
                                    request.unset, current.env)
            except UnknownSecret as exc:
                raise NotFound(f"secret {exc.name} of app {app} not found") from None
            release = None
            if plan.changed:
                rows = tuple(self.vault.encrypted(current, n, v) for n, v in plan.put.items())
                names = {k: v for k, v in current.secrets.items() if k not in plan.drop}
                config = msgspec.structs.replace(
                    current, secrets=names | {r.name: r.digest for r in rows})
                reason = "; ".join(filter(None, (
                    f"secrets set: {', '.join(sorted(plan.put))}" if plan.put else "",
                    f"secrets unset: {', '.join(plan.drop)}" if plan.drop else "")))
                stored, release = await self._store_change(current, config, reason, None,
                                                           SecretWrites(rows, plan.drop))
                await self.registry.put_app(stored)
                log.info("app %s: %s (release %s)", app, reason,
                         release.version if release else "-")
        if release is not None:
            self._poke(app)
        return SecretsChanged(app=app, secrets=await self.list(app),
                              release=None if release is None else release.version)
