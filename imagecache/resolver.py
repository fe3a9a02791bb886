"""ImageResolver: an image reference to its platform manifest digest and layers, no layers pulled.

Placement calls `resolve` at app create/deploy to pin a digest; ImageCache pulls
through `source`, so there is one piece of code that fetches manifests and one
egress check in front of every registry and layout: a registry reference must
pass `EgressPolicy.registry_refusal`, an `oci:` layout's resolved directory
`layout_refusal`, and every connection the checked session makes
`address_refusal` (see `adapters/egress.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from imagecache.adapters.egress import Lookup, checked_session
from imagecache.adapters.registry import RegistryClient
from imagecache.adapters.sources import (
    ImageSource,
    LayoutImageSource,
    RegistryImageSource,
    Resolved,
    read_config,
)
from imagecache.api import ImageConfig, Layer
from imagecache.core.egress import EgressPolicy
from imagecache.core.manifest import parse_config
from imagecache.core.reference import LayoutRef, RegistryRef, parse_reference
from imagecache.errors import ImageError


@dataclass(frozen=True)
class ResolvedImage:
    ref: str  # as given
    digest: str  # platform manifest digest (sha256:…): the image's identity
    layers: list[Layer]
    config: ImageConfig  # what it runs (its config blob: small, read with the manifest)


class ImageResolver:
    def __init__(
        self,
        policy: EgressPolicy,
        *,
        http_timeout_s: float = 30.0,
        resolve_timeout_s: float = 20.0,
        credentials: Mapping[str, tuple[str, str]] | None = None,
        lookup: Lookup | None = None,
    ) -> None:
        """`http_timeout_s`: per connect and per read; `resolve_timeout_s`: a whole `resolve`.

        `credentials`: registry host -> (user, password); `lookup`: (host, port) ->
        addresses, the loop's getaddrinfo when None (tests inject a stub).
        """
        # Layout dirs are compared with resolved paths, so resolve them too
        # (an allowed /srv/images that is a symlink means its target).
        real_dirs = tuple(os.path.realpath(d) for d in policy.layout_dirs)
        self.policy = dataclasses.replace(policy, layout_dirs=real_dirs)
        self._http_timeout_s = http_timeout_s
        self._resolve_timeout_s = resolve_timeout_s
        self._credentials = dict(credentials or {})
        self._lookup = lookup
        self._session: aiohttp.ClientSession | None = None
        self._client: RegistryClient | None = None

    async def resolve(self, ref: str) -> ResolvedImage:
        """The platform manifest digest, layers and run config of `ref`; ImageError on any
        failure."""
        source = self.source(parse_reference(ref))
        resolved = await self.resolve_within(source, ref)
        try:
            async with asyncio.timeout(self._resolve_timeout_s):
                config = parse_config(await read_config(source, resolved.manifest.config))
        except TimeoutError:
            raise ImageError("registry_error", f"{ref}: its config not read within "
                             f"{self._resolve_timeout_s} s") from None
        return ResolvedImage(ref=ref, digest=resolved.digest, layers=resolved.manifest.layers,
                             config=config)

    async def resolve_within(self, source: ImageSource, ref: str) -> Resolved:
        """`source.resolve()` within `resolve_timeout_s` as a whole (a pull's manifests too)."""
        try:
            async with asyncio.timeout(self._resolve_timeout_s):
                return await source.resolve()
        except TimeoutError:
            limit = self._resolve_timeout_s
            raise ImageError("registry_error", f"{ref}: not resolved within {limit} s") from None

    def source(self, ref: RegistryRef | LayoutRef) -> ImageSource:
        """Where `ref`'s documents and blobs come from, once the egress policy allows it."""
        if isinstance(ref, LayoutRef):
            ref = _layout_dir_with_colon(ref)
            real = os.path.realpath(ref.path)
            reason = self.policy.layout_refusal(real)
            if reason is not None:
                raise ImageError("forbidden_host", f"layout {ref.path}: {reason}")
            return LayoutImageSource(ref, Path(real), self.policy.layout_refusal)
        reason = self.policy.registry_refusal(ref.host)
        if reason is not None:
            raise ImageError("forbidden_host", reason)
        return RegistryImageSource(self._registry_client(), ref)

    def _registry_client(self) -> RegistryClient:
        if self._client is None:
            timeout = aiohttp.ClientTimeout(
                total=None, sock_connect=self._http_timeout_s, sock_read=self._http_timeout_s
            )
            self._session = checked_session(self.policy, timeout=timeout, lookup=self._lookup)
            self._client = RegistryClient(
                self._session, policy=self.policy, credentials=self._credentials
            )
        return self._client

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = None
        self._client = None


def _layout_dir_with_colon(ref: LayoutRef) -> LayoutRef:
    """`oci:/a:b:v1` parses as image "b:v1" in layout /a; when /a is no directory and
    /a:b is, the reference meant tag "v1" in the layout /a:b (as before images had names)."""
    name, colon, tag = ref.tag.rpartition(":")
    if colon and not os.path.isdir(ref.path) and os.path.isdir(f"{ref.path}:{name}"):
        return LayoutRef(path=f"{ref.path}:{name}", tag=tag)
    return ref
