"""Hand-made OCI image layouts and layer tarballs for image-cache tests."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Entry:
    """One tar member: kind is file|dir|symlink|hardlink|chr|fifo."""

    name: str
    kind: str = "file"
    data: bytes = b""
    linkname: str = ""
    mode: int = 0o644


_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "chr": tarfile.CHRTYPE,
    "fifo": tarfile.FIFOTYPE,
}


def layer_tar(entries: list[Entry], *, compress: bool = True) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.type = _TYPES[entry.kind]
            info.mode = entry.mode
            info.linkname = entry.linkname
            info.size = len(entry.data) if entry.kind == "file" else 0
            archive.addfile(info, io.BytesIO(entry.data) if entry.kind == "file" else None)
    raw = buffer.getvalue()
    return gzip.compress(raw, mtime=0) if compress else raw


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def diff_id(layer: bytes) -> str:
    """The sha256 of a layer's uncompressed tar, as an image config lists it."""
    return _digest(gzip.decompress(layer) if layer[:2] == b"\x1f\x8b" else layer)


def layer_descriptor(data: bytes) -> dict[str, Any]:
    media = "application/vnd.oci.image.layer.v1.tar"
    if data[:2] == b"\x1f\x8b":
        media += "+gzip"
    return {"mediaType": media, "digest": _digest(data), "size": len(data)}


def image_blobs(
    layers: list[bytes],
    *,
    entrypoint: list[str] | None = None,
    diff_ids: list[str] | None = None,
    descriptors: list[dict[str, Any]] | None = None,
) -> tuple[bytes, dict[str, bytes]]:
    """(manifest, {digest: blob}) of an image: config, layers and the manifest itself.

    `diff_ids` replaces the computed ones; `descriptors` replaces the layer
    descriptors in the manifest (say, to declare a size the blob does not have).
    """
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint or ["/bin/true"]},
        "rootfs": {
            "type": "layers",
            "diff_ids": [diff_id(data) for data in layers] if diff_ids is None else diff_ids,
        },
    }
    config_bytes = json.dumps(config).encode()
    blobs = {_digest(data): data for data in [config_bytes, *layers]}
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": _digest(config_bytes),
            "size": len(config_bytes),
        },
        "layers": descriptors if descriptors is not None else list(map(layer_descriptor, layers)),
    }
    manifest_bytes = json.dumps(manifest).encode()
    blobs[_digest(manifest_bytes)] = manifest_bytes
    return manifest_bytes, blobs


def _put(layout: Path, data: bytes) -> dict[str, Any]:
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    digest = _digest(data)
    (blobs / digest.split(":", 1)[1]).write_bytes(data)
    return {"digest": digest, "size": len(data)}


def add_image(
    layout: Path,
    layers: list[bytes],
    *,
    entrypoint: list[str] | None = None,
    diff_ids: list[str] | None = None,
) -> dict[str, Any]:
    """Write config, layers and manifest blobs; return the manifest's descriptor."""
    manifest, blobs = image_blobs(layers, entrypoint=entrypoint, diff_ids=diff_ids)
    for data in blobs.values():
        _put(layout, data)
    return {"mediaType": OCI_MANIFEST, "digest": _digest(manifest), "size": len(manifest)}


def add_index(layout: Path, platforms: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """Write an image index over (os, arch) -> manifest descriptor; return its descriptor."""
    index = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {**desc, "platform": {"os": os_name, "architecture": arch}}
            for (os_name, arch), desc in platforms.items()
        ],
    }
    return {"mediaType": OCI_INDEX, **_put(layout, json.dumps(index).encode())}


def write_layout(layout: Path, tagged: dict[str, dict[str, Any]]) -> None:
    """Write oci-layout and index.json naming each descriptor by its tag."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    manifests = [{**desc, "annotations": {REF_NAME: tag}} for tag, desc in tagged.items()]
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
    (layout / "index.json").write_text(json.dumps(index))


def single_image_layout(
    layout: Path, layers: list[bytes], tag: str = "latest", *, diff_ids: list[str] | None = None
) -> str:
    """A layout holding one image under `tag`; returns the `oci:` reference."""
    write_layout(layout, {tag: add_image(layout, layers, diff_ids=diff_ids)})
    return f"oci:{layout}:{tag}"
