"""An aiohttp proxy in front of a registry that counts, tampers and demands tokens.

Started in the test's event loop on a free loopback port. It counts blob GETs
per digest, can corrupt one blob (`tamper[digest] = "wrong_digest" | "truncate"
| "extra_bytes"`), can require `Authorization: Bearer <token>` after a standard
401 challenge (`require_token=True`), and can answer blob GETs with a redirect
to a second path (`redirect_blobs=True`), the way registries hand off to S3.
Mode "stall" sends half a blob and then waits until the proxy is closed; mode
"drip" sends one byte every `drip_interval_s` (a registry that never idles
long enough for a read timeout, and never finishes either).
`realm` points the challenge's bearer realm elsewhere, and `redirect_to` sends
blob redirects to another origin (both for egress-policy tests).
`manifest_delay_s` (settable at any time) holds every manifest answer that long:
a slow registry, for the races of a resolution with other changes.

`StaticRegistry` is a registry made by hand, for what a real one will not
serve: documents and blobs from memory, and blobs that never end.
"""

from __future__ import annotations

import asyncio
import hashlib
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
        self.drip_interval_s = 0.05
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
            if mode == "drip":
                return await _drip(request, payload, out_headers, self)
            return await _tampered(request, mode, payload, out_headers, self._released)
        return web.Response(status=upstream.status, body=payload, headers=out_headers)


async def _drip(
    request: web.Request, payload: bytes, headers: dict[str, Any], proxy: RegistryProxy
) -> web.StreamResponse:
    response = web.StreamResponse(headers=headers)
    response.content_length = len(payload)
    await response.prepare(request)
    try:
        for index in range(len(payload)):
            await response.write(payload[index : index + 1])
            try:
                await asyncio.wait_for(proxy._released.wait(), proxy.drip_interval_s)
                break
            except TimeoutError:
                pass
    except ConnectionError:
        pass  # the client gave up: that is the point
    return response


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


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class StaticRegistry:
    """A Distribution v2 registry made by hand, on a free loopback port of the test's loop.

    `put_image` serves a manifest under a tag and its digest, and its blobs;
    a digest in `endless` is answered with zeros until the client goes away.
    `blob_gets` counts blob GETs and `bytes_sent` the blob bytes sent, per digest.
    """

    def __init__(self) -> None:
        self.manifests: dict[tuple[str, str], bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.endless: set[str] = set()
        self.blob_gets: Counter[str] = Counter()
        self.bytes_sent: Counter[str] = Counter()
        self.port = free_port()
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def put_image(
        self, repository: str, tag: str, manifest: bytes, blobs: dict[str, bytes]
    ) -> str:
        """Serve `manifest` as repository:tag and by its digest (returned), and `blobs`."""
        digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
        self.manifests[(repository, tag)] = manifest
        self.manifests[(repository, digest)] = manifest
        self.blobs.update(blobs)
        return digest

    async def __aenter__(self) -> StaticRegistry:
        app = web.Application()
        app.router.add_get("/v2/", self._base)
        app.router.add_get("/v2/{name:.+}/manifests/{reference}", self._manifest)
        app.router.add_get("/v2/{name:.+}/blobs/{digest}", self._blob)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _base(self, _: web.Request) -> web.Response:
        return web.json_response({})

    async def _manifest(self, request: web.Request) -> web.Response:
        key = (request.match_info["name"], request.match_info["reference"])
        if key not in self.manifests:
            return web.json_response({"errors": [{"code": "MANIFEST_UNKNOWN"}]}, status=404)
        return web.Response(body=self.manifests[key], content_type=OCI_MANIFEST)

    async def _blob(self, request: web.Request) -> web.StreamResponse:
        digest = request.match_info["digest"]
        self.blob_gets[digest] += 1
        if digest in self.endless:
            return await self._endless(request, digest)
        if digest not in self.blobs:
            return web.json_response({"errors": [{"code": "BLOB_UNKNOWN"}]}, status=404)
        self.bytes_sent[digest] += len(self.blobs[digest])
        return web.Response(body=self.blobs[digest], content_type="application/octet-stream")

    async def _endless(self, request: web.Request, digest: str) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        zeros = bytes(1 << 16)
        try:
            while not self._closing.is_set():
                await response.write(zeros)
                self.bytes_sent[digest] += len(zeros)
        except ConnectionError:
            pass  # the client stopped reading
        return response
