"""ImageCache: the shell around the pure cores — pulls, verifies, unpacks, keeps to a budget.

On disk under `root`:
  blobs/sha256/<hex>      verified layer blobs (content-addressed)
  images/<hex>.json       one `Image` record per manifest digest (written last)
  images/<hex>.usage      bytes its unpacked rootfs is charged against the budget
  images/<hex>.alias      manifest digest an index/list digest resolved to
  rootfs/<hex>/           unpacked root filesystem of that manifest
Names starting with `.tmp-` are unfinished work and are swept at start.
All in-memory state is rebuilt from this layout in `__init__`.

The byte budget covers blobs and unpacked rootfs. Whatever a pull is about to
write — a blob at its declared size, a rootfs at the size its layers declare
— first gets room (`_room_for`): LRU unpinned images and layers are evicted
(`core.lru`), or the pull is refused with `no_space` before a byte is written;
free disk above `DownloadLimits.disk_reserve_bytes` bounds it the same way
(`core.budget`). Every failure of a pull is an ImageError.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from ground.statefiles import private_dir
from imagecache.adapters.blobstore import BlobStore, hex_of
from imagecache.adapters.egress import Lookup
from imagecache.adapters.records import ImageRecords
from imagecache.adapters.recovery import recover
from imagecache.adapters.sources import ImageSource, Resolved, read_config
from imagecache.adapters.trees import remove_tree, remove_tree_quietly
from imagecache.adapters.unpack import LayerFile, UnpackPlan, build_rootfs, plan_unpack
from imagecache.api import Image, Layer, LayerChange
from imagecache.core.budget import DownloadLimits, Room, blob_deadline_s, pull_blocked
from imagecache.core.egress import EgressPolicy
from imagecache.core.lru import Evictions, ImageUse, LayerUse, choose_evictions
from imagecache.core.manifest import Descriptor, parse_config, parse_diff_ids
from imagecache.core.reference import RegistryRef, parse_reference
from imagecache.core.tarsafety import UnpackLimits
from imagecache.errors import ImageError, only_image_errors, os_failure
from imagecache.flights import Flights, single_flight
from imagecache.resolver import ImageResolver
from imagecache.stats import PullBytes, PullStats

T = TypeVar("T")


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


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
        resolve_timeout_s: float = 20.0,
        downloads: DownloadLimits | None = None,
        disk_free: Callable[[Path], int] | None = None,
    ) -> None:
        """`budget_bytes`: blob bytes plus unpacked rootfs bytes to keep at most.

        `policy`: where pulls may go; None is `EgressPolicy()`: public registries
        only, no layouts. `http_timeout_s`: per connect and per read (idle).
        `credentials`: host -> (user, pass). `limits`: per image unpack limits.
        `resolve_timeout_s`: fetching a pull's manifests, as a whole.
        `downloads`: disk reserve, blob deadlines, download concurrency.
        `lookup`: (host, port) -> addresses, for tests; None uses getaddrinfo.
        `disk_free`: path -> free bytes of its file system, for tests; None
        uses `shutil.disk_usage`.
        """
        self.root = Path(root).resolve()
        self.budget_bytes = budget_bytes
        self._on_change = on_change
        self._resolver = ImageResolver(
            policy or EgressPolicy(),
            http_timeout_s=http_timeout_s,
            resolve_timeout_s=resolve_timeout_s,
            credentials=credentials,
            lookup=lookup,
        )
        self._limits = limits or UnpackLimits()
        self._downloads = downloads or DownloadLimits()
        self._disk_free = disk_free or _free_bytes
        self._download_slots = asyncio.Semaphore(self._downloads.max_downloads)
        private_dir(self.root)  # image records (their env), blobs and trees: this user's
        self._store = BlobStore(self.root / "blobs")
        self._records = ImageRecords(self.root / "images")
        self._rootfs_dir = self.root / "rootfs"
        self._images: dict[str, Image] = {}
        self._rootfs_bytes: dict[str, int] = {}
        self._aliases: dict[str, str] = {}
        self._sizes: dict[str, int] = {}
        self._layer_ticks: dict[str, int] = {}
        self._image_ticks: dict[str, int] = {}
        self._tick = 0
        self._reserved = 0  # bytes promised to writes in flight
        self._pins: dict[str, set[str]] = {}
        self._in_use: Counter[str] = Counter()  # image and layer digests of pulls in flight
        self._blob_flights: Flights = {}
        self._image_flights: Flights = {}
        self.stats = PullStats()
        self._recover()

    # ---- queries -------------------------------------------------------------

    def image(self, digest: str) -> Image | None:
        """A pulled, unpacked image by manifest digest (or by the index digest it came through)."""
        return self._images.get(self._aliases.get(digest, digest))

    def layers(self) -> dict[str, int]:
        return dict(self._sizes)

    def used_bytes(self) -> int:
        """What the budget covers: blob bytes plus the bytes unpacked rootfs are charged."""
        return sum(self._sizes.values()) + sum(self._rootfs_bytes.values())

    # ---- pins and eviction ---------------------------------------------------

    def pin(self, owner: str, image_digest: str) -> None:
        self._pins.setdefault(owner, set()).add(self._aliases.get(image_digest, image_digest))

    def unpin(self, owner: str) -> None:
        self._pins.pop(owner, None)

    def evict(self, protect: Collection[str] = ()) -> list[str]:
        """Evict LRU unpinned images and layers until within budget; return the layers' digests.

        `protect`: image or layer digests to keep, besides pinned images and pulls in flight.
        """
        choice = self._choose(self.budget_bytes - self._reserved, protect)
        self._apply(choice)
        return choice.layers

    def _choose(self, target_bytes: int, protect: Collection[str] = ()) -> Evictions:
        layers = {d: LayerUse(size, self._layer_ticks.get(d, 0)) for d, size in self._sizes.items()}
        images = {
            d: ImageUse(
                frozenset(layer.digest for layer in image.layers),
                self._rootfs_bytes.get(d, 0),
                self._image_ticks.get(d, 0),
            )
            for d, image in self._images.items()
        }
        keep = set(self._in_use) | set(protect)
        pinned: set[str] = set().union(*self._pins.values())
        return choose_evictions(
            layers,
            images,
            protected_layers=keep,
            protected_images=keep | pinned,
            target_bytes=target_bytes,
        )

    def _apply(self, choice: Evictions) -> None:
        for digest in choice.images:
            self._forget_image(digest)
        for digest in choice.layers:
            self._store.delete(digest)
            size = self._sizes.pop(digest)
            self._layer_ticks.pop(digest, None)
            self._notify(LayerChange(digest=digest, size=size, present=False))

    # ---- room ----------------------------------------------------------------

    def _standing(self) -> Room:
        try:
            free = self._disk_free(self.root)
        except OSError as exc:
            raise os_failure(exc, "reading free disk space") from None
        disk_room = free - self._downloads.disk_reserve_bytes
        return Room(self.budget_bytes, self.used_bytes(), self._reserved, disk_room)

    def _most_room(self) -> tuple[int, Callable[[int], str]]:
        """The most a write could be given, were everything evictable evicted, and why not more."""
        room = self._standing()
        floor = self._choose(-1).total_bytes
        return room.largest_fit(floor), lambda need: room.refusal(need, floor)

    def pull_blocked(self) -> str:
        """Why no pull can write a byte now ("" when one can: core.budget.pull_blocked).
        Cheap while the disk is above its reserve (what is evictable is worked out only
        below it)."""
        reserve = self._downloads.disk_reserve_bytes
        try:
            free = self._disk_free(self.root)
        except OSError as exc:
            return f"its free disk cannot be read: {exc}"
        if free > reserve:
            return ""
        return pull_blocked(free, self.used_bytes() - self._choose(-1).total_bytes, reserve)

    @contextmanager
    def _room_for(self, need: int, what: str) -> Iterator[None]:
        """Evict so `need` more bytes fit the budget and the disk, and hold them while writing.

        Refuses (no_space) without evicting anything when eviction cannot get there.
        """
        room = self._standing()
        target = room.shrink_target(need)
        if room.held > target:  # else nothing to choose (and choosing is linear in the cache)
            choice = self._choose(target)
            if choice.total_bytes > target:
                raise ImageError("no_space", f"{what}: {room.refusal(need, choice.total_bytes)}")
            self._apply(choice)
        self._reserved += need
        try:
            yield
        finally:
            self._reserved -= need

    def _check_disk(self) -> None:
        """While streaming: stop before the disk goes below its reserve (others fill it too)."""
        reserve = self._downloads.disk_reserve_bytes
        if self._disk_free(self.root) < reserve:
            raise ImageError("no_space", f"free disk fell below its reserve of {reserve} bytes")

    # ---- pull ----------------------------------------------------------------

    async def pull(self, ref: str) -> Image:
        """Pull, verify and unpack `ref`; idempotent; evicts to budget afterwards.

        Raises ImageError, whatever failed (a local OSError is `no_space` or `io_error`,
        anything else unforeseen `io_error`).
        """
        try:
            with only_image_errors(f"pull of {ref}"):
                return await self._pull(ref)
        except ImageError:
            self.stats.failures += 1
            raise

    async def _pull(self, ref: str) -> Image:
        began = time.monotonic()
        parsed = parse_reference(ref)
        source = self._resolver.source(parsed)  # the egress checks, before any IO
        if isinstance(parsed, RegistryRef) and parsed.digest:
            cached = self.image(parsed.digest)
            if cached is not None:
                self.stats.hits += 1
                self._touch(cached)
                return cached
        resolved = await self._resolver.resolve_within(source, ref)
        held = [resolved.digest, *(layer.digest for layer in resolved.manifest.layers)]
        self._in_use.update(held)
        pulled = PullBytes()
        try:
            image = await self._materialise(ref, source, resolved, pulled)
        finally:
            self._in_use.subtract(held)
            self._in_use += Counter()  # drop zero counts
        self.evict(protect=held)
        # Rated whole (unpack and fixed costs in), as a machine waits for all of it.
        self.stats.pulled(pulled.downloaded, time.monotonic() - began)
        return image

    async def _materialise(
        self, ref: str, source: ImageSource, resolved: Resolved, pulled: PullBytes
    ) -> Image:
        digest = resolved.digest
        image = self._images.get(digest)
        whole = image is not None and all(self._store.has(x.digest) for x in image.layers)
        if whole:
            self.stats.hits += 1
        else:
            self.stats.misses += 1
        if image is not None and not whole:
            await self._fetch_layers(image.layers, source, pulled)  # gone behind our back
        if image is None:
            await single_flight(
                self._image_flights, digest, lambda: self._build(ref, source, resolved, pulled)
            )
            image = self._images[digest]
        new_aliases = [a for a in resolved.aliases if self._aliases.get(a) != digest]
        if new_aliases:
            await asyncio.to_thread(self._records.save_aliases, digest, new_aliases)
            self._aliases.update(dict.fromkeys(new_aliases, digest))
        self._touch(image)
        return image

    async def _build(
        self, ref: str, source: ImageSource, resolved: Resolved, pulled: PullBytes
    ) -> None:
        """Config, blobs, unpack, record: afterwards `resolved.digest` is in `_images`."""
        manifest = resolved.manifest
        config_blob = await self._read_config(source, manifest.config)
        config = parse_config(config_blob)
        diff_ids = parse_diff_ids(config_blob, len(manifest.layers))
        await self._fetch_layers(manifest.layers, source, pulled)
        files = [
            LayerFile(self._store.path(layer.digest), diff_id)
            for layer, diff_id in zip(manifest.layers, diff_ids, strict=True)
        ]
        plan = await asyncio.to_thread(plan_unpack, files, self._limits, *self._most_room())
        image = Image(
            ref=ref,
            digest=resolved.digest,
            layers=manifest.layers,
            config=config,
            rootfs=str(self._rootfs_dir / hex_of(resolved.digest)),
        )
        with self._room_for(plan.charged_bytes, f"image {resolved.digest} unpacked"):
            usage = await self._unpack(plan, image)
            self._images[image.digest] = image
            self._rootfs_bytes[image.digest] = usage

    async def _unpack(self, plan: UnpackPlan, image: Image) -> int:
        """Build and record the rootfs; return the bytes it is charged."""
        target = Path(image.rootfs)
        usage = await asyncio.to_thread(build_rootfs, plan, target, self._limits)
        try:
            with only_image_errors(f"recording image {image.digest}"):
                await asyncio.to_thread(self._records.save, image, usage)
        except BaseException:
            remove_tree_quietly(target)
            raise
        return usage

    async def _read_config(self, source: ImageSource, config: Descriptor) -> bytes:
        async with self._download_slots:
            return await self._timed(config.digest, config.size, read_config(source, config))

    async def _fetch_layers(
        self, layers: list[Layer], source: ImageSource, pulled: PullBytes
    ) -> None:
        """Every missing blob, `max_downloads_per_pull` at a time; a failure stops the rest."""
        todo = iter({layer.digest: layer for layer in layers}.values())

        async def worker() -> None:
            for layer in todo:
                await self._ensure_blob(layer, source, pulled)

        count = min(self._downloads.max_downloads_per_pull, len(layers))
        workers = [asyncio.ensure_future(worker()) for _ in range(count)]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _ensure_blob(self, layer: Layer, source: ImageSource, pulled: PullBytes) -> None:
        """Download `layer` unless it is here or on its way; its bytes count in `pulled`."""
        if self._store.has(layer.digest):
            return

        async def download() -> None:
            if self._store.has(layer.digest):
                return
            async with self._download_slots:
                with self._room_for(layer.size, f"blob {layer.digest}"):
                    chunks = source.blob(layer.digest)
                    write = self._store.write(layer.digest, layer.size, chunks, self._check_disk)
                    await self._timed(layer.digest, layer.size, write)
                    self._sizes[layer.digest] = layer.size
                    self.stats.downloaded(layer.size)
                    pulled.downloaded += layer.size
            self._touch_layer(layer.digest)
            self._notify(LayerChange(digest=layer.digest, size=layer.size, present=True))

        await single_flight(self._blob_flights, layer.digest, download)

    async def _timed(self, digest: str, size: int, work: Awaitable[T]) -> T:
        """`work` within the blob's deadline (its size at the floor rate plus the allowance)."""
        deadline_s = blob_deadline_s(size, self._downloads)
        try:
            async with asyncio.timeout(deadline_s):
                return await work
        except TimeoutError:
            raise ImageError(
                "registry_error", f"blob {digest}: not received within {deadline_s:.1f} s"
            ) from None

    # ---- records -------------------------------------------------------------

    def _forget_image(self, digest: str) -> None:
        self._images.pop(digest, None)
        self._rootfs_bytes.pop(digest, None)
        self._image_ticks.pop(digest, None)
        aliases = [alias for alias, target in self._aliases.items() if target == digest]
        for alias in aliases:
            del self._aliases[alias]
        self._records.delete(digest, aliases)
        remove_tree(self._rootfs_dir / hex_of(digest))

    def _recover(self) -> None:
        """Rebuild in-memory state from disk (`adapters/recovery`)."""
        state = recover(self._store, self._records, self._rootfs_dir, self._limits)
        self._sizes = state.sizes
        self._images = state.images
        self._rootfs_bytes = state.rootfs_bytes
        self._aliases = state.aliases
        for is_image, digest in state.by_age:
            self._tick += 1
            (self._image_ticks if is_image else self._layer_ticks)[digest] = self._tick

    # ---- misc ----------------------------------------------------------------

    def _touch(self, image: Image) -> None:
        """The image, then its layers: at equal age a rootfs goes before the blobs it came from."""
        self._tick += 1
        self._image_ticks[image.digest] = self._tick
        self._records.touch(image.digest)
        for layer in image.layers:
            self._touch_layer(layer.digest)

    def _touch_layer(self, digest: str) -> None:
        self._tick += 1
        self._layer_ticks[digest] = self._tick
        self._store.touch(digest)

    def _notify(self, change: LayerChange) -> None:
        if self._on_change is not None:
            self._on_change(change)

    async def close(self) -> None:
        for flight in [*self._blob_flights.values(), *self._image_flights.values()]:
            flight.cancel()
        await self._resolver.close()
