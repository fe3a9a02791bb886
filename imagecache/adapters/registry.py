"""Distribution API v2 client: manifests and blobs over aiohttp, with bearer-token auth.

On a 401 with `WWW-Authenticate: Bearer realm=…,service=…,scope=…` it fetches
a token from the realm (anonymously, or with basic credentials when given),
caches it per repository and retries once. aiohttp errors are translated to
ImageError here and nowhere else.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from urllib.parse import urlsplit

import aiohttp

from imagecache.core.manifest import MANIFEST_ACCEPT, sha256_digest
from imagecache.core.reference import RegistryRef
from imagecache.errors import ImageError

_CHUNK = 1 << 16
_MAX_MANIFEST_BYTES = 4 * 1024 * 1024
_PARAM = re.compile(r'(\w+)="([^"]*)"')

HostCheck = Callable[[str], None]


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="…",service="…"` -> ("bearer", {"realm": …, "service": …})."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(_PARAM.findall(rest))


class RegistryClient:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        check_host: HostCheck,
        credentials: dict[str, tuple[str, str]] | None = None,
    ) -> None:
        self._session = session
        self._check_host = check_host
        self._credentials = credentials or {}
        self._tokens: dict[tuple[str, str], str] = {}

    async def manifest(self, ref: RegistryRef, reference: str) -> tuple[bytes, str, str]:
        """(body, content type, sha256 digest of body) of a manifest or index."""
        url = f"{ref.base_url}/v2/{ref.repository}/manifests/{reference}"
        async with self._request(ref, url, {"Accept": MANIFEST_ACCEPT}) as response:
            await _raise_for_status(response, f"manifest {ref.repository}:{reference}")
            body = await _read_bounded(response, _MAX_MANIFEST_BYTES)
            return body, response.headers.get("Content-Type", ""), sha256_digest(body)

    async def blob(self, ref: RegistryRef, digest: str) -> AsyncIterator[bytes]:
        """Stream a blob's bytes (redirects followed); the caller verifies them."""
        url = f"{ref.base_url}/v2/{ref.repository}/blobs/{digest}"
        try:
            async with self._request(ref, url, {}) as response:
                await _raise_for_status(response, f"blob {digest}")
                async for chunk in response.content.iter_chunked(_CHUNK):
                    yield chunk
        except aiohttp.ClientPayloadError as exc:
            raise ImageError("size_mismatch", f"blob {digest}: body cut short ({exc})") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ImageError("registry_error", f"blob {digest}: {exc!r}") from None

    def _request(
        self, ref: RegistryRef, url: str, headers: dict[str, str]
    ) -> _AuthedRequest:
        return _AuthedRequest(self, ref, url, headers)

    async def _send(
        self, ref: RegistryRef, url: str, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        self._check_host(ref.host)
        token = self._tokens.get((ref.host, ref.repository))
        response = await self._get(url, _with_token(headers, token))
        if response.status != 401:
            return response
        challenge = response.headers.get("WWW-Authenticate", "")
        response.release()
        retry_headers = await self._authorize(ref, challenge, headers)
        return await self._get(url, retry_headers)

    async def _get(self, url: str, headers: dict[str, str]) -> aiohttp.ClientResponse:
        try:
            return await self._session.get(url, headers=headers, allow_redirects=True)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ImageError("registry_error", f"GET {url}: {exc!r}") from None

    async def _authorize(
        self, ref: RegistryRef, challenge: str, headers: dict[str, str]
    ) -> dict[str, str]:
        scheme, params = parse_challenge(challenge)
        creds = self._credentials.get(ref.host)
        if scheme == "basic" and creds:
            auth = aiohttp.BasicAuth(*creds).encode()
            return {**headers, "Authorization": auth}
        if scheme != "bearer" or "realm" not in params:
            raise ImageError("unauthorized", f"{ref.host}: unsupported challenge {challenge!r}")
        token = await self._fetch_token(ref, params, creds)
        self._tokens[(ref.host, ref.repository)] = token
        return _with_token(headers, token)

    async def _fetch_token(
        self, ref: RegistryRef, params: dict[str, str], creds: tuple[str, str] | None
    ) -> str:
        realm = params["realm"]
        host = urlsplit(realm).netloc
        self._check_host(host)
        query: dict[str, str] = {k: params[k] for k in ("service", "scope") if k in params}
        query.setdefault("scope", f"repository:{ref.repository}:pull")
        auth = aiohttp.BasicAuth(*creds) if creds else None
        try:
            async with self._session.get(realm, params=query, auth=auth) as response:
                if response.status != 200:
                    raise ImageError("unauthorized", f"token realm {realm}: {response.status}")
                doc = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ImageError("unauthorized", f"token realm {realm}: {exc!r}") from None
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise ImageError("unauthorized", f"token realm {realm}: no token in answer")
        return token


class _AuthedRequest:
    """`async with` wrapper so callers always release the response."""

    def __init__(
        self, client: RegistryClient, ref: RegistryRef, url: str, headers: dict[str, str]
    ) -> None:
        self._args = (client, ref, url, headers)
        self._response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        client, ref, url, headers = self._args
        self._response = await client._send(ref, url, headers)
        return self._response

    async def __aexit__(self, *exc: object) -> None:
        if self._response is not None:
            self._response.release()


def _with_token(headers: dict[str, str], token: str | None) -> dict[str, str]:
    return {**headers, "Authorization": f"Bearer {token}"} if token else dict(headers)


async def _raise_for_status(response: aiohttp.ClientResponse, what: str) -> None:
    if response.status == 200:
        return
    if response.status == 404:
        raise ImageError("not_found", f"{what}: not found at {response.url}")
    if response.status in (401, 403):
        raise ImageError("unauthorized", f"{what}: {response.status} from {response.url}")
    raise ImageError("registry_error", f"{what}: HTTP {response.status} from {response.url}")


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    body = bytearray()
    try:
        async for chunk in response.content.iter_chunked(_CHUNK):
            body += chunk
            if len(body) > limit:
                raise ImageError("registry_error", f"manifest larger than {limit} bytes")
    except aiohttp.ClientPayloadError as exc:
        raise ImageError("registry_error", f"manifest body cut short ({exc})") from None
    return bytes(body)
