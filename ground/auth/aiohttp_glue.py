"""Signed internal calls over aiohttp: headers for a request we send, a check for one we get."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable

import yarl
from aiohttp import web

from ground.auth.signing import HEADER, KeyRing, Unsigned, Verifier, sign

log = logging.getLogger("thaw.auth")


class Signer:
    """Signs outgoing requests with the ring's first key."""

    def __init__(self, ring: KeyRing, clock: Callable[[], float] = time.time) -> None:
        self.ring = ring
        self.clock = clock

    def headers(self, method: str, url: yarl.URL, body: bytes) -> dict[str, str]:
        """Host and signature headers for `url` (send it as `yarl.URL(str(url), encoded=True)`
        so the target goes out exactly as signed; `signed` does both)."""
        host = url.host_port_subcomponent or ""
        value = sign(self.ring, method, host, url.raw_path_qs, body, self.clock(),
                     secrets.token_hex(16))
        return {"Host": host, HEADER: value}

    def signed(self, method: str, url: yarl.URL, body: bytes
               ) -> tuple[yarl.URL, dict[str, str]]:
        """The URL to send (encoded as signed) and the headers of one signed JSON call."""
        headers = self.headers(method, url, body)
        if body:
            headers["Content-Type"] = "application/json"
        return yarl.URL(str(url), encoded=True), headers


UNSIGNED_BODY = b'{"error": "unauthorized", "message": "a signed call is required"}'


def unsigned_answer() -> web.Response:
    """The one answer to a call without a valid signature (the reason is in the log)."""
    return web.Response(status=401, body=UNSIGNED_BODY, content_type="application/json")


async def refusal(verifier: Verifier, request: web.Request,
                  clock: Callable[[], float] = time.time) -> Unsigned | None:
    """None when `request` carries a valid, fresh, first-seen signature. The body is read
    only once the header passed what it alone can show (form, key, time, audience)."""
    now = clock()
    claim = verifier.claim(request.headers.get(HEADER), request.host, now)
    found = claim if isinstance(claim, Unsigned) else verifier.verify_claim(
        claim, request.method, request.host, request.raw_path, await request.read(), now)
    if found is not None:
        log.warning("refused unsigned call %s %s from %s: %s", request.method, request.path,
                    request.remote, found.reason)
    return found
