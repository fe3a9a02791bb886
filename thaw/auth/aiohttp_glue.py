"""Signed internal calls over aiohttp: headers for a request we send, a check for one we get."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import yarl
from aiohttp import web

from thaw.auth.signing import HEADER, KeyRing, Unsigned, Verifier, sign

log = logging.getLogger("thaw.auth")


class Signer:
    """Signs outgoing requests with the ring's first key."""

    def __init__(self, ring: KeyRing, clock: Callable[[], float] = time.time) -> None:
        self.ring = ring
        self.clock = clock

    def headers(self, method: str, url: yarl.URL, body: bytes) -> dict[str, str]:
        """Host and signature headers for `url` (send it as `yarl.URL(str(url), encoded=True)`
        so the target goes out exactly as signed)."""
        host = url.host_port_subcomponent or ""
        value = sign(self.ring, method, host, url.raw_path_qs, body, self.clock(),
                     secrets.token_hex(16))
        return {"Host": host, HEADER: value}


async def refusal(verifier: Verifier, request: web.Request,
                  clock: Callable[[], float] = time.time) -> Unsigned | None:
    """None when `request` carries a valid, fresh, first-seen signature (reads the body)."""
    body = await request.read()
    found = verifier.verify(request.headers.get(HEADER), request.method, request.host,
                            request.raw_path, body, clock())
    if found is not None:
        log.warning("refused unsigned call %s %s from %s: %s", request.method, request.path,
                    request.remote, found.reason)
    return found
