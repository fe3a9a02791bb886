"""An aiohttp proxy in front of a registry that counts, tampers and demands tokens.

Started in the test's event loop on a free loopback port. It counts blob GETs
per digest, can corrupt one blob (`tamper[digest] = "wrong_digest" | "truncate"
| "extra_bytes"`), can require `Authorization: Bearer <token>` after a standard
401 challenge (`require_token=True`), and can answer blob GETs with a redirect
to a second path (`redirect_blobs=True`), the way registries hand off to S3.
Mode "stall" sends half a blob and then waits until the proxy is closed.
`realm` points the challenge's bearer realm elsewhere, and `redirect_to` sends
blob redirects to another origin (both for egress-policy tests).
`manifest_delay_s` (settable at any time) holds every manifest answer that long:
a slow registry, for the races of a resolution with other changes.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

from tests.support.ports import free_port

_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding"}


class RegistryProxy:
    def __init__(
        self,
        upstream: str,
        *,
        require_token: bool = False,
        redirect_blobs: bool = False,
        realm: str | None = None,
        redirect_to: str = "",
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.require_token = require_token
        self.redirect_blobs = redirect_blobs
        self.realm = realm
        self.redirect_to = redirect_to.rstrip("/")
        self.token = secrets.token_hex(16)
        self.blob_gets: Counter[str] = Counter()
        self.token_requests: list[dict[str, str]] = []
        self.unauthorized = 0
        self.redirected_auth: list[str | None] = []  # Authorization of each /_blobs/ GET
        self.tamper: dict[str, str] = {}
        self.manifest_delay_s = 0.0
        self.port = free_port()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._released = asyncio.Event()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> RegistryProxy:
        app = web.Application()
        app.router.add_get("/token", self._token)
        app.router.add_get("/_blobs/{name:.+}/{digest}", self._redirected_blob)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._released.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _token(self, request: web.Request) -> web.Response:
        self.token_requests.append(dict(request.query))
        return web.json_response({"token": self.token, "expires_in": 300})

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    def _challenge(self, request: web.Request) -> web.Response:
        self.unauthorized += 1
        name = request.path.split("/v2/", 1)[-1].rsplit("/", 2)[0]
        realm = self.realm or f"http://{self.host}/token"
        value = f'Bearer realm="{realm}",service="thaw-test",scope="repository:{name}:pull"'
        return web.json_response(
            {"errors": [{"code": "UNAUTHORIZED"}]}, status=401, headers={"WWW-Authenticate": value}
        )

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self.require_token and request.path.startswith("/v2/") and not self._authorized(request):
            return self._challenge(request)
        if "/manifests/" in request.path and self.manifest_delay_s:
            await asyncio.sleep(self.manifest_delay_s)
        if "/blobs/sha256:" in request.path and request.method == "GET":
            digest = request.path.rsplit("/", 1)[-1]
            self.blob_gets[digest] += 1
            if self.redirect_blobs:
                name = request.path[len("/v2/") :].rsplit("/blobs/", 1)[0]
                raise web.HTTPTemporaryRedirect(f"{self.redirect_to}/_blobs/{name}/{digest}")
        return await self._relay(request, request.path_qs)

    async def _redirected_blob(self, request: web.Request) -> web.StreamResponse:
        name, digest = request.match_info["name"], request.match_info["digest"]
        self.redirected_auth.append(request.headers.get("Authorization"))
        return await self._relay(request, f"/v2/{name}/blobs/{digest}")

    async def _relay(self, request: web.Request, path: str) -> web.StreamResponse:
        assert self._session is not None
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "authorization")
        }
        body = await request.read()
        async with self._session.request(
            request.method,
            self.upstream + path,
            headers=headers,
            data=body or None,
            allow_redirects=False,
        ) as upstream:
            payload = await upstream.read()
            out_headers = {
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS
            }
        digest = path.rsplit("/", 1)[-1]
        mode = self.tamper.get(digest)
        if mode is not None and request.method == "GET" and upstream.status == 200:
            return await _tampered(request, mode, payload, out_headers, self._released)
        return web.Response(status=upstream.status, body=payload, headers=out_headers)


async def _tampered(
    request: web.Request,
    mode: str,
    payload: bytes,
    headers: dict[str, Any],
    released: asyncio.Event,
) -> web.StreamResponse:
    if mode == "wrong_digest":
        flipped = bytes([payload[0] ^ 0xFF]) + payload[1:]
        return web.Response(body=flipped, headers=headers)
    if mode == "extra_bytes":
        return web.Response(body=payload + b"\0" * 1024, headers=headers)
    assert mode in ("truncate", "stall"), mode
    response = web.StreamResponse(headers=headers)
    response.content_length = len(payload)
    await response.prepare(request)
    await response.write(payload[: len(payload) // 2])
    if mode == "stall":
        await released.wait()
    assert request.transport is not None
    request.transport.close()
    return response
