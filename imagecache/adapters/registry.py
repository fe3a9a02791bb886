"""Distribution API v2 client: manifests and blobs over aiohttp, with bearer-token auth.

On a 401 with `WWW-Authenticate: Bearer realm=…,service=…,scope=…` it fetches
a token from the realm (anonymously, or with basic credentials when given),
caches it per repository and retries once. Every URL it requests — the
registry, the token realm and each redirect hop, which it follows itself — is
checked against the egress policy first; names are resolved by the session's
checked resolver. aiohttp errors are translated to ImageError here and nowhere
else, and no message carries a URL, an address or an upstream body: only the
registry host as the owner wrote it, what was asked for, and a status or a
short reason.
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import aiohttp
from yarl import URL

from imagecache.adapters.egress import refusal_of
from imagecache.core.egress import EgressPolicy, target_refusal
from imagecache.core.manifest import MANIFEST_ACCEPT, sha256_digest
from imagecache.core.reference import RegistryRef
from imagecache.errors import ImageError

MAX_REDIRECTS = 5
_CHUNK = 1 << 16
_MAX_MANIFEST_BYTES = 4 * 1024 * 1024
_MAX_TOKEN_BYTES = 1024 * 1024
_PARAM = re.compile(r'(\w+)="([^"]*)"')
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9-]{0,31}$")
_LOCAL_SHORTAGES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """`Bearer realm="…",service="…"` -> ("bearer", {"realm": …, "service": …})."""
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(_PARAM.findall(rest))


class RegistryClient:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        policy: EgressPolicy,
        credentials: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        """`session` must resolve names through `adapters.egress.CheckedResolver`."""
        self._session = session
        self._policy = policy
        self._credentials = dict(credentials or {})
        self._tokens: dict[tuple[str, str], str] = {}

    async def manifest(self, ref: RegistryRef, reference: str) -> tuple[bytes, str, str]:
        """(body, content type, sha256 digest of body) of a manifest or index."""
        what = f"manifest {ref.repository}:{reference}"
        url = URL(f"{ref.base_url}/v2/{ref.repository}/manifests/{reference}")
        async with self._request(ref, url, {"Accept": MANIFEST_ACCEPT}, what) as response:
            _raise_for_status(ref, response, what)
            body = await _read_bounded(ref, response, _MAX_MANIFEST_BYTES, what)
            return body, response.headers.get("Content-Type", ""), sha256_digest(body)

    async def blob(self, ref: RegistryRef, digest: str) -> AsyncIterator[bytes]:
        """Stream a blob's bytes (redirects followed, each checked); the caller verifies them."""
        what = f"blob {digest}"
        url = URL(f"{ref.base_url}/v2/{ref.repository}/blobs/{digest}")
        async with self._request(ref, url, {}, what) as response:
            _raise_for_status(ref, response, what)
            try:
                async for chunk in response.content.iter_chunked(_CHUNK):
                    yield chunk
            except aiohttp.ClientPayloadError:
                raise ImageError("size_mismatch", f"{ref.host}: {what}: body cut short") from None
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _failure(ref, what, "registry", exc) from None

    @asynccontextmanager
    async def _request(
        self, ref: RegistryRef, url: URL, headers: dict[str, str], what: str
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """GET with the cached token; on a 401, answer the challenge and retry once."""
        token = self._tokens.get((ref.host, ref.repository))
        response = await self._get(ref, url, _with_token(headers, token), what, "registry")
        try:
            if response.status == 401:
                challenge = response.headers.get("WWW-Authenticate", "")
                response.release()
                retry_headers = await self._authorize(ref, challenge, headers)
                response = await self._get(ref, url, retry_headers, what, "registry")
            yield response
        finally:
            response.release()

    async def _get(
        self, ref: RegistryRef, url: URL, headers: dict[str, str], what: str, role: str
    ) -> aiohttp.ClientResponse:
        """GET `url`, following at most MAX_REDIRECTS redirects, every hop checked first."""
        for hop in range(MAX_REDIRECTS + 1):
            place = role if hop == 0 else f"redirect from the {role}"
            refusal = target_refusal(self._policy, url.scheme, url.raw_host or "", url.port or 0)
            if refusal is not None:
                raise _forbidden(ref, what, place, refusal)
            try:
                response = await self._session.get(url, headers=headers, allow_redirects=False)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _failure(ref, what, place, exc) from None
            if response.status not in _REDIRECTS:
                return response
            location = response.headers.get("Location", "")
            response.release()
            url, headers = _next_hop(ref, what, url, location, headers)
        raise ImageError("registry_error", f"{ref.host}: {what}: over {MAX_REDIRECTS} redirects")

    async def _authorize(
        self, ref: RegistryRef, challenge: str, headers: dict[str, str]
    ) -> dict[str, str]:
        scheme, params = parse_challenge(challenge)
        creds = self._credentials.get(ref.host)
        if scheme == "basic" and creds:
            return {**headers, "Authorization": aiohttp.BasicAuth(*creds).encode()}
        if scheme != "bearer" or "realm" not in params:
            shown = scheme if _SCHEME.match(scheme) else "an unreadable"
            raise ImageError("unauthorized", f"{ref.host}: unsupported {shown} auth challenge")
        token = await self._fetch_token(ref, params, creds)
        self._tokens[(ref.host, ref.repository)] = token
        return _with_token(headers, token)

    async def _fetch_token(
        self, ref: RegistryRef, params: dict[str, str], creds: tuple[str, str] | None
    ) -> str:
        what = "token request"
        try:
            realm = _without_user(URL(params["realm"]))
        except ValueError:
            raise ImageError("unauthorized", f"{ref.host}: the token realm is not a URL") from None
        if not realm.absolute:
            raise ImageError("unauthorized", f"{ref.host}: the token realm is not an absolute URL")
        query: dict[str, str] = {k: params[k] for k in ("service", "scope") if k in params}
        query.setdefault("scope", f"repository:{ref.repository}:pull")
        headers = {"Authorization": aiohttp.BasicAuth(*creds).encode()} if creds else {}
        response = await self._get(ref, realm.extend_query(query), headers, what, "token realm")
        try:
            if response.status != 200:
                raise ImageError("unauthorized", f"{ref.host}: {what}: HTTP {response.status}")
            body = await _read_bounded(ref, response, _MAX_TOKEN_BYTES, what)
        finally:
            response.release()
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise ImageError("unauthorized", f"{ref.host}: {what}: answer is not JSON") from None
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise ImageError("unauthorized", f"{ref.host}: {what}: no token in the answer")
        return token


def _next_hop(
    ref: RegistryRef, what: str, url: URL, location: str, headers: dict[str, str]
) -> tuple[URL, dict[str, str]]:
    """Where a redirect goes; credentials are not carried to another origin."""
    try:
        target = _without_user(url.join(URL(location))) if location else None
    except ValueError:
        target = None
    if target is None:
        raise ImageError("registry_error", f"{ref.host}: {what}: redirect without a Location")
    if (target.scheme, target.host, target.port) != (url.scheme, url.host, url.port):
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    return target, headers


def _without_user(url: URL) -> URL:
    """`url` without user:password (aiohttp would send them as Basic auth, or fail)."""
    return url.with_user(None) if url.user is not None or url.password is not None else url


def _forbidden(ref: RegistryRef, what: str, place: str, reason: str) -> ImageError:
    # The reason may name a host the owner did not write (a realm, a redirect
    # target): only the registry's own refusal is repeated to the owner.
    detail = reason if place == "registry" else f"the {place} is not an allowed address"
    return ImageError("forbidden_host", f"{ref.host}: {what}: {detail}")


def _failure(ref: RegistryRef, what: str, place: str, exc: BaseException) -> ImageError:
    """One ImageError for an aiohttp or timeout failure, naming no URL or address."""
    refusal = refusal_of(exc)
    if refusal is not None:
        return _forbidden(ref, what, place, refusal)
    local = _local_shortage(exc)
    if local is not None:  # this host ran out of something: not the registry's fault
        return ImageError("io_error", f"{ref.host}: {what}: {local}")
    if isinstance(exc, aiohttp.ClientSSLError):
        reason = "TLS handshake failed"
    elif isinstance(exc, aiohttp.ClientConnectorDNSError):
        reason = "name did not resolve"
    elif isinstance(exc, aiohttp.ClientConnectorError):
        reason = "cannot connect"
    elif isinstance(exc, TimeoutError):
        reason = "timed out"
    elif isinstance(exc, aiohttp.InvalidURL):
        reason = "invalid URL"
    else:
        reason = f"request failed ({type(exc).__name__})"
    where = "" if place == "registry" else f" ({place})"
    return ImageError("registry_error", f"{ref.host}: {what}: {reason}{where}")


def _local_shortage(exc: BaseException) -> str | None:
    """The reason when a connection failed for want of a local resource (EMFILE, ...)."""
    os_error = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    if isinstance(os_error, OSError) and os_error.errno in _LOCAL_SHORTAGES:
        return os_error.strerror or "out of local resources"
    return None


def _with_token(headers: dict[str, str], token: str | None) -> dict[str, str]:
    return {**headers, "Authorization": f"Bearer {token}"} if token else dict(headers)


def _raise_for_status(ref: RegistryRef, response: aiohttp.ClientResponse, what: str) -> None:
    status = response.status
    if status == 200:
        return
    if status == 404:
        raise ImageError("not_found", f"{ref.host}: {what}: not found (HTTP 404)")
    if status in (401, 403):
        raise ImageError("unauthorized", f"{ref.host}: {what}: HTTP {status}")
    raise ImageError("registry_error", f"{ref.host}: {what}: HTTP {status}")


async def _read_bounded(
    ref: RegistryRef, response: aiohttp.ClientResponse, limit: int, what: str
) -> bytes:
    body = bytearray()
    try:
        async for chunk in response.content.iter_chunked(_CHUNK):
            body += chunk
            if len(body) > limit:
                raise ImageError("registry_error", f"{ref.host}: {what}: over {limit} bytes")
    except aiohttp.ClientPayloadError:
        raise ImageError("registry_error", f"{ref.host}: {what}: body cut short") from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _failure(ref, what, "registry", exc) from None
    return bytes(body)
