"""ImageCache: the shell around the pure cores — pulls, verifies, unpacks, evicts.

On disk under `root`:
  blobs/sha256/<hex>      verified layer blobs (content-addressed)
  images/<hex>.json       one `Image` record per manifest digest
  images/<hex>.alias      manifest digest an index/list digest resolved to
  rootfs/<hex>/           unpacked root filesystem of that manifest
Names starting with `.tmp-` are unfinished work and are swept at start.
All in-memory state is rebuilt from this layout in `__init__`.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path

import msgspec

from imagecache.adapters.blobstore import TEMP_PREFIX, BlobStore, hex_of
from imagecache.adapters.egress import Lookup
from imagecache.adapters.sources import ImageSource, Resolved, read_config
from imagecache.adapters.unpack import remove_tree, unpack_layers
from imagecache.api import Image, Layer, LayerChange
from imagecache.core.egress import EgressPolicy
from imagecache.core.lru import LayerUse, choose_evictions
from imagecache.core.manifest import parse_config
from imagecache.core.reference import RegistryRef, parse_reference
from imagecache.core.tarsafety import UnpackLimits
from imagecache.resolver import ImageResolver
from thaw.durable import fsync_dir


class ImageCache:
    def __init__(
        self,
        root: Path,
        *,
        budget_bytes: int,
        policy: EgressPolicy | None = None,
        on_change: Callable[[LayerChange], None] | None = None,
        http_timeout_s: float = 60.0,
        credentials: Mapping[str, tuple[str, str]] | None = None,
        limits: UnpackLimits | None = None,
        lookup: Lookup | None = None,
    ) -> None:
        """`budget_bytes`: total layer-blob bytes to keep; `credentials`: host -> (user, pass).

        `policy`: where pulls may go; None is `EgressPolicy()`: public registries
        only, no layouts. `http_timeout_s`: per connect and per read.
        `lookup`: (host, port) -> addresses, for tests; None uses getaddrinfo.
        """
        self.root = Path(root).resolve()
        self.budget_bytes = budget_bytes
        self._on_change = on_change
        self._resolver = ImageResolver(
            policy or EgressPolicy(),
            http_timeout_s=http_timeout_s,
            credentials=credentials,
            lookup=lookup,
        )
        self._limits = limits or UnpackLimits()
        self._store = BlobStore(self.root / "blobs")
        self._images_dir = self.root / "images"
        self._rootfs_dir = self.root / "rootfs"
        self._images: dict[str, Image] = {}
        self._aliases: dict[str, str] = {}
        self._sizes: dict[str, int] = {}
        self._ticks: dict[str, int] = {}
        self._tick = 0
        self._pins: dict[str, set[str]] = {}
        self._in_use: Counter[str] = Counter()
        self._blob_flights: dict[str, asyncio.Future[None]] = {}
        self._unpack_flights: dict[str, asyncio.Future[None]] = {}
        self._recover()

    # ---- queries -------------------------------------------------------------

    def image(self, digest: str) -> Image | None:
        """A pulled, unpacked image by manifest digest (or by the index digest it came through)."""
        return self._images.get(self._aliases.get(digest, digest))

    def layers(self) -> dict[str, int]:
        return dict(self._sizes)

    # ---- pins and eviction ---------------------------------------------------

    def pin(self, owner: str, image_digest: str) -> None:
        self._pins.setdefault(owner, set()).add(self._aliases.get(image_digest, image_digest))

    def unpin(self, owner: str) -> None:
        self._pins.pop(owner, None)

    def evict(self, protect: Collection[str] = ()) -> list[str]:
        """Evict LRU unpinned layers until the total is within budget; returns their digests."""
        uses = {d: LayerUse(size, self._ticks.get(d, 0)) for d, size in self._sizes.items()}
        victims = choose_evictions(uses, self._pinned_layers() | set(protect), self.budget_bytes)
        for digest in victims:
            self._store.delete(digest)
            size = self._sizes.pop(digest)
            self._ticks.pop(digest, None)
            self._notify(LayerChange(digest=digest, size=size, present=False))
        gone = set(victims)
        for image in list(self._images.values()):
            if any(layer.digest in gone for layer in image.layers):
                self._forget_image(image.digest)
        return victims

    def _pinned_layers(self) -> set[str]:
        pinned = set(self._in_use)
        for digests in self._pins.values():
            for digest in digests:
                image = self._images.get(digest)
                if image is not None:
                    pinned.update(layer.digest for layer in image.layers)
        return pinned

    # ---- pull ----------------------------------------------------------------

    async def pull(self, ref: str) -> Image:
        """Pull, verify and unpack `ref`; idempotent; evicts to budget afterwards."""
        parsed = parse_reference(ref)
        source = self._resolver.source(parsed)  # the egress checks, before any IO
        if isinstance(parsed, RegistryRef) and parsed.digest:
            cached = self.image(parsed.digest)
            if cached is not None:
                self._touch(cached.layers)
                return cached
        resolved = await source.resolve()
        layers = resolved.manifest.layers
        self._in_use.update(layer.digest for layer in layers)
        try:
            image = await self._materialise(ref, source, resolved)
        finally:
            self._in_use.subtract(layer.digest for layer in layers)
            self._in_use += Counter()  # drop zero counts
        self.evict(protect=[layer.digest for layer in image.layers])
        return image

    async def _materialise(self, ref: str, source: ImageSource, resolved: Resolved) -> Image:
        existing = self._images.get(resolved.digest)
        if existing is None or not all(self._store.has(x.digest) for x in existing.layers):
            config = parse_config(await read_config(source, resolved.manifest.config))
            layers = resolved.manifest.layers
            await asyncio.gather(*(self._ensure_blob(layer, source) for layer in layers))
            await self._single_flight(
                self._unpack_flights, resolved.digest, lambda: self._unpack(resolved.digest, layers)
            )
            existing = self._images.get(resolved.digest) or Image(
                ref=ref,
                digest=resolved.digest,
                layers=layers,
                config=config,
                rootfs=str(self._rootfs_dir / hex_of(resolved.digest)),
            )
            await asyncio.to_thread(self._save_image, existing, resolved.aliases)
        self._touch(existing.layers)
        return existing

    async def _single_flight(
        self,
        flights: dict[str, asyncio.Future[None]],
        key: str,
        start: Callable[[], Awaitable[None]],
    ) -> None:
        """Run `start()` once per key at a time; every concurrent caller awaits the same run."""
        flight = flights.get(key)
        if flight is None:
            flight = asyncio.ensure_future(start())
            flights[key] = flight
            flight.add_done_callback(lambda _: flights.pop(key, None))
        await asyncio.shield(flight)

    async def _ensure_blob(self, layer: Layer, source: ImageSource) -> None:
        if self._store.has(layer.digest):
            return

        async def download() -> None:
            if self._store.has(layer.digest):
                return
            await self._store.write(layer.digest, layer.size, source.blob(layer.digest))
            self._sizes[layer.digest] = layer.size
            self._touch([layer])
            self._notify(LayerChange(digest=layer.digest, size=layer.size, present=True))

        await self._single_flight(self._blob_flights, layer.digest, download)

    async def _unpack(self, digest: str, layers: list[Layer]) -> None:
        target = self._rootfs_dir / hex_of(digest)
        if target.is_dir():
            return
        temp = self._rootfs_dir / f"{TEMP_PREFIX}{hex_of(digest)}-{secrets.token_hex(4)}"
        paths = [self._store.path(layer.digest) for layer in layers]
        await asyncio.to_thread(unpack_layers, paths, target, temp, self._limits)

    # ---- persistence ---------------------------------------------------------

    def _save_image(self, image: Image, aliases: list[str]) -> None:
        hexpart = hex_of(image.digest)
        _write_atomic(self._images_dir / f"{hexpart}.json", msgspec.json.encode(image))
        for alias in aliases:
            _write_atomic(self._images_dir / f"{hex_of(alias)}.alias", image.digest.encode())
            self._aliases[alias] = image.digest
        self._images[image.digest] = image

    def _forget_image(self, digest: str) -> None:
        self._images.pop(digest, None)
        hexpart = hex_of(digest)
        (self._images_dir / f"{hexpart}.json").unlink(missing_ok=True)
        for alias, target in list(self._aliases.items()):
            if target == digest:
                (self._images_dir / f"{hex_of(alias)}.alias").unlink(missing_ok=True)
                del self._aliases[alias]
        remove_tree(self._rootfs_dir / hexpart)

    def _recover(self) -> None:
        """Rebuild in-memory state from disk; drop unfinished work and incomplete images."""
        for directory in (self._images_dir, self._rootfs_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._store.sweep_temp()
        for directory in (self._images_dir, self._rootfs_dir):
            for entry in directory.iterdir():
                if entry.name.startswith(TEMP_PREFIX):
                    remove_tree(entry) if entry.is_dir() else entry.unlink()
        present = self._store.present()
        for digest, (size, _) in sorted(present.items(), key=lambda kv: kv[1][1]):
            self._sizes[digest] = size
            self._tick += 1
            self._ticks[digest] = self._tick
        self._load_records()

    def _load_records(self) -> None:
        for entry in sorted(self._images_dir.glob("*.json")):
            try:
                image = msgspec.json.decode(entry.read_bytes(), type=Image)
            except msgspec.DecodeError:
                entry.unlink(missing_ok=True)
                continue
            complete = all(x.digest in self._sizes for x in image.layers)
            if complete and Path(image.rootfs).is_dir():
                self._images[image.digest] = image
            else:
                self._forget_image(image.digest)
        for entry in self._images_dir.glob("*.alias"):
            target = entry.read_text().strip()
            if target in self._images:
                self._aliases["sha256:" + entry.stem] = target
            else:
                entry.unlink(missing_ok=True)

    # ---- misc ----------------------------------------------------------------

    def _touch(self, layers: list[Layer]) -> None:
        for layer in layers:
            self._tick += 1
            self._ticks[layer.digest] = self._tick
            self._store.touch(layer.digest)

    def _notify(self, change: LayerChange) -> None:
        if self._on_change is not None:
            self._on_change(change)

    async def close(self) -> None:
        for flight in [*self._blob_flights.values(), *self._unpack_flights.values()]:
            flight.cancel()
        await self._resolver.close()


def _write_atomic(path: Path, data: bytes) -> None:
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}-{secrets.token_hex(4)}")
    with open(temp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.rename(temp, path)
    fsync_dir(path.parent)
