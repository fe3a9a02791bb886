"""The tokens of the public API: create (the secret shown once), list, revoke.

Only an admin reaches these (routes.py); the secret is 32 random bytes, stored as
its SHA-256 only (ground/auth/tokens.py).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

from ground.appconfig import InvalidConfig
from ground.auth.tokens import SECRET_BYTES, TokenRecord, make_token, token_hash
from placement.api import TokenCreated, TokenRequest, TokenView
from placement.errors import NotFound
from placement.store import AppStore, TokenStore

log = logging.getLogger("thaw.placement.auth")


def token_view(record: TokenRecord) -> TokenView:
    return TokenView(id=record.id, name=record.name, admin=record.admin, apps=record.apps,
                     created_at=record.created_at, expires_at=record.expires_at,
                     revoked_at=record.revoked_at)


class Tokens:
    def __init__(self, store: TokenStore, apps: AppStore,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.apps = apps
        self.clock = clock

    async def create(self, request: TokenRequest) -> TokenCreated:
        if request.admin == bool(request.apps):
            raise InvalidConfig("apps", "an admin token names no apps; an app token names "
                                        "at least one")
        for app in request.apps:
            try:
                await self.apps.get(app)
            except NotFound:
                raise InvalidConfig("apps", f"app {app} not found") from None
        token_id = secrets.token_hex(8)
        token = make_token(token_id, secrets.token_bytes(SECRET_BYTES))
        now = self.clock()
        expires = None if request.expires_in_s is None else now + request.expires_in_s
        record = TokenRecord(id=token_id, hash=token_hash(token), admin=request.admin,
                             apps=sorted(set(request.apps)), name=request.name,
                             created_at=now, expires_at=expires)
        await self.store.add(record)
        log.info("token %s created (admin=%s apps=%s)", token_id, record.admin, record.apps)
        return TokenCreated(id=token_id, token=token, name=record.name, admin=record.admin,
                            apps=record.apps, created_at=now, expires_at=expires)

    async def list(self) -> list[TokenView]:
        return [token_view(r) for r in await self.store.list()]

    async def revoke(self, token_id: str) -> TokenView:
        record = await self.store.revoke(token_id, self.clock())
        log.info("token %s revoked", token_id)
        return token_view(record)

    async def app_deleted(self, app: str) -> None:
        revoked = await self.store.revoke_scoped_to(app, self.clock())
        if revoked:
            log.info("app %s deleted: revoked its tokens %s", app, ", ".join(revoked))
