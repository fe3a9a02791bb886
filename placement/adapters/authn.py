"""Who is calling: bearer tokens on public routes, signatures on internal ones.

One middleware looks up the matched route's declared Access (routes.py), finds the
caller's principal (the bootstrap admin token, or a stored token by its id) and asks
the core (`access.authorize`) whether it may go on. Every denial is logged with the
token's id, never the token; the client sees 401 (with `WWW-Authenticate: Bearer`),
403 for admin routes, or a 404 indistinguishable from an unknown app.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ground.auth.aiohttp_glue import refusal, unsigned_answer
from ground.auth.signing import Verifier
from ground.auth.tokens import (
    Principal,
    Refused,
    bearer_of,
    check_bootstrap,
    check_stored,
    token_hash,
    token_id_of,
)
from placement.adapters.routes import ROUTES, Route
from placement.core.access import Access, Denied, authorize
from placement.store import TokenStore

log = logging.getLogger("thaw.placement.auth")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PRINCIPAL = web.RequestKey("principal", Principal)
CHALLENGE = 'Bearer realm="thaw"'


class Authenticator:
    def __init__(self, tokens: TokenStore, bootstrap_token: str, verifier: Verifier,
                 clock: Callable[[], float] = time.time) -> None:
        self.tokens = tokens
        self.bootstrap_hash = token_hash(bootstrap_token) if bootstrap_token else ""
        self.verifier = verifier
        self.clock = clock

    async def principal(self, headers: list[str]) -> Principal | Refused | None:
        """Who the `Authorization` headers say the caller is; None: no bearer token at all.
        Several headers are refused, not resolved by order (proxies disagree on which wins)."""
        if len(headers) > 1:
            return Refused("?", "several Authorization headers")
        token = bearer_of(headers[0] if headers else None)
        if token is None:
            return None
        admin = check_bootstrap(token, self.bootstrap_hash)
        if admin is not None:
            return admin
        token_id = token_id_of(token)
        record = await self.tokens.get(token_id) if token_id else None
        return check_stored(token, record, self.clock())


def route_of(request: web.Request, table: dict[tuple[str, str], Route]) -> Route | None:
    """The declared route of a request; HEAD is its GET (aiohttp answers it with the GET
    handler, so it must be allowed exactly as that GET is)."""
    resource = request.match_info.route.resource
    if resource is None:
        return None
    method = "GET" if request.method == "HEAD" else request.method
    return table.get((method, resource.canonical))


def auth_middleware(auth: Authenticator) -> Any:
    table = {(r.method, r.path): r for r in ROUTES}

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        route = route_of(request, table)
        if route is None and request.match_info.route.resource is None:
            return await handler(request)  # no such path: aiohttp's own 404
        # A known path with an undeclared method: aiohttp answers 405, but only to an admin —
        # whatever is not declared gets the strictest access, never a looser one.
        access = route.access if route is not None else Access.ADMIN
        if access is Access.PUBLIC:
            return await handler(request)
        if access is Access.SIGNED:
            if await refusal(auth.verifier, request, auth.clock) is not None:
                return unsigned_answer()  # refusal() logged why
            return await handler(request)
        found = await auth.principal(request.headers.getall("Authorization", []))
        principal = found if isinstance(found, Principal) else None
        denied = authorize(access, principal, request.match_info.get("app"))
        if denied is not None:
            who = found.token_id if found is not None else "-"
            why = found.reason if isinstance(found, Refused) else denied.reason
            return denial(request, denied, f"token={who} {why}", challenge=principal is None)
        request[PRINCIPAL] = principal
        return await handler(request)

    return middleware


def denial(request: web.Request, denied: Denied, detail: str, *, challenge: bool
           ) -> web.Response:
    log.warning("denied %s %s from %s: %s -> %d", request.method, request.path,
                request.remote, detail, denied.status)
    headers = {}
    if challenge:
        invalid = bool(request.headers.get("Authorization"))
        headers["WWW-Authenticate"] = CHALLENGE + (', error="invalid_token"' if invalid else "")
    return web.json_response({"error": denied.code, "message": denied.message},
                             status=denied.status, headers=headers)


def principal_of(request: web.Request) -> Principal:
    return request[PRINCIPAL]
