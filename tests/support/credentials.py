"""The credentials test platforms run with: a cluster key, a bootstrap admin token, a
secrets key and a route key."""

from __future__ import annotations

import time
from typing import Any

import yarl

from ground.auth.aiohttp_glue import Signer
from ground.auth.sealing import SecretKeys
from ground.auth.signing import KeyRing
from ground.auth.tickets import RouteKeys

CLUSTER_KEY = "test-cluster-key-" + "k" * 32
ADMIN_TOKEN = "test-admin-token-" + "t" * 32
RING = KeyRing.parse(CLUSTER_KEY)
SECRETS_KEY = "test-secrets-key-" + "s" * 32  # encrypts apps' secrets at rest
SECRETS_RING = SecretKeys.parse(SECRETS_KEY)
ROUTE_KEY = "test-route-key-" + "r" * 32  # placement's and the edges' only, never agents'
ROUTE_KEYS = RouteKeys.parse(ROUTE_KEY)
SIGNER = Signer(RING)
ENV = {"THAW_CLUSTER_KEY": CLUSTER_KEY, "THAW_ADMIN_TOKEN": ADMIN_TOKEN}


def signed_headers(method: str, url: str, body: bytes = b"", ring: KeyRing = RING,
                   now: float | None = None) -> dict[str, str]:
    """Host and signature headers for one call to `url` (path and query as given)."""
    signer = Signer(ring, clock=(lambda: now) if now is not None else time.time)
    return signer.headers(method, yarl.URL(url, encoded=True), body)


def bearer(token: str) -> dict[str, Any]:
    return {"Authorization": f"Bearer {token}"} if token else {}
