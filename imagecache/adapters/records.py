"""Image records on disk: `images/<hex>.json`, `<hex>.usage`, `<alias hex>.alias`.

A record (msgspec JSON of `api.Image`) says an image is complete: it is
written last, after its rootfs is in place and its usage (the bytes its
rootfs is charged, decimal text) is written. An alias names the manifest an
index or list digest resolved to. Every write is atomic (temp, fsync,
rename, directory fsync); the record's mtime is its last use. Names starting
with `.tmp-` are unfinished and swept at start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ground.durable import fsync_dir
from ground.statefiles import private_dir, write_private
from imagecache.adapters.blobstore import TEMP_PREFIX, hex_of
from imagecache.api import Image


@dataclass(frozen=True)
class StoredImage:
    image: Image
    usage_bytes: int | None  # None: not recorded (a cache from before usage was kept)
    last_used: float  # the record's mtime


class ImageRecords:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        private_dir(self.dir)

    def save(self, image: Image, usage_bytes: int) -> None:
        """The usage, then the record that makes the image complete."""
        self.save_usage(image.digest, usage_bytes)
        write_atomic(self.dir / f"{hex_of(image.digest)}.json", msgspec.json.encode(image))

    def save_usage(self, digest: str, usage_bytes: int) -> None:
        write_atomic(self.dir / f"{hex_of(digest)}.usage", str(usage_bytes).encode())

    def save_aliases(self, digest: str, aliases: list[str]) -> None:
        for alias in aliases:
            write_atomic(self.dir / f"{hex_of(alias)}.alias", digest.encode())

    def delete(self, digest: str, aliases: list[str]) -> None:
        """Record first: without it, the rest is not an image."""
        hexpart = hex_of(digest)
        for name in (f"{hexpart}.json", f"{hexpart}.usage"):
            (self.dir / name).unlink(missing_ok=True)
        for alias in aliases:
            (self.dir / f"{hex_of(alias)}.alias").unlink(missing_ok=True)

    def touch(self, digest: str) -> None:
        try:
            os.utime(self.dir / f"{hex_of(digest)}.json")
        except FileNotFoundError:
            pass

    def sweep_temp(self) -> None:
        for entry in self.dir.iterdir():
            if entry.name.startswith(TEMP_PREFIX):
                entry.unlink(missing_ok=True)

    def load(self) -> list[StoredImage]:
        """Every decodable record; undecodable ones, and usages without a record, are deleted."""
        for entry in self.dir.glob("*.usage"):
            if not entry.with_suffix(".json").exists():
                entry.unlink(missing_ok=True)
        found: list[StoredImage] = []
        for entry in sorted(self.dir.glob("*.json")):
            try:
                image = msgspec.json.decode(entry.read_bytes(), type=Image)
            except msgspec.DecodeError:
                entry.unlink(missing_ok=True)
                continue
            usage = _read_int(entry.with_suffix(".usage"))
            found.append(StoredImage(image, usage, entry.stat().st_mtime))
        return found

    def load_aliases(self) -> dict[str, str]:
        """alias digest -> manifest digest, as written."""
        return {
            "sha256:" + entry.stem: entry.read_text().strip()
            for entry in self.dir.glob("*.alias")
            if len(entry.stem) == 64
        }

    def delete_alias(self, alias: str) -> None:
        (self.dir / f"{hex_of(alias)}.alias").unlink(missing_ok=True)


def _read_int(path: Path) -> int | None:
    try:
        value = int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return value if value >= 0 else None


def write_atomic(path: Path, data: bytes) -> None:
    write_private(path, data, temp_prefix=TEMP_PREFIX)
    fsync_dir(path.parent)
